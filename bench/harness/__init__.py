"""mpsshim benchmark harness: every workload natively (time-slicing), under NVIDIA MPS and under
mpsshim, interleaved, with a CSV, a Markdown report and PNG plots.

usage (on a machine with an NVIDIA GPU, as root for NVIDIA MPS):

    python3 bench/harness.py --build-dir build --out bench-results --quick   # < 5 minutes
    python3 bench/harness.py --build-dir build --out bench-results --full    # <= 9 minutes
      [--modes native,mps,shim,shim-eager,shim-runs,shim-noprio,shim-noreserve]
      [--workloads launch,bandwidth,concurrency,mixed,priority,memory,resnet,scaling,multigpu]
      [--reps R] [--budget-s S] [--python PYTHON] [--daemon-arg=--log-level=debug ...] [--dry-run]
    python3 bench/harness.py --render RESULTS_DIR --out DIR   # re-render from results.csv/json

The programs come from --build-dir (libshim/, broker/, examples/small_kernels, bench/); a build
copied to another machine needs its shared libraries there too (libfmt.so.9: LD_LIBRARY_PATH).
--quick: 3 repetitions, small_kernels N in {1,8,32}, memory N in {1,4}, ResNet N in {1,8}, scaling
up to 256 clients (the broker's CPU with 64 idle clients measured from /proc on the way). --full:
N in {1,2,...,64}, memory N in {1,4,16}, ResNet N in {1,4,8}, scaling up to 256. Both stop
starting new work when their time budget (265 s / 500 s) would be exceeded and
say what was skipped. See docs/benchmarks.md.

Modes:
  native  the real driver, no MPS: processes time-slice the GPU
  mps     NVIDIA MPS: nvidia-cuda-mps-control -d with private CUDA_MPS_PIPE_DIRECTORY and
          CUDA_MPS_LOG_DIRECTORY under --out; always quit ("echo quit | nvidia-cuda-mps-control")
  shim    mpsshim: mpsshimd --runtime-dir DIR --server BUILD/.../mpsshim-server; clients get
          CUDA_MPS_PIPE_DIRECTORY=DIR LD_PRELOAD=BUILD/libshim/libmpsshim.so; stopped with
          "mpsshimctl --runtime-dir DIR quit"
  shim-eager  mpsshim as above with mpsshimd --launch-batching=off: every kernel launch goes
          out on its own (docs/launch-batching.md), to measure what batching gives
  shim-runs  mpsshim as above with mpsshimd --launch-batch-graphs=runs: each batch in
          power-of-two runs, the last few launches eagerly, instead of one padded graph launch
  shim-noreserve  mpsshim as above with mpsshimd --priority-reserve-sms=0: low-priority
          clients are held back but keep every SM (docs/daemon.md), to measure what the SMs
          reserved for high-priority clients give
  shim-noprio  mpsshim as above with mpsshimd --priority-scheduling=off: low-priority clients
          are not held back (docs/daemon.md), to measure what holding them back gives
Only one daemon runs at a time. Each repetition runs the modes in a rotated order (native, mps,
shim; then mps, shim, native; ...) so that drift hits every mode alike.

Workloads:
  launch       bench/launch_latency: async empty-kernel launch (client CPU), launch+sync round
               trips, cuMemAlloc+cuMemFree, cuMemAllocAsync+cuMemFreeAsync+sync
  bandwidth    bench/bandwidth: H2D/D2H, pageable and pinned, 4 KiB .. 256 MiB
  concurrency  N copies of examples/small_kernels (2 blocks x 32 threads, ~10 us kernels, sync
               every 64) started together (--start-at-ns): per-process seconds, aggregate kernels/s,
               and the broker's CPU per kernel (its processes' utime + stime from /proc, MPS and
               mpsshim modes): over the whole group, clients' start and end included, and over
               the window the programs report, while kernels run
  mixed        bench/kernel_latency: a few clients with large kernels (many blocks, 2 ms) and many
               with small ones (10 us, sync after each): small kernels' p50/p99 latency and the
               aggregate throughput of both
  memory       bench/idle_client: N idle clients each holding 256 MiB; nvidia-smi memory.used
  resnet       bench/resnet_client.py: PyTorch ResNet-50 batch 1 inference, N processes
  scaling      idle clients (1 MiB each) added in batches until one is refused, up to a cap
  multigpu     (only when named in --workloads; needs two GPUs) bench/peer_copy (256 MiB both
               ways), NCCL all-reduce and a DDP step between 2 processes
               (tests/gpu/multi/nccl_collectives.py --bench), 8 small_kernels clients on one
               GPU and 8 on each of two: the aggregate's ratio
  priority     (only when named in --workloads) bench/kernel_latency: 1 high-priority client with
               small kernels and a sync after each beside 4 low-priority ones saturating the GPU
               (CUDA_MPS_CLIENT_PRIORITY 0 and 1), and each group alone: high p99 shared/alone,
               low throughput shared/alone

The package: bench/harness/ (runner.py the schedule and outputs, modes.py the daemons, report.py,
workloads/ one module per workload, dry_run.py); bench/harness.py runs it. --dry-run starts no
daemon and replaces each client by dry_run.py, which makes up its output: it proves the plumbing
(commands, environments, parsing, report) without a GPU.

Every figure is the median over repetitions (and, where a run has several processes, over those
processes) with min and max beside it. Nothing here asserts a timing: a failed run is reported as
failed with the first lines of its error, never dropped. Exit status: 0 when the harness ran
(whatever failed inside), 2 on bad usage or missing programs.

Outputs in --out: results.csv (every sample), summary.csv (median/min/max per figure),
report.md, results.json, *.png (when matplotlib can be imported; else plot_data.json), logs/.
"""
