#!/usr/bin/env bash
# `make gpu-check`: the one call to make on a lent GPU machine. Configures for sm_90, builds
# with every core, runs the gpu-labelled tests (and the kernel unit tests), compute-sanitizer
# memcheck and racecheck on the kernel gpu tests, the GPU kernel benchmarks, the PyTorch peer
# of the scan, and when the whole engine builds a short gpu_quick run, the end-to-end step
# benchmark (fp32 vs bf16; gpu_quick, gpu_standard, production) and the data path's overlap ratio and GPU busy % (`slipstream bench
# --overlap`) at gpu_quick and gpu_standard, our step against the PyTorch peer at gpu_standard
# (bench/peers/side_by_side.py --device cuda), and prints one summary. It exits 1
# when any step failed, when no device is present, or when the gpu tests were skipped.
#
# Logs and JSON go to $OUT (the device tool's folder) or build-gpu/out. Debian packages the
# machine lacks can travel as .deb files in .gpu-deps/ (`make gpu-deps` fetches them here);
# they are unpacked into .gpu-deps/root and used from there. When the whole engine cannot be
# configured there (its other dependencies missing; Open MPI alone is left out with
# -DSLIPSTREAM_MPI=OFF first), the kernels-only build is used instead
# (-DSLIPSTREAM_KERNELS_ONLY=ON) and the summary says so.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build-gpu/out}
mkdir -p "$OUT"
STEPS=$OUT/steps.tsv
: >"$STEPS"
JOBS=$(nproc)
ARCH=${GPU_CHECK_ARCH:-90}
EXTRA=()

# step NAME COMMAND...: runs it with its output in $OUT/NAME.log, records status and seconds.
step() {
  local name=$1 start rc
  shift
  start=$(date +%s)
  echo "== $name: $*"
  "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - start))" >>"$STEPS"
  [ $rc -eq 0 ] || { echo "   $name failed (rc $rc); last lines:"; tail -n 15 "$OUT/$name.log"; }
  return $rc
}

# A check that found no device proves nothing: stop, and say so.
if ! step device sh -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv && nvcc --version | tail -n 2'; then
  echo "gpu-check: no NVIDIA GPU or driver here: nothing was checked"
  python3 tools/gpu_check/summary.py "$OUT"
  exit 1
fi

# expect_file NAME FILE: fails step NAME's record when FILE was not written (a tool that found
# nothing to measure exits 0).
expect_file() {
  [ -s "$2" ] && return 0
  printf '%s	%s	%s
' "$1 (no output)" 1 0 >>"$STEPS"
  echo "   $1 wrote no $2"
}

# Carried Debian packages, unpacked beside the checkout (never into /).
if ls .gpu-deps/*.deb >/dev/null 2>&1; then
  mkdir -p .gpu-deps/root
  for f in .gpu-deps/*.deb; do dpkg -x "$f" .gpu-deps/root; done
  DEPS=$ROOT/.gpu-deps/root/usr
  export CMAKE_PREFIX_PATH=$DEPS${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export LD_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu:$DEPS/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LIBRARY_PATH=$LD_LIBRARY_PATH
  export CPATH=$DEPS/include${CPATH:+:$CPATH}
  export PATH=$DEPS/bin:$PATH  # protoc
  # Debian's libopenblas.so at the top level is an alternatives link that dpkg -x does not make.
  EXTRA=(-DCMAKE_LIBRARY_PATH=$DEPS/lib/x86_64-linux-gnu/openblas-pthread)
fi
# cuDNN and NCCL from PyTorch's wheels when the toolkit has none.
for lib in cudnn nccl; do
  up=$(echo $lib | tr a-z A-Z)
  dir=$(python3 -c "import nvidia.$lib, os; print(os.path.dirname(nvidia.$lib.__file__))" 2>/dev/null) &&
    export ${up}_ROOT=$dir && export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done

CONFIG=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIPSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH "${EXTRA[@]}")
B=build-gpu
MODE=full
# The whole engine needs more than a GPU image may have; without it, the kernels-only build is
# the expected outcome, not a failure (mode.txt and configure_full.log say why).
echo "== configure (whole engine)"
if ! cmake -S . -B $B "${CONFIG[@]}" >"$OUT/configure_full.log" 2>&1 &&
  ! { echo "   (again without MPI and cairo)" && rm -rf $B/CMakeCache.txt &&
      cmake -S . -B $B "${CONFIG[@]}" -DSLIPSTREAM_MPI=OFF -DSLIPSTREAM_PLOT=OFF >>"$OUT/configure_full.log" 2>&1; }; then
  B=build-gpu-kernels
  MODE="kernels-only (the whole engine did not configure: configure_full.log)"
  grep -m1 -B1 -A3 "CMake Error" "$OUT/configure_full.log"
  step configure_kernels_only cmake -S . -B $B "${CONFIG[@]}" -DSLIPSTREAM_KERNELS_ONLY=ON
fi
echo "$MODE" >"$OUT/mode.txt"
step build cmake --build $B -j "$JOBS" --target all slipstream_tests slipstream_benchmarks

# A skipped gpu test means the device was not usable from the test: that fails the check.
step gpu_tests sh -c "cd $B && ctest -L gpu --output-on-failure --timeout 600 >ctest-gpu.txt 2>&1;
  rc=\$?; cat ctest-gpu.txt; if grep -q '(Skipped)' ctest-gpu.txt; then echo 'gpu tests SKIPPED'; exit 1; fi; exit \$rc"
step kernel_unit_tests sh -c "$B/bin/kernels_test && $B/bin/kernels_cuda_emulated_test"
SMALL='--gtest_filter=-*GpuStandardShape*:*Deterministic*:*GpuGemm*'
if command -v compute-sanitizer >/dev/null; then
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 $B/bin/kernels_cuda_gpu_test "$SMALL"
  step racecheck compute-sanitizer --tool racecheck --error-exitcode 1 $B/bin/kernels_cuda_gpu_test "$SMALL"
fi
step bench_kernels_cuda $B/bin/bench_kernels_cuda --benchmark_min_time=0.2 \
  --benchmark_out="$OUT/bench_kernels_cuda.json" --benchmark_out_format=json
expect_file bench_kernels_cuda "$OUT/bench_kernels_cuda.json"
step torch_scan python3 bench/peers/selective_scan_torch.py --json "$OUT/torch_scan.json"
expect_file torch_scan "$OUT/torch_scan.json"
if [ "$MODE" = full ]; then
  step gpu_quick $B/bin/slipstream run --preset gpu_quick --set run.steps=300 --set run.log_every=50
  # The whole step on the GPU, fp32 against bf16 in one process, at the three GPU presets.
  for p in gpu_quick gpu_standard production; do
    n=100; [ $p = production ] && n=30  # production's step is 4 batches (accumulation)
    step bench_e2e_$p $B/bin/bench_e2e --preset $p --steps $n --warmup $((n / 5)) \
      --precisions fp32 bf16 --json "$OUT/bench_e2e_$p.json"
    expect_file bench_e2e_$p "$OUT/bench_e2e_$p.json"
    [ $p = production ] && continue  # the step's figures; the data path at the two smaller shapes
    # The data path: loaded against resident batches, alternating; GPU busy % from NVML.
    step overlap_$p $B/bin/slipstream bench --preset $p --steps 100 --warmup 20 --overlap \
      --repeats 2 --json "$OUT/overlap_$p.json"
    expect_file overlap_$p "$OUT/overlap_$p.json"
  done
  # Our step against the PyTorch peer on the GPU at gpu_standard (the peer checked against our
  # reference step first), one step per mode so a slow torch.compile cannot hide eager's figure.
  # GPU_CHECK_PEER: the modes (default eager; "eager compile" adds minutes; "none" skips).
  for m in ${GPU_CHECK_PEER:-eager}; do
    [ "$m" = none ] && break
    step side_by_side_$m timeout 240 python3 bench/peers/side_by_side.py --device cuda \
      --shape gpu_standard --repeats 2 --steps 20 --warmup 3 --modes $m \
      --slipstream $B/bin/slipstream --json "$OUT/side_by_side_$m.json"
    expect_file side_by_side_$m "$OUT/side_by_side_$m.json"
  done
fi
python3 tools/gpu_check/summary.py "$OUT"
