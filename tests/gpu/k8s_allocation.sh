#!/usr/bin/env bash
# GPU check of the Kubernetes device plugin: what mpsshim-device-plugin's Allocate returns, applied
# by hand to a PyTorch process the way a container runtime would (its own IPC, PID and mount
# namespaces, the returned mounts as read-only bind mounts, the returned environment), runs under
# the quota: the GPU shows the allocation's SMs, a matmul is right, and a second process of the
# same allocation cannot take memory past the allocation's shared limit.
#
#   meson test -C build --suite gpu k8s_allocation      (or run it with the variables below)
#
# Needs root (bind mounts), an NVIDIA GPU and a python with torch that uid POD_UID (default
# 65534) can run: PYTHON (default python3; a venv under /root is not readable by 65534, so
# set POD_UID=0 or use a system-wide torch); exits 77 without them.
# Environment (meson sets it): MPSSHIMD MPSSHIMCTL MPSSHIM_SERVER LIBMPSSHIM
# MPSSHIM_DEVICE_PLUGIN KUBELET_CLI.
set -u
skip() { echo "SKIP: $1"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "needs root for the bind mounts"
{ [ -e /dev/nvidiactl ] && nvidia-smi -L 2>/dev/null | grep -q GPU; } || skip "no NVIDIA GPU"
# An absolute path: the "container" below runs with PATH=/usr/local/bin:/usr/bin:/bin, where
# "python3" may be another interpreter than the one with torch (a venv's, say).
PYTHON=$(command -v "${PYTHON:-python3}") || skip "no python (set PYTHON)"
POD_UID=${POD_UID:-65534}
as_pod=(setpriv --reuid="$POD_UID" --regid="$POD_UID" --clear-groups)
"${as_pod[@]}" "$PYTHON" -c "import torch" 2>/dev/null ||
  skip "uid $POD_UID cannot import torch with $PYTHON (set PYTHON or POD_UID)"
for variable in MPSSHIMD MPSSHIMCTL MPSSHIM_SERVER LIBMPSSHIM MPSSHIM_DEVICE_PLUGIN KUBELET_CLI; do
  [ -n "${!variable:-}" ] || { echo "FAIL: $variable is not set"; exit 1; }
done

work=$(mktemp -d /tmp/mpsshim-k8s-gpu-XXXXXX)
plugin_pid=
cleanup() {
  [ -n "$plugin_pid" ] && kill "$plugin_pid" 2>/dev/null
  "$MPSSHIMCTL" --runtime-dir "$work/run" quit >/dev/null 2>&1
  sleep 1
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $1"; echo "--- daemon log"; cat "$work/daemon.log"; echo "--- plugin log";
         cat "$work/plugin.log"; exit 1; }

"$MPSSHIMD" -d --multiuser --require-allocation-token --runtime-dir "$work/run" \
  --server "$MPSSHIM_SERVER" --log-file "$work/daemon.log" || fail "mpsshimd did not start"
mkdir -p "$work/plugins"
cat >"$work/sharing.toml" <<TOML
replicas = 4
health_interval_ms = 500
shim_library = "$LIBMPSSHIM"
container_shim_library = "/mnt/mpsshim/lib/$(basename "$LIBMPSSHIM")"
container_runtime_dir = "/mnt/mpsshim/run"
pod_resources_socket = "$work/no-pod-resources"
TOML
"$MPSSHIM_DEVICE_PLUGIN" --config "$work/sharing.toml" --plugin-dir "$work/plugins" \
  --runtime-dir "$work/run" 2>"$work/plugin.log" &
plugin_pid=$!
"$KUBELET_CLI" "$work/plugins" 1 >"$work/allocation.txt" || fail "Allocate failed"
echo "--- what Allocate returned"; cat "$work/allocation.txt"

# The "container": bind the returned mounts under a tmpfs at /mnt/mpsshim, hide the daemon's
# real directory, give it an empty /dev/shm, and run python with exactly the returned variables
# (plus PATH/HOME) as uid POD_UID — a pod's uid, not the daemon's.
cat >"$work/check.py" <<'PY'
import os, torch
props = torch.cuda.get_device_properties(0)
sms = props.multi_processor_count
x = torch.randn(2048, 2048, device="cuda")
ok = torch.allclose((x @ torch.eye(2048, device="cuda")), x)
limit = torch.cuda.mem_get_info()[1]
print(f"RESULT sms={sms} total_memory={limit} matmul_ok={ok}")
# Hold 60% of the allocation's memory so a second process of it is refused 60% more.
hold = torch.empty(int(limit * 0.6) // 4, dtype=torch.float32, device="cuda")
os.system(os.environ["SECOND"])
PY
cat >"$work/second.py" <<'PY'
import torch
limit = torch.cuda.mem_get_info()[1]
try:
    torch.empty(int(limit * 0.6) // 4, dtype=torch.float32, device="cuda")
    print("SECOND allocated (wrong: the allocation's limit is shared)")
except torch.cuda.OutOfMemoryError:
    print("SECOND refused (right: the allocation's limit is shared)")
PY
chmod 755 "$work" && chmod 644 "$work"/*.py
env_args=(PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp "SECOND=$PYTHON $work/second.py")
while read -r kind rest; do
  [ "$kind" = ENV ] && env_args+=("$rest")
done <"$work/allocation.txt"
mounts=$(awk '$1 == "MOUNT" { print $2 " " $3 }' "$work/allocation.txt")
inner='
set -e
mount -t tmpfs tmpfs /mnt
while read -r host container; do
  mkdir -p "$container"
  mount --bind "$host" "$container"
  mount -o remount,bind,ro "$container"
done <<EOF2
'"$mounts"'
EOF2
mount -t tmpfs tmpfs "$1/run"
mount -t tmpfs tmpfs /dev/shm
shift
exec setpriv --reuid='"$POD_UID"' --regid='"$POD_UID"' --clear-groups env -i "$@" '"$PYTHON"' '"$work"'/check.py
'
output=$(unshare --ipc --pid --mount --fork sh -c "$inner" sh "$work" "${env_args[@]}" 2>&1)
echo "--- the pod's output"; echo "$output"
grep -q "matmul_ok=True" <<<"$output" || fail "PyTorch did not run under the allocation"
sms=$(sed -n 's/.*RESULT sms=\([0-9]*\).*/\1/p' <<<"$output")
total=$(nvidia-smi --query-gpu=multiprocessor_count --format=csv,noheader -i 0 2>/dev/null || true)
echo "SMs seen by the pod: $sms (GPU: ${total:-unknown}; 25% rounded up to the partition size)"
grep -q "SECOND refused" <<<"$output" || fail "a second process of the allocation got past its shared limit"
grep -q "allocation 1" "$work/daemon.log" || fail "the daemon did not log the allocation"
echo "PASS: PyTorch ran under the plugin's allocation, in its own namespaces, as another uid"
