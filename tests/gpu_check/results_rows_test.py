#!/usr/bin/env python3
"""tools/gpu_check/results_rows.py on a made-up gpu-check output folder: the rows a lease's
files give, their baselines and the direction of each ratio. Exits 1 on the first mismatch."""
import json
import os
import subprocess
import sys
import tempfile


def write(d, name, content):
    with open(os.path.join(d, name), "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main(tool):
    with tempfile.TemporaryDirectory() as d:
        write(d, "mode.txt", "full (prebuilt abc1234)\n")
        write(d, "bench_kernels_cuda.json", {"benchmarks": [
            {"name": "scan_backward/bf16/production/manual_time", "real_time": 2000.0,
             "time_unit": "us", "GB/s": 1500.0},
            {"name": "scan_backward_exact_exp/bf16/production/manual_time", "real_time": 2200.0,
             "time_unit": "us"},
            {"name": "scan_backward_shared_sums/bf16/production/manual_time", "real_time": 1600.0,
             "time_unit": "us"},
            {"name": "scan_backward_spread_steps/bf16/production/manual_time", "real_time": 1250.0,
             "time_unit": "us"},
            {"name": "frame_floor/19_launches/manual_time", "real_time": 40.0, "time_unit": "us",
             "device_us": 31.5},
            {"name": "gemm_small/cublaslt/bf16/M1_N40_K256/manual_time", "real_time": 5.0,
             "time_unit": "us"},
            {"name": "gemm_small/warps/bf16/M1_N40_K256/manual_time", "real_time": 4.0,
             "time_unit": "us"},
            {"name": "mamba_frame/layers/bf16/gpu_standard/games:1/manual_time",
             "real_time": 40.0, "time_unit": "us", "launches": 14.0},
            {"name": "mamba_frame/fused/bf16/gpu_standard/games:1/manual_time",
             "real_time": 10.0, "time_unit": "us", "launches": 1.0},
            {"name": "scan_forward/fp32/gpu_standard/manual_time", "real_time": 100.0,
             "time_unit": "us"},
            {"name": "scan_backward/fp32/gpu_standard/manual_time", "real_time": 500.0,
             "time_unit": "us"},
            {"name": "embed_backward_sorted/gpu_standard/manual_time", "error_occurred": True,
             "error_message": "no"}]})
        write(d, "bench_e2e_gpu_standard.json", {"runs": [
            {"precision": "fp32", "steps_per_s": 250.0, "device": "NVIDIA H100 80GB HBM3"},
            {"precision": "bf16", "steps_per_s": 400.0,
             "cuda_graph": {"summary": "99 of 100 replayed", "operations": 69}},
            {"precision": "bf16/nograph", "steps_per_s": 320.0}]})
        write(d, "overlap_gpu_quick.json", {"loading_steps_per_s": 990.0,
                                             "resident_steps_per_s": 1000.0,
                                             "overlap_ratio": 0.99,
                                             "loading": [{"gpu_busy_pct": 90.0},
                                                         {"gpu_busy_pct": 92.0}]})
        write(d, "bench_infer_policy.json", {"benchmarks": [
            {"name": "BM_PolicyStepBatch/games:256/threads:1/real_time", "p50_us": 900.0,
             "p99_us": 1000.0, "frames_per_s": 250000.0},
            {"name": "BM_PolicyStepBatch/games:256/threads:2/real_time", "frames_per_s": 1.0},
            {"name": "BM_PolicyStepBatchOnDevice/games:256/real_time", "p50_us": 100.0,
             "p99_us": 150.0, "frames_per_s": 2500000.0}]})
        write(d, "bench_infer_small_gemm.json", {"benchmarks": [
            {"name": "BM_PolicyStepBatchOnDevice/games:256/real_time", "p50_us": 80.0}]})
        write(d, "bench_infer_fused_frame.json", {"benchmarks": [
            {"name": "BM_PolicyStepBatchOnDevice/games:256/real_time", "p50_us": 50.0,
             "frames_per_s": 5000000.0}]})
        write(d, "side_by_side_eager.json", {"shape": "gpu_standard", "precision": "bf16",
                                             "median_step_ms": {"slipstream": 2.0,
                                                                "torch eager": 20.0},
                                             "speedup": {"torch eager": 10.0}, "repeats": 3})
        write(d, "torch_scan.json", {"fused": {
            "gpu_standard": {"checked": True, "selective_scan_fn/fp32/fwd_bwd_ms": 1.2},
            "production": {"checked": False, "selective_scan_fn/fp32/fwd_bwd_ms": 0.1}}})
        write(d, "optimes_production.json", {"preset": "production", "precision": "bf16",
              "operations": {"graphs_timed": 40, "untimed_batches": 0, "batches_per_step": 4,
                             "device_ms_per_step": 22.5, "ops": [
                                 {"what": "scan_backward_chan_kernel", "stage": "core",
                                  "calls_per_step": 12.0, "us_per_step": 9000.0,
                                  "share_pct": 40.0}]}})
        out = subprocess.run([sys.executable, tool, d, "--date", "2026-12-01"],
                             capture_output=True, text=True)
        if out.returncode != 0:
            fail(out.stderr)
        rows = {}
        for line in out.stdout.splitlines():
            r = json.loads(line)
            for key in ("date", "commit", "machine", "name", "value", "unit", "baseline",
                        "ratio", "command"):
                if key not in r:
                    fail(f"{r.get('name')}: no {key}")
            rows[r["name"]] = r

        def expect(name, value, baseline=None, ratio=None):
            r = rows.get(name)
            if r is None:
                fail(f"no row {name}; rows: {sorted(rows)}")
            if abs(r["value"] - value) > 1e-6 * max(1.0, abs(value)):
                fail(f"{name}: value {r['value']}, want {value}")
            got = r["baseline"]["name"] if r["baseline"] else None
            if got != baseline:
                fail(f"{name}: baseline {got}, want {baseline}")
            if ratio is not None and abs(r["ratio"] - ratio) > 1e-3:
                fail(f"{name}: ratio {r['ratio']}, want {ratio}")

        r = rows["kernel/scan_backward/bf16/production"]
        if r["commit"] != "abc1234" or r["machine"] != "NVIDIA H100 80GB HBM3":
            fail(f"commit/machine {r['commit']} / {r['machine']}")
        if r["date"] != "2026-12-01":
            fail(f"date {r['date']}")
        expect("kernel/scan_backward/bf16/production", 2000.0)
        # A variant against the default, in the same call: 2000 / 2200.
        expect("kernel/scan_backward_exact_exp/bf16/production", 2200.0,
               "scan_backward/bf16/production", 0.909)
        expect("kernel/scan_backward_shared_sums/bf16/production", 1600.0,
               "scan_backward/bf16/production", 1.25)
        expect("kernel/scan_backward_spread_steps/bf16/production", 1250.0,
               "scan_backward/bf16/production", 1.6)
        expect("kernel/gemm_small/warps/bf16/M1_N40_K256", 4.0,
               "gemm_small/cublaslt/bf16/M1_N40_K256", 1.25)
        # The model's frame in one launch against its layers: 40 / 10 us, the nodes in the note.
        expect("kernel/mamba_frame/fused/bf16/gpu_standard/games:1", 10.0,
               "mamba_frame/layers/bf16/gpu_standard/games:1", 4.0)
        if rows["kernel/mamba_frame/layers/bf16/gpu_standard/games:1"].get("note") != "14 launches":
            fail("the frame graph's launches not in the note")
        # A policy frame's floor: the host's wall time, the device's in the note.
        expect("kernel/frame_floor/19_launches", 40.0)
        if rows["kernel/frame_floor/19_launches"].get("note") != "device 31.5 us":
            fail(f"frame_floor note {rows['kernel/frame_floor/19_launches'].get('note')}")
        if "kernel/embed_backward_sorted/gpu_standard" in rows:
            fail("a benchmark that failed became a row")
        expect("step/gpu_standard/fp32", 4.0)
        expect("step/gpu_standard/bf16", 2.5, "step/gpu_standard/fp32", 1.6)
        expect("step/gpu_standard/bf16/nograph", 3.125, "step/gpu_standard/bf16", 0.8)
        expect("step/gpu_standard/bf16/operations", 69)
        # The step's operations as its graph ran them: the whole, then each (stage, operation).
        expect("optime/production/bf16", 22500.0)
        expect("optime/production/bf16/core/scan_backward_chan_kernel", 9000.0)
        if rows["optime/production/bf16/core/scan_backward_chan_kernel"].get("note") != \
                "12 calls a step, 40.0 %":
            fail("an operation's calls and share not in its note")
        expect("overlap/gpu_quick/steps_per_s_loading", 990.0,
               "overlap/gpu_quick/steps_per_s_resident", 0.99)
        expect("gpu_busy/gpu_quick", 91.0)
        expect("infer/cpu/games:256/p50", 900.0)
        expect("infer/device/games:256/p99", 150.0)
        # More frames is better: 2.5 M against one CPU thread's 250 k.
        expect("infer/device/games:256/frames_per_s", 2500000.0,
               "infer/cpu/games:256/frames_per_s", 10.0)
        # The small-row GEMM kernel's frames against cuBLASLt's: 100 / 80 us.
        expect("infer/device_small_gemm/games:256/p50", 80.0, "infer/device/games:256/p50", 1.25)
        # The fused frame's: 100 / 50 us, and twice the frames.
        expect("infer/device_fused_frame/games:256/p50", 50.0, "infer/device/games:256/p50", 2.0)
        expect("infer/device_fused_frame/games:256/frames_per_s", 5000000.0,
               "infer/device/games:256/frames_per_s", 2.0)
        if any(n.startswith("infer/device_fused_frame_small_gemm") for n in rows):
            fail("rows of a form whose file is not there")
        if any("threads:2" in n for n in rows) or rows["infer/cpu/games:256/frames_per_s"][
                "value"] != 250000.0:
            fail("the two-thread CPU run was taken for the one-thread baseline")
        # The peer's step against ours: ours is 10x faster.
        expect("peer/torch eager/gpu_standard/bf16", 20.0,
               "step/gpu_standard/bf16 (ours, same run)", 10.0)
        expect("peer_kernel/selective_scan_fn/gpu_standard/fp32", 1200.0,
               "kernel/scan_forward+backward/fp32/gpu_standard (ours, same call)", 2.0)
        if any("production" in n and n.startswith("peer_kernel") for n in rows):
            fail("a peer kernel that failed its check became a row")
        # --append writes the same rows to a file.
        target = os.path.join(d, "results.jsonl")
        subprocess.run([sys.executable, tool, d, "--machine", "H200 (lent)", "--append", target],
                       check=True, capture_output=True)
        appended = [json.loads(l) for l in open(target)]
        if len(appended) != len(rows) or appended[0]["machine"] != "H200 (lent)":
            fail(f"--append wrote {len(appended)} rows ({appended[0]['machine']})")
    print(f"ok: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
