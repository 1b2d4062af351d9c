#!/usr/bin/env bash
# NVML as a client sees its share (docs/nvml.md) on the real driver: a PyTorch client under the
# shim holds 1 GiB with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=4G and keeps the GPU busy; nvidia-smi and
# pynvml run natively and with libmpsshim-nvml.so preloaded in the client's environment.
#
#   with the library: total = 4 GiB, used = what `mpsshimctl ps` says the client holds, the
#   process list = the client alone, nvidia-smi's Memory-Usage "/ 4096MiB", the same name and
#   bus id as natively, and a GPU-Util measured (mpsshimd --busy-time on)
#   natively: the physical GPU (total above 4 GiB), the server among the processes
#
# Both nvidia-smi outputs are printed. Exits 77 without a GPU, 0 when every check passed.
# usage: nvml_view.sh --build-dir BUILD [--work-dir DIR]
set -u -o pipefail

SCRIPT_NAME=nvml_view
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if ! have_gpu; then
  log "no NVIDIA GPU (no /dev/nvidiactl, or nvidia-smi -L lists none): skipped"
  exit "$SKIP_STATUS"
fi
parse_paths "$@"
WORK_DIR=""
set -- "${REST_ARGS[@]+"${REST_ARGS[@]}"}"
while [ $# -gt 0 ]; do
  case "$1" in
    --work-dir) WORK_DIR=$2; shift 2 ;;
    *) die "unknown option $1" ;;
  esac
done
NVML_LIB=$(dirname "$SHIM")/nvml/libmpsshim-nvml.so
require_file nvml-library "$NVML_LIB"
require_file daemon "${DAEMON:-}"
[ -n "$WORK_DIR" ] || WORK_DIR=$(mktemp -d /tmp/mpsshim-nvml.XXXXXX)
mkdir -p "$WORK_DIR"
FAILURES=0
CLIENT_PID=""

# shellcheck disable=SC2317  # called from the EXIT trap
finish() {
  [ -z "$CLIENT_PID" ] || kill "$CLIENT_PID" 2>/dev/null
  daemon_stop
  echo "nvml_view: $FAILURES check(s) FAIL"
}
trap finish EXIT
trap 'exit 130' INT TERM

check() {  # DESCRIPTION CONDITION-STATUS
  if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1"; FAILURES=$((FAILURES + 1)); fi
}

DAEMON_ARGS=(--busy-time on)
daemon_start "$WORK_DIR/rt" "$WORK_DIR/daemon.log" || exit 1
export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=4G
env LD_PRELOAD="$SHIM $NVML_LIB" CUDA_MPS_PIPE_DIRECTORY="$SHIM_RUNTIME_DIR" python3 -u - \
  >"$WORK_DIR/client.out" 2>&1 <<'PY' &
import time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
a = (a @ a).clamp_(-1, 1)  # cuBLAS loaded before the GPU is measured
torch.cuda.synchronize()
# In the client itself, both libraries preloaded: PyTorch's NVML reading (pynvml) of its GPU.
print(torch.cuda.list_gpu_processes(0).replace("\n", " | "), flush=True)
print("holding", flush=True)
end = time.time() + 60
while time.time() < end:
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
PY
CLIENT_PID=$!
for _ in $(seq 600); do
  grep -q holding "$WORK_DIR/client.out" && break
  kill -0 "$CLIENT_PID" 2>/dev/null || break
  sleep 0.1
done
grep -q holding "$WORK_DIR/client.out" || { cat "$WORK_DIR/client.out"; die "the client did not start"; }
sleep 2  # a few busy seconds for the utilization window
kill -0 "$CLIENT_PID" 2>/dev/null || { cat "$WORK_DIR/client.out"; die "the client ended early"; }

PYNVML='
import json, pynvml as n
n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
m = n.nvmlDeviceGetMemoryInfo(h)
u = n.nvmlDeviceGetUtilizationRates(h)
print(json.dumps({"total": m.total, "used": m.used, "free": m.free, "gpu_util": u.gpu,
                  "name": str(n.nvmlDeviceGetName(h)), "bus": str(n.nvmlDeviceGetPciInfo(h).busId),
                  "pids": [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]}))'
python3 -c "$PYNVML" >"$WORK_DIR/native.json" 2>"$WORK_DIR/native.err"
env LD_PRELOAD="$NVML_LIB" CUDA_MPS_PIPE_DIRECTORY="$SHIM_RUNTIME_DIR" python3 -c "$PYNVML" \
  >"$WORK_DIR/shim.json" 2>"$WORK_DIR/shim.err"
# Another pod's view: its allocation holds nothing and runs nothing while the client works.
other=$("$CTL" --runtime-dir "$SHIM_RUNTIME_DIR" register_allocation memory=2G | sed -n 's/.*token=\([0-9a-f]*\).*/\1/p')
env LD_PRELOAD="$NVML_LIB" CUDA_MPS_PIPE_DIRECTORY="$SHIM_RUNTIME_DIR" \
  MPSSHIM_ALLOCATION_TOKEN="$other" python3 -c "$PYNVML" >"$WORK_DIR/other.json" 2>&1
nvidia-smi >"$WORK_DIR/smi.native" 2>&1
env LD_PRELOAD="$NVML_LIB" CUDA_MPS_PIPE_DIRECTORY="$SHIM_RUNTIME_DIR" nvidia-smi \
  >"$WORK_DIR/smi.shim" 2>&1
env LD_PRELOAD="$NVML_LIB" CUDA_MPS_PIPE_DIRECTORY="$SHIM_RUNTIME_DIR" nvidia-smi \
  --query-compute-apps=pid,used_memory,name --format=csv,noheader >"$WORK_DIR/apps.shim" 2>&1
"$CTL" --runtime-dir "$SHIM_RUNTIME_DIR" --json ps >"$WORK_DIR/ps.json"
kill -0 "$CLIENT_PID" 2>/dev/null || { cat "$WORK_DIR/client.out"; die "the client ended early"; }

echo "---- nvidia-smi, native"; cat "$WORK_DIR/smi.native"
echo "---- nvidia-smi, LD_PRELOAD=libmpsshim-nvml.so CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=4G"
cat "$WORK_DIR/smi.shim"
echo "---- nvidia-smi --query-compute-apps with the library: $(cat "$WORK_DIR/apps.shim")"
echo "---- the client's own torch.cuda.list_gpu_processes(): $(head -n1 "$WORK_DIR/client.out")"
echo "---- pynvml native: $(cat "$WORK_DIR/native.json")"
echo "---- pynvml with the library: $(cat "$WORK_DIR/shim.json") $(cat "$WORK_DIR/shim.err")"
echo "---- pynvml with the library, another allocation: $(cat "$WORK_DIR/other.json")"

python3 - "$WORK_DIR" "$CLIENT_PID" <<'PY'
import json, sys
work, client = sys.argv[1], int(sys.argv[2])
native = json.load(open(f"{work}/native.json"))
shim = json.load(open(f"{work}/shim.json"))
ps = json.load(open(f"{work}/ps.json"))["clients"]
other = json.load(open(f"{work}/other.json"))
held = sum(c["memory_used_bytes"] for c in ps if c["pid"] == client)
own = open(f"{work}/client.out").readline()
checks = [
    ("pynvml total is the 4 GiB limit", shim["total"] == 4 << 30),
    (f"pynvml used is what ps says the client holds ({held})", shim["used"] == held and held >= 1 << 30),
    ("pynvml free is the limit less that", shim["free"] == (4 << 30) - held),
    (f"pynvml lists the client alone ({shim['pids']} vs {client})", shim["pids"] == [client]),
    ("name and bus id as natively", shim["name"] == native["name"] and shim["bus"] == native["bus"]),
    ("natively the physical GPU", native["total"] > 4 << 30 and client not in native["pids"]),
    (f"utilization measured: {shim['gpu_util']}% with the library, {native['gpu_util']}% natively",
     shim["gpu_util"] > 0),
    ("the client's PyTorch lists itself through NVML", f"process {client:>10d}" in own),
    (f"another allocation sees its 2 GiB, nothing held, no process and {other['gpu_util']}% busy",
     other["total"] == 2 << 30 and other["used"] == 0 and other["pids"] == [] and
     other["gpu_util"] == 0 and native["gpu_util"] > 50),
]
bad = 0
for text, ok in checks:
    print(("PASS " if ok else "FAIL ") + text)
    bad += not ok
sys.exit(1 if bad else 0)
PY
check "pynvml with the library" $?
grep -Eq '/ +4096MiB' "$WORK_DIR/smi.shim"
check "nvidia-smi's Memory-Usage shows the 4096MiB limit" $?
grep -Eq '/ +4096MiB' "$WORK_DIR/smi.native"
[ $? -ne 0 ]
check "native nvidia-smi shows the physical memory" $?
server_pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pids"][0])' "$WORK_DIR/native.json")
grep -Eq "^\| +0 +N/A +N/A +$CLIENT_PID +C " "$WORK_DIR/smi.shim" &&
  ! grep -Eq " $server_pid +C " "$WORK_DIR/smi.shim"
check "nvidia-smi's process table lists the client ($CLIENT_PID), not the server ($server_pid)" $?
grep -Eq "^$CLIENT_PID, " "$WORK_DIR/apps.shim" && [ "$(wc -l <"$WORK_DIR/apps.shim")" -eq 1 ]
check "nvidia-smi --query-compute-apps lists the client alone" $?
grep -Eq " $server_pid +C " "$WORK_DIR/smi.native"
check "native nvidia-smi lists the server ($server_pid)" $?
[ "$FAILURES" -eq 0 ]
