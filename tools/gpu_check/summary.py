#!/usr/bin/env python3
"""Prints `make gpu-check`'s summary from its output folder: each step's status and time, the
GPU kernel benchmarks (time, GB/s against the device's ~3 TB/s), and the scan's speed against
the PyTorch peer, the end-to-end step (ms per step, fp32 against bf16), the data path's
overlap ratio and GPU busy %, the loader's windows/s against threads, and our step against the
PyTorch peer's in each mode, shape and precision run (with the compile times). Exits 1 when any
step failed."""
import csv
import json
import os
import sys

PEAK_GBS = 3000.0  # H100 device-to-device copy, read + write (device/KINDS.md)


def read_json(out, name):
    """$OUT/name parsed, or None when the step that writes it did not run or was stopped while
    writing it (said so)."""
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            print(f"  {name}: not read ({e}): its step stopped while writing it?",
                  file=sys.stderr)
            return None


def side_by_side_results(out):
    """Each side_by_side_<mode>[_<shape>].json of $OUT that was written whole, parsed, in name
    order (gpu_standard's files have no shape in their name)."""
    for fname in sorted(f for f in os.listdir(out)
                        if f.startswith("side_by_side_") and f.endswith(".json")):
        r = read_json(out, fname)
        if r is not None:
            yield r


def print_profiles(out):
    """Each preset's profile (profile_<preset>.csv) that the profile group wrote."""
    for fname in sorted(os.listdir(out)):
        if fname.startswith("profile_") and fname.endswith(".csv"):
            print_profile(out, fname[len("profile_"):-len(".csv")])


def print_profile(out, preset, top=15):
    """The kernels of a preset's profiled steps by total device time (ncu's CSV rows, one per
    launch), with launches and the share of the profiled time."""
    path = os.path.join(out, f"profile_{preset}.csv")
    if not os.path.exists(path):
        return
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    with open(path) as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"\n  profile: no kernel rows in profile_{preset}.csv")
        return
    totals = {}
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        us = float(row["Metric Value"].replace(",", "")) * scale.get(row["Metric Unit"], 1.0)
        name = row["Kernel Name"]
        t, n = totals.get(name, (0.0, 0))
        totals[name] = (t + us, n + 1)
    whole = sum(t for t, _ in totals.values())
    launches = sum(n for _, n in totals.values())
    print(f"\n  profile, {preset}: {launches} kernels, {whole / 1000:.2f} ms on the device")
    print("  kernel                                                        launches   total ms  share")
    for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        short = name if len(name) <= 60 else name[:57] + "..."
        print(f"  {short:<60} {n:>9} {t / 1000:>10.2f} {t / whole:>6.1%}")


def print_operation_times(out, top=15):
    """Each preset's operations as its step's CUDA graph ran them (optimes_<preset>.json:
    `slipstream bench --op-times`), most device time first."""
    for fname in sorted(os.listdir(out)):
        if not (fname.startswith("optimes_") and fname.endswith(".json")):
            continue
        r = read_json(out, fname)
        ops = (r or {}).get("operations")
        if not ops:
            continue
        print(f"\n  operations, {r['preset']} {r['precision']}: {ops['device_ms_per_step']:.3f} ms "
              f"a step on the device in {ops['graphs_timed']} timed graphs "
              f"({ops['untimed_batches']} batches untimed); the step's median without "
              f"time stamps is the e2e group's")
        print("  operation                                    stage         calls/step    us/step  share")
        for op in ops["ops"][:top]:
            print(f"  {op['what'][:44]:<44} {op['stage'][:12]:<12} {op['calls_per_step']:>11.1f} "
                  f"{op['us_per_step']:>10.1f} {op['share_pct']:>5.1f}%")


def print_frame_operation_times(out, top=8):
    """A policy frame's operations on the device (infer_optimes[_FORM].log: `slipstream infer
    --op-times`): its latency line, the device's time a frame and the largest operations."""
    for fname in sorted(os.listdir(out)):
        if not (fname.startswith("infer_optimes") and fname.endswith(".log")) or \
                fname.startswith("infer_optimes_setup"):
            continue
        lines = open(os.path.join(out, fname), errors="replace").read().splitlines()
        at = next((i for i, l in enumerate(lines) if l.startswith("device time a frame")), None)
        if at is None:
            continue
        form = fname[len("infer_optimes"):-len(".log")].lstrip("_") or "default"
        latency = next((l for l in lines if l.startswith("latency per frame")), "")
        print(f"\n  a frame's operations ({form}): {lines[at]}; {latency}")
        for l in lines[at + 1:at + 2 + top]:
            print("  " + l)


def print_loader(out):
    """bench_loader's windows/s (produce) and setup time against threads, per replay set, beside
    what the gpu_standard step consumes (256 windows a step)."""
    r = read_json(out, "bench_loader.json")
    if r is None:
        return
    e2e = read_json(out, "bench_e2e_gpu_standard.json")
    rows = {}
    for b in r.get("benchmarks", []):
        parts = dict(p.split(":", 1) for p in b["name"].split("/")[1:] if ":" in p)
        key = ("synthetic" if parts.get("synthetic") == "1" else "real", int(parts["threads"]))
        if b.get("error_occurred"):
            rows.setdefault(key, {})["error"] = b.get("error_message", "")
        elif b["name"].startswith("BM_Produce"):
            rows.setdefault(key, {})["windows_s"] = b.get("items_per_second", 0.0)
        else:
            rows.setdefault(key, {})["setup_ms"] = b["real_time"]
    print("\n  loader (bench_loader)   threads   windows/s out   setup ms")
    for (which, t), v in sorted(rows.items()):
        if "error" in v:
            print(f"  {which:<22} {t:>8}   skipped: {v['error']}")
            continue
        print(f"  {which:<22} {t:>8} {v.get('windows_s', 0):>15,.0f} {v.get('setup_ms', 0):>10.1f}")
    bf16 = next((x for x in (e2e or {}).get("runs", []) if x.get("precision") == "bf16"), None)
    if bf16 and bf16.get("samples_per_s"):
        print(f"    the gpu_standard bf16 step consumes {bf16['samples_per_s']:,.0f} windows/s")


def main(out):
    steps = []
    with open(os.path.join(out, "steps.tsv")) as f:
        for line in f:
            name, rc, secs = line.rstrip("\n").split("\t")
            steps.append((name, int(rc), int(secs)))
    mode = open(os.path.join(out, "mode.txt")).read().strip() if os.path.exists(
        os.path.join(out, "mode.txt")) else "no"
    print(f"\n=== gpu-check summary: {mode} build ===")
    width = max([24] + [len(name) for name, _, _ in steps])
    for name, rc, secs in steps:
        print(f"  {name:<{width}} {'ok' if rc == 0 else 'FAILED (rc %d)' % rc:<16} {secs:>5} s")
    bench = {}
    kernels = read_json(out, "bench_kernels_cuda.json")
    if kernels is not None:
        for b in kernels.get("benchmarks", []):
            bench[b["name"].split("/manual_time")[0]] = b
        print("\n  kernel                                    time (us)    GB/s   of peak")
        for name, b in bench.items():
            if b.get("error_occurred"):
                print(f"  {name:<40} skipped: {b.get('error_message', '')}")
                continue
            gbs = b.get("GB/s", 0.0)
            # frame_floor/*: the host's wall time, then the device's between its events.
            device = f"   device {b['device_us']:.1f} us" if b.get("device_us") else ""
            print(f"  {name:<40} {b['real_time']:>10.1f} {gbs:>8.0f} {gbs / PEAK_GBS:>8.0%}{device}")
    peer = os.path.join(out, "torch_scan.json")
    if os.path.exists(peer) and bench:
        with open(peer) as f:
            t = json.load(f)
        ours = sum(bench[k]["real_time"] for k in ("scan_forward/fp32/gpu_standard",
                                                   "scan_backward/fp32/gpu_standard") if k in bench)
        if ours > 0:
            print(f"\n  scan fwd+bwd, gpu_standard fp32: ours {ours:.1f} us")
            for key, label in (("eager_fwd_bwd_ms", "PyTorch eager loop"),
                               ("compile_fwd_bwd_ms", "torch.compile loop")):
                if key in t:
                    print(f"    {label:<20} {t[key] * 1000:>10.1f} us  -> ours is {t[key] * 1000 / ours:.1f}x")
            if "compile_error" in t:
                print(f"    torch.compile failed: {t['compile_error']}")
        # mamba-ssm's fused kernels (selective_scan_torch.py --fused), per shape and precision.
        if "fused_error" in t:
            print(f"\n  mamba-ssm's kernels: {t['fused_error']}")
        for shape, f in sorted(t.get("fused", {}).items()):
            if not f.get("checked"):
                print(f"\n  mamba-ssm's kernels at {shape} FAILED their check against float64: "
                      "not timed")
            for ours_op, peer in (("scan", "selective_scan_fn"), ("conv1d_silu", "causal_conv1d_fn")):
                for prec in ("fp32", "bf16"):
                    keys = [f"{ours_op}_{d}/{prec}/{shape}" for d in ("forward", "backward")]
                    theirs = f.get(f"{peer}/{prec}/fwd_bwd_ms")
                    if theirs is None or not all(k in bench for k in keys):
                        continue
                    ours = sum(bench[k]["real_time"] for k in keys)
                    print(f"  {ours_op} fwd+bwd, {shape} {prec}: ours {ours:.1f} us, {peer} "
                          f"{theirs * 1000:.1f} us -> ours is {theirs * 1000 / ours:.2f}x "
                          f"(peer's rel. error vs float64 {f.get(f'{peer}/{prec}/rel_err', 0):.1e})")
    for preset in ("gpu_quick", "gpu_standard", "production"):
        e2e = read_json(out, f"bench_e2e_{preset}.json")
        if e2e is None:
            continue
        runs = e2e.get("runs", [])
        print(f"\n  whole step, {preset}:")
        for r in runs:
            ms = 1000.0 / r["steps_per_s"] if r.get("steps_per_s") else float("nan")
            print(f"    {r['precision']:<12} {ms:>8.2f} ms/step {r['samples_per_s']:>12.0f} samples/s"
                  f"  {r['ratio_to_first']:.2f}x the first")
        for r in runs:
            if r.get("cuda_graph"):
                print(f"      {r['precision']}: {r['cuda_graph']['summary']}")
        by = {r["precision"]: r for r in runs if r.get("steps_per_s")}
        if "bf16" in by and "bf16/nograph" in by:
            print(f"    CUDA graph: {by['bf16']['steps_per_s'] / by['bf16/nograph']['steps_per_s']:.2f}x "
                  "the steps/s without it (bf16)")
    # Kernel forms against each other (each figure its own launch, same call): the scan
    # backward's forward + backward pair with the forward keeping the chunk states against
    # without; its other forms against the default, at both shapes (the names include forms
    # since removed, registers, whole_chunks, split_branches and exact_exp, so that older builds'
    # output still reads; builds where registers was the default name it split); the embedding's
    # table gradients, dense partials against sorted (each a form; sorted is the default).
    def compare(label, base_name, base, cand_name, cand):
        a, b = bench.get(base), bench.get(cand)
        if a and b:
            print(f"\n  {label}: {base_name} {a['real_time']:.1f} us, {cand_name} "
                  f"{b['real_time']:.1f} us: {cand_name} takes "
                  f"{b['real_time'] / a['real_time']:.2f}x the time of {base_name}")
    for dt in ("fp32", "bf16"):
        for shape in ("gpu_standard", "production"):
            compare(f"scan fwd+bwd, {shape} {dt}", "pair", f"scan_fwd_bwd/{dt}/{shape}",
                    "kept states", f"scan_fwd_bwd_kept_states/{dt}/{shape}")
            compare(f"scan forward keeping its states, {shape} {dt}", "default",
                    f"scan_forward_kept_states/{dt}/{shape}", "lean",
                    f"scan_forward_lean/{dt}/{shape}")
        for shape in ("gpu_standard", "production"):
            for other in ("registers", "whole_chunks", "split", "split_branches", "exact_exp",
                          "shared_sums", "shared_whole_chunks", "spread_steps"):
                compare(f"scan backward, {shape} {dt}", "default", f"scan_backward/{dt}/{shape}",
                        other, f"scan_backward_{other}/{dt}/{shape}")
    # A frame's GEMMs: cuBLASLt against the small-row kernel.
    for name in sorted(n for n in bench if n.startswith("gemm_small/cublaslt/")):
        rest = name[len("gemm_small/cublaslt/"):]
        compare(f"GEMM of few rows, {rest}", "cublaslt", name, "warps", f"gemm_small/warps/{rest}")
    # A model's frame: its layers against one launch.
    for name in sorted(n for n in bench if n.startswith("mamba_frame/layers/")):
        rest = name[len("mamba_frame/layers/"):]
        compare(f"Mamba frame, {rest}", "layers", name, "fused", f"mamba_frame/fused/{rest}")
    for shape in ("gpu_standard", "production"):
        compare(f"embedding table gradients, {shape}", "partials",
                f"embed_backward_partials/{shape}", "sorted", f"embed_backward_sorted/{shape}")
    # The GRU graph's step: our per-step layer against cuDNN's stack, in fp32 and bf16, and
    # whether each step ran from a CUDA graph.
    gru = {gb: read_json(out, f"bench_e2e_gru_{gb}.json") for gb in ("kernels", "cudnn")}
    runs = {gb: {r.get("precision"): r for r in (j or {}).get("runs", [])}
            for gb, j in gru.items()}
    for prec in ("fp32", "bf16"):
        step_ms = {gb: 1000.0 / r[prec]["steps_per_s"] for gb, r in runs.items()
                   if r.get(prec, {}).get("steps_per_s")}
        if step_ms:
            print(f"\n  GRU graph step ({prec}): " +
                  ", ".join(f"{gb} {ms:.2f} ms" for gb, ms in step_ms.items()) +
                  (f" -> cudnn is {step_ms['kernels'] / step_ms['cudnn']:.2f}x"
                   if len(step_ms) == 2 else ""))
        for gb, r in runs.items():
            graph = r.get(prec, {}).get("cuda_graph", {}).get("summary")
            if graph:
                print(f"    {gb}: {graph}")
    for gb, r in runs.items():
        if r.get("fp32", {}).get("steps_per_s") and r.get("bf16", {}).get("steps_per_s"):
            print(f"  GRU graph step on {gb}, bf16: "
                  f"{r['bf16']['steps_per_s'] / r['fp32']['steps_per_s']:.2f}x the steps/s of fp32")
    for preset in ("gpu_quick", "gpu_standard"):
        o = read_json(out, f"overlap_{preset}.json")
        if o is None:
            continue
        busy = [r["gpu_busy_pct"] for r in o.get("loading", []) if "gpu_busy_pct" in r]
        print(f"\n  data path, {preset}: {o['loading_steps_per_s']:.1f} steps/s loading, "
              f"{o['resident_steps_per_s']:.1f} on resident batches -> overlap ratio "
              f"{o['overlap_ratio']:.3f} (goal >= 0.97)")
        if busy:
            print(f"    GPU busy while loading: {sum(busy) / len(busy):.1f}% (goal >= 95%)")
        else:
            print("    GPU busy: not measured (NVML did not list the device)")
    print_loader(out)
    for r in side_by_side_results(out):
        ms = r.get("median_step_ms", {})
        done = r.get("repeats_done", r.get("repeats"))
        for name, ratio in r.get("speedup", {}).items():
            # The goals are set at gpu_standard.
            goal = ("; goal >= 3.0x" if name == "torch eager" else "; goal >= 1.5x") \
                if r["shape"] == "gpu_standard" else ""
            up = r.get("startup_s", {}).get(name, [])
            print(f"\n  vs PyTorch, {r['shape']} {r['precision']}: ours {ms.get('slipstream', 0):.2f} ms, "
                  f"{name} {ms.get(name, 0):.2f} ms -> ours is {ratio:.2f}x ({done} of "
                  f"{r.get('repeats')} repeats{goal})")
            if up and name != "torch eager":
                print(f"    {name}'s first step (its compile, or torch's caches): "
                      + ", ".join(f"{u:.1f} s" for u in up))
    print_operation_times(out)
    print_frame_operation_times(out)
    print_profiles(out)
    failed = [n for n, rc, _ in steps if rc != 0]
    print(f"\n  {len(steps) - len(failed)} passed, {len(failed)} failed" +
          (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build-gpu-out"))
