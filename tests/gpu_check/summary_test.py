#!/usr/bin/env python3
"""summary_test.py SUMMARY: runs gpu-check's summary on output folders written here (the files
the steps write, in their formats) and checks what it prints and its exit status."""
import json
import os
import subprocess
import sys
import tempfile


def write(folder, name, obj):
    with open(os.path.join(folder, name), "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))


def side_by_side(shape, precision, modes, done, repeats=2):
    ms = {"slipstream": 4.0} | {f"torch {m}": t for m, t in modes.items()}
    return {"shape": shape, "device": "cuda", "precision": precision, "repeats": repeats,
            "repeats_done": done, "median_step_ms": ms,
            "speedup": {k: v / 4.0 for k, v in ms.items() if k != "slipstream"},
            "startup_s": {k: [95.0, 3.5] if "compile" in k else [0.1, 0.1] for k in ms}}


def loader_bench():
    rows = []
    for which in (0, 1):
        for t in (1, 2, 16):
            base = f"synthetic:{which}/threads:{t}/real_time"
            rows.append({"name": f"BM_Setup/{base}", "real_time": 50.0 / t})
            rows.append({"name": f"BM_Produce/{base}", "real_time": 500.0,
                         "items_per_second": 400000.0 + t})
    rows[0] = {"name": "BM_Setup/synthetic:0/threads:1/real_time", "error_occurred": True,
               "error_message": "replays not found"}
    return {"benchmarks": rows}


def run(summary, folder):
    r = subprocess.run([sys.executable, summary, folder], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def expect(out, *needles):
    missing = [n for n in needles if n not in out]
    if missing:
        print(out)
        print(f"FAIL: missing {missing}")
        sys.exit(1)


def main(summary):
    with tempfile.TemporaryDirectory() as d:
        write(d, "steps.tsv", "device\t0\t1\nside_by_side_compile\t124\t240\n"
              "side_by_side_eager_production_bf16\t0\t30\n")
        write(d, "mode.txt", "full (prebuilt abc1234)\n")
        write(d, "side_by_side_compile.json", side_by_side("gpu_standard", "fp32",
                                                           {"compile": 12.0}, done=1))
        write(d, "side_by_side_eager_production_bf16.json",
              side_by_side("production", "bf16", {"eager": 400.0}, done=2))
        write(d, "bench_loader.json", loader_bench())
        write(d, "bench_kernels_cuda.json", {"benchmarks": [
            {"name": "scan_backward/fp32/gpu_standard/manual_time", "real_time": 600.0},
            {"name": "scan_backward_registers/fp32/gpu_standard/manual_time", "real_time": 900.0},
            {"name": "scan_backward/bf16/gpu_standard/manual_time", "real_time": 620.0},
            {"name": "scan_backward/bf16/production/manual_time", "real_time": 2000.0},
            {"name": "scan_backward_exact_exp/bf16/production/manual_time", "real_time": 2200.0},
            {"name": "scan_backward_spread_steps/bf16/production/manual_time", "real_time": 1600.0},
            {"name": "frame_floor/19_launches/manual_time", "real_time": 40.0, "device_us": 31.5},
            {"name": "gemm_small/cublaslt/fp32/M1_N512_K128/manual_time", "real_time": 5.0},
            {"name": "gemm_small/warps/fp32/M1_N512_K128/manual_time", "real_time": 3.0},
            {"name": "mamba_frame/layers/bf16/gpu_standard/games:1/manual_time",
             "real_time": 40.0},
            {"name": "mamba_frame/fused/bf16/gpu_standard/games:1/manual_time", "real_time": 10.0},
            {"name": "scan_forward_kept_states/fp32/production/manual_time", "real_time": 300.0},
            {"name": "scan_forward_lean/fp32/production/manual_time", "real_time": 240.0},
            {"name": "embed_backward_partials/gpu_standard/manual_time", "real_time": 150.0},
            {"name": "embed_backward_sorted/gpu_standard/manual_time", "real_time": 20.0}]})
        write(d, "bench_e2e_gpu_standard.json",
              {"runs": [{"precision": "fp32", "steps_per_s": 250.0, "samples_per_s": 64000.0,
                         "ratio_to_first": 1.0},
                        {"precision": "bf16", "steps_per_s": 300.0, "samples_per_s": 76800.0,
                         "ratio_to_first": 1.2}]})
        # Two presets' Nsight Compute profiles (ncu --csv rows, one a launch, after its log).
        head = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
                '"Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
                '"Metric Unit","Metric Value"\n')
        def launch(i, kernel, ns):
            return (f'"{i}","1","slipstream","h","{kernel}","1","13","(128, 1, 1)","(8, 1, 1)",'
                    f'"0","9.0","Command line profiler metrics","gpu__time_duration.sum","ns",'
                    f'"{ns:,}"\n')
        write(d, "profile_gpu_standard.csv", "==PROF== Connected\n" + head +
              launch(0, "scan_backward_chan_kernel", 300000) + launch(1, "rms_kernel", 100000))
        write(d, "profile_production.csv", head + launch(0, "scan_backward_chan_kernel", 3000) +
              launch(1, "scan_backward_chan_kernel", 1000))
        # `slipstream bench --op-times`: the operations as the step's graph ran them.
        write(d, "optimes_gpu_standard.json", {"preset": "gpu_standard", "precision": "bf16",
              "operations": {"graphs_timed": 30, "untimed_batches": 0, "batches_per_step": 1,
                             "device_ms_per_step": 1.5, "ops": [
                                 {"what": "scan_backward_chan_kernel", "stage": "core",
                                  "calls_per_step": 2.0, "us_per_step": 450.0, "share_pct": 30.0},
                                 {"what": "gemm bf16 15360x40x128 NT", "stage": "heads",
                                  "calls_per_step": 5.0, "us_per_step": 30.0, "share_pct": 2.0}]}})
        # `slipstream infer --op-times`: a frame's operations, in the step's log.
        write(d, "infer_optimes_fused_frame.log",
              "latency per frame (embedding, temporal step, heads): p50 40.0 us, p99 60.0 us\n"
              "operations on the device, ...\n"
              "device time a frame: 0.021 ms (1 graph a frame)\n"
              "operation   stage   calls/frame   us/frame   share\n"
              "mamba_frame_kernel   core   1.0   12.0   57.1%\n")
        rc, out = run(summary, d)
        expect(out, "a frame's operations (fused_frame): device time a frame: 0.021 ms (1 graph "
               "a frame); latency per frame (embedding, temporal step, heads): p50 40.0 us",
               "mamba_frame_kernel   core")
        expect(out, "operations, gpu_standard bf16: 1.500 ms a step on the device in 30 timed "
               "graphs (0 batches untimed)")
        if not any("scan_backward_chan_kernel" in l and "core" in l and "450.0" in l and
                   "30.0%" in l for l in out.splitlines()):
            print(out)
            print("FAIL: the operations' table has no scan backward row")
            return 1
        expect(out, "profile, gpu_standard: 2 kernels, 0.40 ms on the device",
               "profile, production: 2 kernels, 0.00 ms on the device")
        if not any("scan_backward_chan_kernel" in l and "75.0%" in l for l in out.splitlines()):
            print(out)
            print("FAIL: gpu_standard's scan backward not 75% of its profile")
            return 1
        expect(out, "=== gpu-check summary: full (prebuilt abc1234) build ===",
               # A compile mode cut short by its timeout: the repeat it finished, and failed.
               "torch compile 12.00 ms -> ours is 3.00x (1 of 2 repeats; goal >= 1.5x)",
               "torch compile's first step (its compile, or torch's caches): 95.0 s, 3.5 s",
               # Goals only at gpu_standard; the other shape and precision by their names.
               "vs PyTorch, production bf16: ours 4.00 ms, torch eager 400.00 ms -> ours is "
               "100.00x (2 of 2 repeats)",
               "skipped: replays not found", "400,016", "consumes 76,800 windows/s",
               # The scan backward's default against its other shape, where both were timed.
               "scan backward, gpu_standard fp32: default 600.0 us, registers 900.0 us: "
               "registers takes 1.50x the time of default",
               "scan backward, production bf16: default 2000.0 us, exact_exp 2200.0 us: "
               "exact_exp takes 1.10x the time of default",
               "scan backward, production bf16: default 2000.0 us, spread_steps 1600.0 us: "
               "spread_steps takes 0.80x the time of default",
               # A policy frame's floor: the device's time beside the host's.
               "device 31.5 us",
               "GEMM of few rows, fp32/M1_N512_K128: cublaslt 5.0 us, warps 3.0 us: warps takes "
               "0.60x the time of cublaslt",
               # A model's frame: its layers against one launch.
               "Mamba frame, bf16/gpu_standard/games:1: layers 40.0 us, fused 10.0 us: fused "
               "takes 0.25x the time of layers",
               # The training forward's two forms.
               "scan forward keeping its states, production fp32: default 300.0 us, lean 240.0 "
               "us: lean takes 0.80x the time of default",
               # The embedding's table gradients, both forms timed.
               "embedding table gradients, gpu_standard: partials 150.0 us, sorted 20.0 us: "
               "sorted takes 0.13x the time of partials",
               "2 passed, 1 failed: side_by_side_compile")
        if "goal >= 3.0x" in out or "gpu_standard bf16: default" in out:
            print(out)
            print("FAIL: a goal printed for a shape other than gpu_standard, or a scan "
                  "comparison without its other row")
            return 1
        if rc != 1:
            print(f"FAIL: exit {rc} with a failed step, expected 1")
            return 1
        # A side-by-side file from before repeats_done and startup_s, every step passed.
        old = side_by_side("gpu_standard", "fp32", {"eager": 90.0}, done=2)
        del old["repeats_done"], old["startup_s"]
        write(d, "side_by_side_compile.json", old)
        write(d, "steps.tsv", "device\t0\t1\n")
        rc, out = run(summary, d)
        expect(out, "torch eager 90.00 ms -> ours is 22.50x (2 of 2 repeats; goal >= 3.0x)",
               "1 passed, 0 failed")
        if rc != 0:
            print(out)
            print(f"FAIL: exit {rc} with every step passed, expected 0")
            return 1
    print("summary_test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
