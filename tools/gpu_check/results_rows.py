#!/usr/bin/env python3
"""bench/results.jsonl rows from a gpu-check output folder: every figure a lease measured, one
JSON object each (date, commit, machine, name, value, unit, baseline, ratio, command), so that
the figures of a lease become data without copying them by hand.

  python3 tools/gpu_check/results_rows.py OUT [--commit C] [--machine M] [--date D]
                                              [--append bench/results.jsonl]

OUT is gpu-check's folder (or one of phased.sh's $OUT/<name>/ folders: run it once for each).
Rows, where OUT holds their files:
  kernel/<benchmark>                 bench_kernels_cuda.json, us; a kernel's other form (a
                                     variant) has the default form's row as its baseline
  step/<preset>/<precision>          bench_e2e_<preset>.json, ms a step (1000 / steps/s); bf16
                                     against fp32, .../nograph against the graphs
  step/<preset>/<precision>/operations  the CUDA graph's operations a step
  optime/<preset>/<precision>[/<stage>/<operation>]  optimes_<preset>.json (`slipstream bench
                                     --op-times`): the device's us a step in the graph, and in
                                     each operation (calls a step and share in the note)
  gpu_busy/<preset>, overlap/<preset>/steps_per_s_loading  overlap_<preset>.json (the ratio is
                                     the overlap ratio)
  infer/<device>/games:<n>/...       bench_infer_policy.json: p50/p99 us a call and frames/s; the
                                     device's frames/s against one CPU thread's
  peer/<mode>/<shape>/<precision>    side_by_side_*.json: the PyTorch peer's ms a step against
                                     ours
  peer_kernel/<kernel>/<shape>/<precision>  torch_scan.json's fused kernels (those that passed
                                     their check) against ours, forward + backward
A ratio above 1 means the row's value is better than its baseline's (faster, more frames); on
peer rows it says how many times faster ours is.
The commit comes from mode.txt ("prebuilt abc1234") unless given; the machine from the
benchmarks' device unless given. Say which card: pass --machine when OUT does not name it."""
import argparse
import datetime
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summary import read_json, side_by_side_results  # noqa: E402  (gpu-check's readers)

# A kernel benchmark's other forms, and the default form each is timed against.
VARIANTS = [
    (re.compile(r"^scan_backward_(registers|whole_chunks|split|split_branches|exact_exp|shared_sums|shared_whole_chunks|spread_steps)/(.*)$"),
     r"scan_backward/\2"),
    (re.compile(r"^scan_fwd_bwd_kept_states/(.*)$"), r"scan_fwd_bwd/\1"),
    (re.compile(r"^scan_forward_lean/(.*)$"), r"scan_forward_kept_states/\1"),
    (re.compile(r"^embed_backward_sorted/(.*)$"), r"embed_backward_partials/\1"),
    (re.compile(r"^gemm_small/warps/(.*)$"), r"gemm_small/cublaslt/\1"),
    (re.compile(r"^mamba_frame/fused/(.*)$"), r"mamba_frame/layers/\1"),
]


def baseline_of(name):
    for pattern, repl in VARIANTS:
        if pattern.match(name):
            return pattern.sub(repl, name)
    return None


class Rows:
    def __init__(self, date, commit, machine):
        self.date, self.commit, self.machine = date, commit, machine
        self.rows = []

    def add(self, name, value, unit, command, baseline=None, higher_is_better=False, note=None):
        """baseline: (name, value) or None. The ratio says how much better the value is."""
        row = {"date": self.date, "commit": self.commit, "machine": self.machine, "name": name,
               "value": round(value, 4), "unit": unit, "baseline": None, "ratio": None,
               "command": command}
        if baseline is not None and baseline[1] and value:
            row["baseline"] = {"name": baseline[0], "value": round(baseline[1], 4)}
            ratio = value / baseline[1] if higher_is_better else baseline[1] / value
            row["ratio"] = round(ratio, 3)
        if note:
            row["note"] = note
        self.rows.append(row)


def kernel_rows(out, rows):
    r = read_json(out, "bench_kernels_cuda.json")
    if r is None:
        return
    times = {}
    for b in r.get("benchmarks", []):
        if b.get("error_occurred") or b.get("run_type") == "aggregate":
            continue
        times[b["name"].split("/manual_time")[0]] = b
    for name, b in times.items():
        base = baseline_of(name)
        notes = []
        if b.get("GB/s"):
            notes.append(f"{b['GB/s']:.0f} GB/s")
        if b.get("device_us"):  # frame_floor/*: the device's time beside the host's wall time
            notes.append(f"device {b['device_us']:.1f} us")
        if b.get("launches"):  # mamba_frame/*: the frame graph's nodes
            notes.append(f"{b['launches']:.0f} launches")
        rows.add(f"kernel/{name}", b["real_time"], b.get("time_unit", "us"),
                 f"bench_kernels_cuda --benchmark_filter={name} (gpu-check kernels)",
                 (base, times[base]["real_time"]) if base in times else None,
                 note=", ".join(notes) or None)


def step_rows(out, rows):
    for preset in ("gpu_quick", "gpu_standard", "production"):
        r = read_json(out, f"bench_e2e_{preset}.json")
        if r is None:
            continue
        runs = {x.get("precision"): x for x in r.get("runs", []) if x.get("steps_per_s")}
        command = (f"bench_e2e --preset {preset} --precisions fp32 bf16 --without-graph "
                   "(gpu-check e2e)")
        for prec, x in runs.items():
            ms = 1000.0 / x["steps_per_s"]
            base = "bf16" if prec.endswith("/nograph") else ("fp32" if prec == "bf16" else None)
            b = runs.get(base)
            rows.add(f"step/{preset}/{prec}", ms, "ms", command,
                     (f"step/{preset}/{base}", 1000.0 / b["steps_per_s"]) if b else None)
            ops = x.get("cuda_graph", {}).get("operations")
            if ops:
                rows.add(f"step/{preset}/{prec}/operations", ops, "operations", command,
                         note=x["cuda_graph"].get("summary"))


def operation_rows(out, rows):
    for fname in sorted(os.listdir(out)):
        if not (fname.startswith("optimes_") and fname.endswith(".json")):
            continue
        r = read_json(out, fname)
        ops = (r or {}).get("operations")
        if not ops or not ops.get("graphs_timed"):
            continue
        name = f"optime/{r['preset']}/{r['precision']}"
        command = (f"slipstream bench --preset {r['preset']} --steps 30 --warmup 20 --op-times "
                   "(gpu-check profile)")
        rows.add(name, 1000.0 * ops["device_ms_per_step"], "us", command,
                 note=f"the step's device time in its graph, {ops['graphs_timed']} graphs timed")
        for op in ops["ops"]:
            rows.add(f"{name}/{op['stage']}/{op['what']}", op["us_per_step"], "us", command,
                     note=f"{op['calls_per_step']:g} calls a step, {op['share_pct']:.1f} %")


def overlap_rows(out, rows):
    for preset in ("gpu_quick", "gpu_standard"):
        o = read_json(out, f"overlap_{preset}.json")
        if o is None:
            continue
        command = f"slipstream bench --preset {preset} --overlap (gpu-check e2e)"
        # Steps/s while loading against on resident batches: the ratio is the overlap ratio.
        rows.add(f"overlap/{preset}/steps_per_s_loading", o["loading_steps_per_s"], "steps/s",
                 command, (f"overlap/{preset}/steps_per_s_resident", o["resident_steps_per_s"]),
                 higher_is_better=True)
        busy = [x["gpu_busy_pct"] for x in o.get("loading", []) if "gpu_busy_pct" in x]
        if busy:
            rows.add(f"gpu_busy/{preset}", sum(busy) / len(busy), "%", command)


# gpu_check.sh's GPU_CHECK_INFER_FORMS: each form's file (bench_infer_FORM.json) and switches.
INFER_FORMS = {
    "small_gemm": "SLIPSTREAM_SMALL_GEMM=warps",
    "fused_frame": "SLIPSTREAM_MAMBA_FRAME=fused",
    "fused_frame_small_gemm": "SLIPSTREAM_MAMBA_FRAME=fused SLIPSTREAM_SMALL_GEMM=warps",
}


def infer_rows(out, rows):
    r = read_json(out, "bench_infer_policy.json")
    if r is None:
        return
    cpu, device = {}, {}
    for b in r.get("benchmarks", []):
        if b.get("error_occurred") or b.get("run_type") == "aggregate":
            continue
        m = re.match(r"BM_PolicyStepBatch(OnDevice)?/games:(\d+)(/threads:(\d+))?", b["name"])
        if not m or (not m.group(1) and m.group(4) not in (None, "1")):
            continue
        (device if m.group(1) else cpu)[int(m.group(2))] = b
    command = "bench_infer --benchmark_filter=PolicyStepBatch (gpu-check infer)"
    for where, runs in (("cpu", cpu), ("device", device)):
        for n, b in sorted(runs.items()):
            name = f"infer/{where}/games:{n}"
            for q in ("p50_us", "p99_us"):
                if q in b:
                    rows.add(f"{name}/{q[:3]}", b[q], "us a call", command)
            if "frames_per_s" in b:
                base = cpu.get(n) if where == "device" else None
                rows.add(f"{name}/frames_per_s", b["frames_per_s"], "frames/s", command,
                         (f"infer/cpu/games:{n}/frames_per_s", base["frames_per_s"])
                         if base and "frames_per_s" in base else None, higher_is_better=True)
    # The device's frames in the other forms (GPU_CHECK_INFER_FORMS) against the default's, the
    # same call.
    for form, switches in INFER_FORMS.items():
        runs = read_json(out, f"bench_infer_{form}.json")
        command = f"{switches} bench_infer --benchmark_filter=PolicyStepBatchOnDevice (gpu-check infer)"
        for b in (runs or {}).get("benchmarks", []):
            m = re.match(r"BM_PolicyStepBatchOnDevice/games:(\d+)", b.get("name", ""))
            if not m or b.get("error_occurred") or b.get("run_type") == "aggregate":
                continue
            n, base = int(m.group(1)), device.get(int(m.group(1)), {})
            name = f"infer/device_{form}/games:{n}"
            if "p50_us" in b:
                rows.add(f"{name}/p50", b["p50_us"], "us a call", command,
                         (f"infer/device/games:{n}/p50", base["p50_us"])
                         if "p50_us" in base else None)
            if "frames_per_s" in b:
                rows.add(f"{name}/frames_per_s", b["frames_per_s"], "frames/s", command,
                         (f"infer/device/games:{n}/frames_per_s", base["frames_per_s"])
                         if "frames_per_s" in base else None, higher_is_better=True)


def peer_rows(out, rows):
    for r in side_by_side_results(out):
        ms = r.get("median_step_ms", {})
        ours = ms.get("slipstream")
        for mode in r.get("speedup", {}):
            if mode in ms and ours:
                rows.add(f"peer/{mode}/{r['shape']}/{r['precision']}", ms[mode], "ms",
                         f"bench/peers/side_by_side.py --device cuda --shape {r['shape']} "
                         f"--precision {r['precision']} (gpu-check peer)",
                         (f"step/{r['shape']}/{r['precision']} (ours, same run)", ours),
                         higher_is_better=True,
                         note=f"{r.get('repeats_done', r.get('repeats'))} repeats; the ratio: "
                              "ours is that many times faster")


def peer_kernel_rows(out, rows):
    """mamba-ssm's and causal-conv1d's fused kernels (torch_scan.json's `fused`, checked against
    float64 first) against ours in the same call: forward + backward."""
    t = read_json(out, "torch_scan.json")
    k = read_json(out, "bench_kernels_cuda.json")
    if t is None or k is None:
        return
    ours_us = {b["name"].split("/manual_time")[0]: b["real_time"]
               for b in k.get("benchmarks", []) if not b.get("error_occurred")}
    for shape, f in sorted(t.get("fused", {}).items()):
        if not f.get("checked"):
            continue  # failed its check: not a figure
        for op, peer in (("scan", "selective_scan_fn"), ("conv1d_silu", "causal_conv1d_fn")):
            for prec in ("fp32", "bf16"):
                theirs = f.get(f"{peer}/{prec}/fwd_bwd_ms")
                keys = [f"{op}_{d}/{prec}/{shape}" for d in ("forward", "backward")]
                if theirs is None or not all(x in ours_us for x in keys):
                    continue
                rows.add(f"peer_kernel/{peer}/{shape}/{prec}", theirs * 1000.0, "us fwd+bwd",
                         "bench/peers/selective_scan_torch.py --fused (gpu-check peer)",
                         (f"kernel/{op}_forward+backward/{prec}/{shape} (ours, same call)",
                          sum(ours_us[x] for x in keys)),
                         higher_is_better=True, note="the ratio: ours is that many times faster")


def commit_of(out):
    path = os.path.join(out, "mode.txt")
    if os.path.exists(path):
        m = re.search(r"prebuilt ([0-9a-f]{7,40})", open(path).read())
        if m:
            return m.group(1)
    return "unknown"


def machine_of(out):
    for preset in ("gpu_standard", "gpu_quick", "production"):
        r = read_json(out, f"bench_e2e_{preset}.json")
        for x in (r or {}).get("runs", []):
            if x.get("device"):
                return x["device"]
    return "unknown GPU (pass --machine)"


def rows_of(out, date, commit=None, machine=None):
    rows = Rows(date, commit or commit_of(out), machine or machine_of(out))
    for f in (kernel_rows, step_rows, operation_rows, overlap_rows, infer_rows, peer_rows, peer_kernel_rows):
        f(out, rows)
    return rows.rows


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--commit")
    p.add_argument("--machine")
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    p.add_argument("--date", default=today)
    p.add_argument("--append", help="bench/results.jsonl to append to (else printed)")
    a = p.parse_args(argv)
    rows = rows_of(a.out, a.date, a.commit, a.machine)
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    if a.append:
        with open(a.append, "a") as f:
            f.write(lines)
        print(f"{len(rows)} rows appended to {a.append}")
    else:
        sys.stdout.write(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
