#!/usr/bin/env bash
# `make gpu-check`: the one call to make on a lent GPU machine. Configures for sm_90, builds
# with every core, runs the gpu-labelled tests (and the kernel unit tests), compute-sanitizer
# memcheck and racecheck (of our kernels) on the kernel gpu tests (and memcheck on training
# steps replayed from CUDA graphs), the GPU kernel benchmarks, the PyTorch peer of the scan, and
# when the whole engine builds a short gpu_quick run (on real replays where there are some) and
# a gpu_standard run
# with `replays.batch_size: auto`, the end-to-end step benchmark (fp32 vs bf16; gpu_quick,
# gpu_standard, production; the GRU graph on our per-step layer and on cuDNN) and the data
# path's overlap ratio and GPU busy % (`slipstream bench --overlap`) at gpu_quick and
# gpu_standard, the loader's windows/s against threads, our step against the PyTorch peer at
# gpu_standard (bench/peers/side_by_side.py --device cuda), and prints one summary. It exits 1
# when any step failed, when no device is present, or when the gpu tests were skipped.
#
# Logs and JSON go to $OUT (the device tool's folder) or build-gpu-out. Debian packages the
# machine lacks can travel as .deb files in .gpu-deps/ (`make gpu-deps` fetches them here);
# they are unpacked into .gpu-deps/root and used from there. When the whole engine cannot be
# configured there (its other dependencies missing; Open MPI alone is left out with
# -DSLIPSTREAM_MPI=OFF first), the kernels-only build is used instead
# (-DSLIPSTREAM_KERNELS_ONLY=ON) and the summary says so. GPU_CHECK_PREBUILT=ARCHIVE skips the
# build: `make gpu-bundle` packs a build made here (binaries, ctest files, the libraries they
# load) for the GPU machine, whose lease then goes to tests and benchmarks alone;
# GPU_CHECK_PREBUILT=FOLDER uses a bundle an earlier check unpacked there (build-gpu).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build-gpu-out}
mkdir -p "$OUT"
STEPS=$OUT/steps.tsv
: >"$STEPS"
JOBS=$(nproc)
ARCH=${GPU_CHECK_ARCH:-90}
EXTRA=()

# GPU_CHECK_ONLY: the groups to run, of tests (the gpu tests), cpu (the kernels' CPU and
# emulator tests, as CI runs them), sanitize (memcheck,
# racecheck; memcheck of graph-replayed steps), kernels (kernel benchmarks, the scan's PyTorch peer), train (a gpu_quick run,
# slipstream-smi against nvidia-smi during one, an
# auto batch size), e2e (the whole step's benchmarks, the GRU's two backends, the data path, the
# loader), infer (the policy library's batch step on the GPU beside the CPU's), peer (PyTorch
# side by side), profile (each operation's time in the gpu_standard step from time stamps in its
# CUDA graph, and each kernel's by Nsight Compute where it is installed), ab
# (the whole step with a switch of kernels/ not yet the default against without, alternating;
# not in the default list: a lease names it); default all but ab.
# A lease's 10-minute calls can split them. GPU_CHECK_STEP_TIMEOUT: seconds a step may take.
# GPU_CHECK_BENCH_FILTER: a regex of the kernel benchmarks to run (default all; `^scan` for the
# scan's figure beside its PyTorch peer's); GPU_CHECK_TORCH_SCAN=0 leaves that peer out.
# GPU_CHECK_INFER_FORMS: infer also runs the device's
# frames in each form named (small_gemm: SLIPSTREAM_SMALL_GEMM=warps; fused_frame:
# SLIPSTREAM_MAMBA_FRAME=fused; fused_frame_small_gemm: both); GPU_CHECK_INFER_SMALL_GEMM=1 adds
# small_gemm.
ONLY=" ${GPU_CHECK_ONLY:-tests cpu sanitize kernels train e2e infer peer profile} "
wants() { [[ "$ONLY" == *" $1 "* ]]; }
STEP_TIMEOUT=${GPU_CHECK_STEP_TIMEOUT:-420}

# step NAME COMMAND...: runs it with its output in $OUT/NAME.log, records status and seconds.
step() {
  local name=$1 start rc
  shift
  start=$(date +%s)
  echo "== $name: $*"
  timeout -k 10 "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  local secs=$(($(date +%s) - start))
  # 124: gpu-check's timeout, or one the step's command holds (GPU_CHECK_PEER_TIMEOUT).
  if [ $rc -eq 124 ]; then
    if [ $secs -ge "$STEP_TIMEOUT" ]; then
      echo "(gpu-check: stopped after ${STEP_TIMEOUT} s)" >>"$OUT/$name.log"
    else
      echo "(gpu-check: the step's own timeout stopped it after ${secs} s)" >>"$OUT/$name.log"
    fi
  fi
  printf '%s\t%s\t%s\n' "$name" "$rc" "$secs" >>"$STEPS"
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

# cuDNN and NCCL from PyTorch's wheels when the toolkit has none.
for lib in cudnn nccl; do
  up=$(echo $lib | tr a-z A-Z)
  dir=$(python3 -c "import nvidia.$lib as m; print(list(m.__path__)[0])" 2>/dev/null) &&
    export ${up}_ROOT=$dir && export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done

B=build-gpu
MODE=full
if [ -n "${GPU_CHECK_PREBUILT:-}" ]; then
  # A build made elsewhere (`make gpu-bundle`), unpacked at the path it was built at: its test
  # binaries name the tools and the sources there. The checkout is linked there when it is not.
  # A folder is a bundle an earlier gpu-check unpacked (two checks in one lease, side by side).
  if [ -d "$GPU_CHECK_PREBUILT" ]; then
    B=$(cd "$GPU_CHECK_PREBUILT" && pwd)
  else
    STAGE=$(mktemp -d)
    step unpack tar -C "$STAGE" -xJf "$GPU_CHECK_PREBUILT" || { python3 tools/gpu_check/summary.py "$OUT"; exit 1; }
    BUILT=$(cat "$STAGE/BUILD_PATH")
    SRC=$(dirname "$BUILT")
    if [ "$(cd "$SRC" 2>/dev/null && pwd -P)" != "$(pwd -P)" ]; then
      [ -e "$SRC" ] && { echo "gpu-check: $SRC exists and is not this checkout"; exit 1; }
      mkdir -p "$(dirname "$SRC")" && ln -s "$ROOT" "$SRC"
    fi
    rm -rf "$BUILT" && mv "$STAGE" "$BUILT"
    B=$BUILT
  fi
  export LD_LIBRARY_PATH=$B/bundled-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d $d ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d
  done
  MODE="full (prebuilt $(cat "$B/COMMIT" 2>/dev/null))"
  step libraries sh -c "ldd $B/bin/slipstream $B/bin/kernel_ops_gpu_test | grep -E 'not found|cuda|cublas' ; ! ldd $B/bin/* 2>/dev/null | grep -q 'not found'"
else
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
  CONFIG=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIPSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH "${EXTRA[@]}")
  # The whole engine needs more than a GPU image may have; without it, the kernels-only build is
  # the expected outcome, not a failure (mode.txt and configure_full.log say why).
  echo "== configure (whole engine)"
  if ! cmake -S . -B $B "${CONFIG[@]}" >"$OUT/configure_full.log" 2>&1 &&
    ! { echo "   (again without MPI, cairo and ONNX)" && rm -rf $B/CMakeCache.txt &&
        cmake -S . -B $B "${CONFIG[@]}" -DSLIPSTREAM_MPI=OFF -DSLIPSTREAM_PLOT=OFF -DSLIPSTREAM_ONNX=OFF >>"$OUT/configure_full.log" 2>&1; }; then
    B=build-gpu-kernels
    MODE="kernels-only (the whole engine did not configure: configure_full.log)"
    grep -m1 -B1 -A3 "CMake Error" "$OUT/configure_full.log"
    step configure_kernels_only cmake -S . -B $B "${CONFIG[@]}" -DSLIPSTREAM_KERNELS_ONLY=ON
  fi
  step build cmake --build $B -j "$JOBS" --target all slipstream_tests slipstream_benchmarks
fi
echo "$MODE" >"$OUT/mode.txt"
echo "$B" >"$OUT/build_dir.txt"  # where the binaries are (tools/gpu_check/phased.sh reuses it)

if wants tests; then
  # A skipped gpu test means the device was not usable from the test: that fails the check.
  # GPU_CHECK_CTEST_JOBS: gpu tests at a time (default 1; they share the one GPU).
  # GPU_CHECK_TEST_FILTER: a regex of the gpu tests to run (ctest -R; default all), for a call
  # that checks a few kernels' changes and leaves its minutes to timing them.
  step gpu_tests sh -c "cd $B && ctest -L gpu ${GPU_CHECK_TEST_FILTER:+-R '$GPU_CHECK_TEST_FILTER'} -j ${GPU_CHECK_CTEST_JOBS:-1} --output-on-failure --timeout 300 >ctest-gpu.txt 2>&1;
    rc=\$?; cat ctest-gpu.txt; if grep -q '(Skipped)' ctest-gpu.txt; then echo 'gpu tests SKIPPED'; exit 1; fi; exit \$rc"
  # The policy library on the GPU against the CPU (label integration: these pick the GPU when
  # there is one): distributions and sampled controllers, the draws made by policy_choose.
  step policy_on_device $B/bin/policy_tests \
    --gtest_filter='Policy.OnADeviceAnswersAsOnTheCpu:Policy.AutoregressiveHeadsAnswerTheDecodedController'
fi
wants cpu && step kernel_unit_tests sh -c "$B/bin/kernels_test && $B/bin/kernel_ops_cpu_test && $B/bin/kernel_ops_emulated_test"
# The kernel tests without the gpu_standard shapes (DEVICE_TEST(..., GpuStandardShape), the
# determinism reruns): what the sanitizers run in reasonable time.
SMALL='--gtest_filter=-*GpuStandardShape*:*Deterministic*'
if wants sanitize && command -v compute-sanitizer >/dev/null; then
  # Our kernels (tests/kernel_ops, one test source an op). Racecheck judges our kernels
  # (tools/gpu_check/racecheck_ours.py): hazards the libraries' kernels report (cuBLAS's nvjet
  # split-K GEMMs on an H200) are listed, not failed. Racecheck of the kernel tests took over
  # 190 s on an H100, so it comes after the memchecks.
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 $B/bin/kernel_ops_gpu_test "$SMALL"
  step memcheck_cudnn compute-sanitizer --tool memcheck --error-exitcode 1 $B/bin/gru_cudnn_gpu_test
  step racecheck python3 tools/gpu_check/racecheck_ours.py compute-sanitizer --tool racecheck \
    $B/bin/kernel_ops_gpu_test "$SMALL"
  # Whole training steps captured in CUDA graphs and replayed (Mamba, the GRU on our kernels and
  # on cuDNN), under memcheck; the whole engine's build only. Four minutes at most, so a slow
  # sanitizer cannot eat a lease's call.
  [ -x $B/bin/training_device_gpu_tests ] && step memcheck_graphs sh -c "cd $B && timeout 240 \
    compute-sanitizer --tool memcheck --error-exitcode 1 bin/training_device_gpu_tests \
    --gtest_filter=DevicePath.CudaGraphStepsEqualUncapturedSteps"
fi
# mamba-ssm's fused kernels (bench/peers/build_mamba_ssm.sh's bundle; GPU_CHECK_MAMBA_SSM names
# the archive or an unpacked folder): the scan and conv peers time them beside the loop, and the
# peer group's Mamba runs mamba_inner_fn (side_by_side.py --scan fused).
fused=
scan=loop
if [ -n "${GPU_CHECK_MAMBA_SSM:-}" ]; then
  mamba=$GPU_CHECK_MAMBA_SSM
  if [ -f "$mamba" ]; then
    mkdir -p /tmp/gpu-check-mamba-ssm && tar -C /tmp/gpu-check-mamba-ssm -xJf "$mamba" &&
      mamba=$(dirname "$(find /tmp/gpu-check-mamba-ssm -name 'selective_scan_cuda*.so' | head -n 1)")
  fi
  export PYTHONPATH=$(cd "$mamba" && pwd)${PYTHONPATH:+:$PYTHONPATH}
  # Importable here (the bundle's .so against this torch); the peers check the numbers.
  step mamba_ssm_import python3 -c "from mamba_ssm.ops.selective_scan_interface import \
mamba_inner_fn, selective_scan_fn; from causal_conv1d import causal_conv1d_fn" &&
    fused=--fused && scan=fused
fi
if wants kernels; then
  step bench_kernels_cuda $B/bin/bench_kernels_cuda --benchmark_min_time=0.05 \
    --benchmark_filter="${GPU_CHECK_BENCH_FILTER:-.}" \
    --benchmark_out="$OUT/bench_kernels_cuda.json" --benchmark_out_format=json
  expect_file bench_kernels_cuda "$OUT/bench_kernels_cuda.json"
  # torch.compile of the 60-step loop takes minutes: only when GPU_CHECK_PEER names a compile
  # mode, unless GPU_CHECK_SCAN_COMPILE says 0 or 1 (a lease whose minutes go to the step's
  # compile).
  compile=--no-compile
  [[ " ${GPU_CHECK_PEER:-eager} " == *" compile"* ]] && compile=
  case ${GPU_CHECK_SCAN_COMPILE:-} in 0) compile=--no-compile ;; 1) compile= ;; esac
  # GPU_CHECK_TORCH_SCAN=0: not the peer's scan (a lease that times only our kernels' forms).
  if [ "${GPU_CHECK_TORCH_SCAN:-1}" != 0 ]; then
    step torch_scan python3 bench/peers/selective_scan_torch.py $compile $fused \
      --json "$OUT/torch_scan.json"
    expect_file torch_scan "$OUT/torch_scan.json"
  fi
fi
if [[ "$MODE" == full* ]]; then
  # On real replays where there are some: ../shared/replays, which no lease carries, or
  # .gpu-carry/replays.tar.xz (`make gpu-bundle` packs ../shared/replays there), or the folder
  # GPU_CHECK_REPLAYS names.
  if wants train; then
    REPLAYS=${GPU_CHECK_REPLAYS:-}
    [ -z "$REPLAYS" ] && [ -d ../shared/replays ] && REPLAYS=../shared/replays
    if [ -z "$REPLAYS" ] && [ -f .gpu-carry/replays.tar.xz ]; then
      mkdir -p /tmp/gpu-check-replays && tar -C /tmp/gpu-check-replays -xJf .gpu-carry/replays.tar.xz &&
        REPLAYS=/tmp/gpu-check-replays/replays
    fi
    step gpu_quick $B/bin/slipstream run --preset gpu_quick --set run.steps=300 \
      --set run.log_every=50 ${REPLAYS:+--set "replays.paths=[$REPLAYS]"}
    # slipstream-smi's GPU rows against nvidia-smi's own while a gpu_quick run trains (name,
    # memory used, utilisation, power), and the run's row (device, device memory).
    command -v nvidia-smi >/dev/null && [ -x $B/bin/slipstream-smi ] &&
      step smi_vs_nvidia_smi python3 tools/gpu_check/smi_vs_nvidia_smi.py $B/bin "$OUT" \
        ${REPLAYS:+--set "replays.paths=[$REPLAYS]"}
  fi
  # The largest batch that fits, chosen by probes on the device (docs/memory.md).
  wants train && step auto_batch $B/bin/slipstream run --preset gpu_standard \
    --set replays.batch_size=auto --set run.steps=20 --set run.log_every=10
  # The GRU graph with its stack in cuDNN against our per-step layer (kernels/gru_cudnn.h), each
  # in fp32 and bf16 (cuDNN's bf16 RNN needs cuDNN 9.13: older ones run fp32 and say so).
  for gb in kernels cudnn; do
    wants e2e || break
    step bench_e2e_gru_$gb $B/bin/bench_e2e --preset configs/train_bc_gru.yaml --steps 50 \
      --warmup 10 --precisions fp32 bf16 --set run.device=cuda --set core.backend=$gb \
      --set core.layers=2 --json "$OUT/bench_e2e_gru_$gb.json"
    expect_file bench_e2e_gru_$gb "$OUT/bench_e2e_gru_$gb.json"
  done
  # The whole step on the GPU, fp32 against bf16 and bf16 without the CUDA graph, in one process,
  # at the three GPU presets.
  for p in gpu_quick gpu_standard production; do
    wants e2e || break
    n=100; [ $p = production ] && n=30  # production's step is 4 batches (accumulation)
    step bench_e2e_$p $B/bin/bench_e2e --preset $p --steps $n --warmup $((n / 5)) \
      --precisions fp32 bf16 --without-graph --json "$OUT/bench_e2e_$p.json"
    expect_file bench_e2e_$p "$OUT/bench_e2e_$p.json"
    [ $p = production ] && continue  # the step's figures; the data path at the two smaller shapes
    # The data path: loaded against resident batches, alternating; GPU busy % from NVML, whose
    # utilization is an average over up to a second: the timed steps must last a few seconds.
    m=300; [ $p = gpu_quick ] && m=1500
    step overlap_$p $B/bin/slipstream bench --preset $p --steps $m --warmup 50 --overlap \
      --repeats 2 --json "$OUT/overlap_$p.json"
    expect_file overlap_$p "$OUT/overlap_$p.json"
  done
  # The policy library stepping n games per call (n = 1, 64, 256, 1024) on the GPU and on one CPU
  # thread, in one process (before the ab group, whose whole steps take minutes: a lease cut short
  # still has these): latency p50/p99 per call and frames/s (cpu_quick's core, which is
  # gpu_standard's).
  if wants infer; then
    step bench_infer_policy env SLIPSTREAM_BENCH_DEVICE=cuda $B/bin/bench_infer \
      --benchmark_filter='PolicyStepBatch(OnDevice)?/games:[0-9]+/(threads:1/)?real_time' \
      --benchmark_min_time=0.5 --benchmark_out="$OUT/bench_infer_policy.json" \
      --benchmark_out_format=json
    expect_file bench_infer_policy "$OUT/bench_infer_policy.json"
    # GPU_CHECK_INFER_FORMS: the device's frames again in other forms, each against the default's
    # figures of the same call (results_rows.py: infer/device_FORM/...): small_gemm, the
    # small-row GEMM kernel in place of cuBLASLt (kernels/gemm.h); fused_frame, the model's frame
    # in one launch (kernels/mamba_frame.h); fused_frame_small_gemm, both.
    forms=" ${GPU_CHECK_INFER_FORMS:-} "
    if [ "${GPU_CHECK_INFER_SMALL_GEMM:-0}" = 1 ] && [[ "$forms" != *" small_gemm "* ]]; then
      forms="$forms small_gemm "
    fi
    # form_vars FORM: the switches of an inference form (default: none); 1 for a form unknown.
    form_vars() {
      case "$1" in
        default) vars="" ;;
        small_gemm) vars="SLIPSTREAM_SMALL_GEMM=warps" ;;
        fused_frame) vars="SLIPSTREAM_MAMBA_FRAME=fused" ;;
        fused_frame_small_gemm) vars="SLIPSTREAM_MAMBA_FRAME=fused SLIPSTREAM_SMALL_GEMM=warps" ;;
        *) echo "GPU_CHECK_INFER_FORMS: no form $1 (small_gemm, fused_frame," \
             "fused_frame_small_gemm)" >&2; return 1 ;;
      esac
    }
    for form in $forms; do
      form_vars "$form" || continue
      # shellcheck disable=SC2086  # vars: words for env
      step "bench_infer_$form" env SLIPSTREAM_BENCH_DEVICE=cuda $vars \
        $B/bin/bench_infer --benchmark_filter='PolicyStepBatchOnDevice/games:[0-9]+/real_time' \
        --benchmark_min_time=0.5 --benchmark_out="$OUT/bench_infer_$form.json" \
        --benchmark_out_format=json
      expect_file "bench_infer_$form" "$OUT/bench_infer_$form.json"
    done
    # A frame's operations on the device as its CUDA graph runs them (`slipstream infer
    # --op-times`, infer_optimes[_FORM].log; the summary prints each): gpu_standard's model, its
    # checkpoint from two steps on synthetic games, one synthetic game of 600 frames.
    R=$OUT/infer_optimes
    if step infer_optimes_setup sh -c "$B/bin/slipstream synth --games 1 --frames 600 \
        --out $R/game && $B/bin/slipstream run --preset gpu_standard --set run.steps=2 \
        --set run.validate_every=0 --set run.runs_dir=$R/runs"; then
      for form in default $forms; do
        form_vars "$form" 2>/dev/null || continue
        name=infer_optimes
        [ "$form" = default ] || name=infer_optimes_$form
        # shellcheck disable=SC2086  # vars: words for env
        step "$name" env $vars sh -c "$B/bin/slipstream infer --checkpoint \$(ls -d $R/runs/*/ |
          head -n 1) --replay \$(ls $R/game/*.slp | head -n 1) --port 1 --device cuda --op-times"
      done
    fi
  fi
  # Kernel forms against the default: the whole step of one build with a form switched by its
  # environment variable against without, alternating (ab_step.sh), at gpu_standard and
  # production. scan_no_states: the scan's forward not keeping the chunk states its backward reads
  # (kernels/selective_scan.h, SLIPSTREAM_SCAN_FORWARD_STATES=0; keeping them is the default since
  # an H100 timed it, entry scan_states); embed_partials: the embedding's table gradients by dense
  # partials (stages/melee/melee_cuda.inc, SLIPSTREAM_EMBED_BACKWARD=partials; the counting sort is
  # the default since then, entry embed_sorted); scan_shared_sums, scan_shared_whole_chunks: the
  # scan backward's forms of those names (SLIPSTREAM_SCAN_BACKWARD);
  # scan_forward_lean: the training forward's lean form (SLIPSTREAM_SCAN_FORWARD=lean);
  # scan_spread_steps: the scan backward's spread_steps form (SLIPSTREAM_SCAN_BACKWARD).
  # GPU_CHECK_AB names which (default scan_shared_whole_chunks). Entry `build`: this bundle
  # against an earlier build's bench_e2e (GPU_CHECK_AB_BASE: the file, or an .xz of it; `make
  # gpu-ab-base` packs build-gpu's before the bundle is remade), for a change with no switch.
  if wants ab; then
    for ab in ${GPU_CHECK_AB:-scan_shared_whole_chunks}; do
      if [ "$ab" = build ]; then
        base=$OUT/ab_build_base
        mkdir -p "$base"
        case ${GPU_CHECK_AB_BASE:-} in
          *.xz) xz -dc "$GPU_CHECK_AB_BASE" >"$base/bench_e2e" ;;
          "") echo "gpu_check: GPU_CHECK_AB entry 'build' needs GPU_CHECK_AB_BASE"; continue ;;
          *) cp "$GPU_CHECK_AB_BASE" "$base/bench_e2e" ;;
        esac
        chmod +x "$base/bench_e2e"
        step ab_build env AB_REPEATS="${GPU_CHECK_AB_REPEATS:-2}" \
          AB_PRECISIONS="${GPU_CHECK_AB_PRECISIONS:-fp32 bf16}" \
          bash tools/gpu_check/ab_step.sh "$base" "$B/bin" "$OUT/ab_build"
        continue
      fi
      case $ab in
        scan_states) switch=SLIPSTREAM_SCAN_FORWARD_STATES=1 ;;   # the default since 2026-11-28
        scan_no_states) switch=SLIPSTREAM_SCAN_FORWARD_STATES=0 ;;
        embed_sorted) switch=SLIPSTREAM_EMBED_BACKWARD=sorted ;;  # the default since 2026-11-28
        embed_partials) switch=SLIPSTREAM_EMBED_BACKWARD=partials ;;
        scan_shared_sums) switch=SLIPSTREAM_SCAN_BACKWARD=shared_sums ;;
        scan_shared_whole_chunks) switch=SLIPSTREAM_SCAN_BACKWARD=shared_whole_chunks ;;
        scan_forward_lean) switch=SLIPSTREAM_SCAN_FORWARD=lean ;;
        scan_spread_steps) switch=SLIPSTREAM_SCAN_BACKWARD=spread_steps ;;
        *) echo "gpu_check: unknown GPU_CHECK_AB entry '$ab'"; continue ;;
      esac
      cand=$OUT/ab_${ab}_bin
      mkdir -p "$cand"
      printf '#!/bin/sh\n%s exec %s/bench_e2e "$@"\n' "$switch" "$B/bin" >"$cand/bench_e2e"
      chmod +x "$cand/bench_e2e"
      step ab_$ab env AB_REPEATS="${GPU_CHECK_AB_REPEATS:-2}" \
        AB_PRECISIONS="${GPU_CHECK_AB_PRECISIONS:-fp32 bf16}" \
        bash tools/gpu_check/ab_step.sh "$B/bin" "$cand" "$OUT/ab_$ab"
    done
  fi
  # The loader on this machine's cores: windows/s out of produce() and setup time against
  # threads (what the GPU's step consumes must stay below it); a few seconds.
  if wants e2e; then
    step bench_loader $B/bin/bench_loader --benchmark_min_time=0.05 \
      --benchmark_out="$OUT/bench_loader.json" --benchmark_out_format=json
    expect_file bench_loader "$OUT/bench_loader.json"
  fi
  # Our step against the PyTorch peer on the GPU at gpu_standard (the peer checked against our
  # reference step first), one step per mode so a slow torch.compile cannot hide eager's figure.
  # GPU_CHECK_PEER: the modes (default eager; "none" skips; compile-regions, PyTorch's regional
  # compilation, and compile, the whole step as one graph, add minutes: the whole step's first
  # compile took more than 180 s on an H200); GPU_CHECK_PEER_TIMEOUT: seconds each mode may take
  # (default 240). side_by_side.py rewrites its JSON after each repeat: a mode cut short by the
  # timeout still reports the repeats it finished. GPU_CHECK_PEER_SHAPES: the shapes (default
  # gpu_standard; also gpu_quick, production); GPU_CHECK_PEER_PRECISIONS: fp32 (default) and or
  # bf16 (ours in bf16, the peer under torch.autocast); each mode at each.
  for prec in ${GPU_CHECK_PEER_PRECISIONS:-fp32}; do
    for shape in ${GPU_CHECK_PEER_SHAPES:-gpu_standard}; do
      for m in ${GPU_CHECK_PEER:-eager}; do
        { [ "$m" = none ] || ! wants peer; } && break 3
        name=side_by_side_$m
        [ "$shape" = gpu_standard ] || name=${name}_$shape
        [ "$prec" = fp32 ] || name=${name}_$prec
        step $name timeout "${GPU_CHECK_PEER_TIMEOUT:-240}" python3 bench/peers/side_by_side.py \
          --device cuda --shape "$shape" --precision "$prec" --repeats 2 --steps 20 --warmup 3 \
          --modes $m --scan $scan --slipstream $B/bin/slipstream --json "$OUT/$name.json"
        expect_file $name "$OUT/$name.json"
      done
    done
  done
fi
# Where the device's time goes inside the step as its CUDA graph runs it, with no profiler:
# `slipstream bench --op-times` stamps the time between every two operations of the graph (each
# preset GPU_CHECK_PROFILE_PRESETS names), the summary prints the table. Where Nsight Compute
# cannot read the counters (gVisor machines), this is the per-kernel table.
if [[ "$MODE" == full* ]] && wants profile; then
  for preset in ${GPU_CHECK_PROFILE_PRESETS:-gpu_standard}; do
    step optimes_$preset $B/bin/slipstream bench --preset $preset --steps 30 --warmup 20 \
      --op-times --json "$OUT/optimes_$preset.json"
    expect_file optimes_$preset "$OUT/optimes_$preset.json"
  done
fi
# Where the device's time goes: every kernel's duration (Nsight Compute, one metric) over about
# ten steps of each preset GPU_CHECK_PROFILE_PRESETS names (default gpu_standard) past its
# start, summed per kernel by the summary. The caches are left as the step leaves them
# (--cache-control none): flushed before each launch, gpu_standard's kernels summed to 3.83 ms a
# step against the 1.83 ms measured (H200, 2026-11-28), its tensors being L2-sized.
# GPU_CHECK_PROFILE_NCU=0 leaves Nsight Compute out (the time stamps above alone).
if [[ "$MODE" == full* ]] && wants profile && [ "${GPU_CHECK_PROFILE_NCU:-1}" = 1 ] &&
  command -v ncu >/dev/null; then
  for preset in ${GPU_CHECK_PROFILE_PRESETS:-gpu_standard}; do
    step profile_$preset ncu --csv --log-file "$OUT/profile_$preset.csv" \
      --clock-control none --cache-control none --metrics gpu__time_duration.sum \
      --launch-skip 3000 \
      --launch-count 2000 $B/bin/slipstream run --preset $preset --set run.steps=200 \
      --set run.log_every=50
    expect_file profile_$preset "$OUT/profile_$preset.csv"
  done
  # GPU_CHECK_PROFILE_KERNELS: kernels (name regexes) to profile in full (Nsight Compute's `full`
  # set: occupancy, stall reasons, throughput) at one launch each in production's step past its
  # start, into ncu_<name>.csv.
  for k in ${GPU_CHECK_PROFILE_KERNELS:-}; do
    step ncu_$k ncu --csv --page details --set full --kernel-name "regex:$k" --launch-skip 20 \
      --launch-count 1 --log-file "$OUT/ncu_$k.csv" $B/bin/slipstream run --preset production \
      --set run.steps=12 --set run.log_every=50
    expect_file ncu_$k "$OUT/ncu_$k.csv"
  done
  # GPU_CHECK_PROFILE_INFER=1: the policy's one-game frame on the device, each of its kernels'
  # durations over about 10 frames past the first 100 launches (bench_infer's games:1 call; its
  # first frame, which captures the frame's graph, took 176 ms under ncu on an H200, so the
  # benchmark runs a second for more frames than that).
  if [ "${GPU_CHECK_PROFILE_INFER:-0}" = 1 ]; then
    step profile_infer env SLIPSTREAM_BENCH_DEVICE=cuda ncu --csv --log-file \
      "$OUT/profile_infer.csv" --clock-control none --metrics gpu__time_duration.sum \
      --launch-skip 100 --launch-count 200 $B/bin/bench_infer \
      --benchmark_filter='PolicyStepBatchOnDevice/games:1/' --benchmark_min_time=1
    expect_file profile_infer "$OUT/profile_infer.csv"
  fi
fi
python3 tools/gpu_check/summary.py "$OUT"
