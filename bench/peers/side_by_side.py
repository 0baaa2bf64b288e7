#!/usr/bin/env python3
"""Our training step and the PyTorch peer's (bc_model_torch.py) on the same model, the same
windows and the same thread count, run back to back, alternating, several repeats: medians and
the ratio.

    python3 bench/peers/side_by_side.py [--shape cpu_quick|cpu_large] [--repeats 3] [--json OUT]
    python3 bench/peers/side_by_side.py --device cuda --shape gpu_standard [--precision bf16]

First `slipstream reference-step` writes a batch, the starting weights and their gradients; the
peer must reproduce the loss and gradients (`bc_model_torch.py --check`) before any time counts.
Then, per repeat: `slipstream bench` (steady-state step time, start-up excluded) and the peer's
training loop in each mode: eager; `compile`, torch.compile of the whole step; `compile-regions`,
PyTorch's regional compilation; fp32, or bf16 under torch.autocast with --precision bf16. A
compile mode's first step compiles (or reads torch's compile caches, which later repeats hit):
its time is reported apart, as our start-up is. The results file is rewritten after every
repeat, so a run cut short still leaves the repeats it finished.

`--device cuda` runs both on the GPU (the check too, TF32 off) at the GPU presets' shapes
(gpu_quick, gpu_standard, production). PyTorch comes from the running Python when it has it,
else from a venv this script creates with pip (skipped, with a message, when that fails).
Machines are shared and noisy: compare the ratio, measured in the same run. Both sides run with
glibc's malloc tuned to keep freed memory (`--malloc default` leaves it as is; see MALLOC_ENV).

`--isa avx2` runs both sides at AVX2 on a machine that has AVX-512 (what a laptop or an AVX2-only
server runs): our kernels through SLIPSTREAM_CPU_ISA, OpenBLAS through OPENBLAS_CORETYPE, PyTorch's
ATen, inductor, oneDNN and MKL through their own switches.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The environment that holds each side to one x86-64 level.
ISA_ENV = {
    "native": {},
    "avx2": {"SLIPSTREAM_CPU_ISA": "avx2", "OPENBLAS_CORETYPE": "Haswell",
             "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
# glibc's malloc returns a freed block over its mmap threshold (32 MiB at most) to the kernel, so
# PyTorch's eager loop faults in fresh pages every step: each of the scan loop's steps slices
# (B, D, L, N) tensors, and a slice's backward allocates a zero tensor of the whole shape. At
# cpu_large that put more of the eager step in the kernel than in PyTorch (12 M page faults in
# 3 steps). PyTorch's CPU performance guide has users swap the allocator; glibc's own tunables,
# which keep freed memory in the heap, beat both jemalloc and tcmalloc on this model (eager
# 6.1 -> 1.3 s a step, torch.compile 476 -> 421 ms). Both sides run with them; ours draws its
# tensors from its own pools and does not notice.
MALLOC_ENV = {
    "tuned": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184",
    "default": "",
}
PEER = ROOT / "bench" / "peers" / "bc_model_torch.py"

# The shapes both implementations train: a preset and overrides on top of it.
SHAPES = {
    "cpu_quick": ("cpu_quick", []),
    "cpu_large": ("cpu_quick", ["replays.batch_size=64", "replays.window=60", "core.d_model=128",
                                "core.layers=2"]),
    "gpu_quick": ("gpu_quick", []),
    "gpu_standard": ("gpu_standard", []),
    "production": ("production", []),
}


def torch_python(venv):
    """A Python that imports torch: this one, or the venv's (created on first use)."""
    probe = "import torch, numpy, safetensors"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return sys.executable
    py = pathlib.Path(venv) / "bin" / "python"
    if not py.exists():
        print(f"creating {venv} with torch from PyPI (a few minutes the first time)")
        if subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode != 0:
            return None
    if subprocess.run([str(py), "-c", probe], capture_output=True).returncode != 0:
        pip = [str(py), "-m", "pip", "install", "-q", "torch", "numpy", "safetensors"]
        if subprocess.run(pip).returncode != 0:
            return None
    return str(py)


def run_json(cmd, out):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return json.loads(pathlib.Path(out).read_text())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--slipstream", default=str(ROOT / "build" / "bin" / "slipstream"))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="cpu_quick")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--modes", default="eager,compile,compile-regions",
                    help="peer modes, comma-separated (eager, graph, compile, compile-regions)")
    ap.add_argument("--venv", default=str(ROOT / "build" / "peers-venv"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--isa", choices=sorted(ISA_ENV), default="native",
                    help="hold both sides to this x86-64 level")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where both sides train (the reference step is always the CPU's)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--scan", choices=["loop", "fused"], default="loop",
                    help="the peer's Mamba: mamba-ssm's sequential loop, or its fused kernels "
                    "(mamba_inner_fn; the bundle of build_mamba_ssm.sh on PYTHONPATH; CUDA)")
    ap.add_argument("--malloc", choices=sorted(MALLOC_ENV), default="tuned",
                    help="tuned (default): glibc's malloc keeps freed memory (GLIBC_TUNABLES), "
                    "as PyTorch's CPU tuning advice asks of the allocator; default: glibc as is")
    args = ap.parse_args()
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--repeats and --steps must be >= 1, --warmup >= 0")
    os.environ.update(ISA_ENV[args.isa])  # inherited by both sides' processes
    if MALLOC_ENV[args.malloc]:
        os.environ["GLIBC_TUNABLES"] = ":".join(
            t for t in (os.environ.get("GLIBC_TUNABLES"), MALLOC_ENV[args.malloc]) if t)

    py = torch_python(args.venv)
    if py is None:
        print("skipped: PyTorch is not available (pip install torch failed)")
        return 0
    preset, overrides = SHAPES[args.shape]
    # The peer cannot draw our mirroring and noise: the reference step (and both benchmarks)
    # train without them, as the peer does.
    sets = overrides + ["embed.mirror=false", "embed.noise=0", f"run.threads={args.threads}"]
    set_args = [a for s in sets for a in ("--set", s)]
    work = pathlib.Path(tempfile.mkdtemp(prefix="slipstream-side-by-side-"))
    ref = work / "ref"
    subprocess.run([args.slipstream, "reference-step", "--preset", preset, "--out", str(ref),
                    "--set", "run.precision=fp32", "--set", "run.device=cpu"] + set_args,
                   check=True, capture_output=True)
    device = ["--device", args.device, "--scan", args.scan]
    check = subprocess.run([py, str(PEER), "--check", str(ref)] + device, capture_output=True,
                           text=True)
    print(check.stdout.strip().splitlines()[-1] if check.stdout.strip() else "")
    if check.returncode != 0:
        print(check.stdout + check.stderr)
        print("the peer does not reproduce our loss and gradients: no times reported")
        return 1
    if args.scan == "fused":
        # The fused kernels' rounding needs a tolerance: it must still see a real difference.
        off = subprocess.run([py, str(PEER), "--check", str(ref), "--perturb"] + device,
                             capture_output=True, text=True)
        if off.returncode != 1:
            print(off.stdout + off.stderr)
            print("the check did not fail with D scaled by 1 + 1e-3: it proves nothing, no times")
            return 1
        print("check FAILED with D scaled by 1 + 1e-3, as it must")

    modes = [m for m in args.modes.split(",") if m]
    peer_name = {m: f"torch {m}" + (" fused" if args.scan == "fused" else "") for m in modes}
    times = {"slipstream": []} | {peer_name[m]: [] for m in modes}
    # Start-up apart from the step: ours from its start to the end of its warm-up, a peer's
    # first step (for a compile mode, the compile).
    startup = {name: [] for name in times}
    where = "GPU" if args.device == "cuda" else f"{args.isa}, {args.threads} threads"
    where += f", malloc {args.malloc}"
    for rep in range(args.repeats):
        out = work / f"ours-{rep}.json"
        ours = run_json([args.slipstream, "bench", "--preset", preset, "--steps",
                         str(args.steps), "--warmup", str(args.warmup), "--json", str(out),
                         "--device", args.device, "--set", f"run.precision={args.precision}"]
                        + set_args, out)
        times["slipstream"].append(ours["step_median_ms"])
        startup["slipstream"].append(ours["startup_s"])
        for m in modes:
            out = work / f"torch-{m}-{rep}.json"
            try:
                peer = run_json([py, str(PEER), "--bench", str(ref), "--steps", str(args.steps),
                                 "--warmup", str(args.warmup), "--threads", str(args.threads),
                                 "--mode", m, "--precision", args.precision, "--json", str(out)]
                                + device, out)
                times[peer_name[m]].append(peer["step_ms_median"])
                startup[peer_name[m]].append(peer["first_step_s"])
            except RuntimeError as e:
                print(f"{peer_name[m]}: {str(e).splitlines()[0]}")
        print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(
            f"{k} {v[-1]:.2f} ms" for k, v in times.items() if len(v) > rep), flush=True)
        result = summarize(args, sets, times, startup, rep + 1)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")

    print(f"\n{args.shape}, {where}, {args.precision}, median step of {args.repeats} "
          f"repeats ({args.steps} steps each after {args.warmup} warm-up):")
    print(f"{'implementation':<22} {'step ms':>10} {'ours is':>10} {'start-up s':>12}")
    for name, med in result["median_step_ms"].items():
        up = result["startup_s"][name]
        print(f"{name:<22} {med:>10.2f} {med / result['median_step_ms']['slipstream']:>9.2f}x "
              f"{up[0]:>12.2f}" + (f" (then {', '.join(f'{u:.2f}' for u in up[1:])})"
                                  if len(up) > 1 else ""))
    print("start-up: ours from its start to the end of its warm-up; a peer's first step, which "
          "under a compile mode compiles (later repeats read torch's compile caches)")
    return 0


def summarize(args, sets, times, startup, done):
    """The results so far: medians over the repeats each side finished, ratios to ours."""
    result = {"shape": args.shape, "device": args.device, "precision": args.precision, "scan": args.scan,
              "isa": args.isa, "malloc": args.malloc, "threads": args.threads,
              "repeats": args.repeats, "repeats_done": done, "steps": args.steps,
              "warmup": args.warmup,
              "overrides": sets, "median_step_ms": {}, "speedup": {}, "startup_s": {}}
    ours = statistics.median(times["slipstream"])
    for name, v in times.items():
        if not v:
            continue
        med = statistics.median(v)
        result["median_step_ms"][name] = med
        result["startup_s"][name] = startup[name]
        if name != "slipstream":
            result["speedup"][name] = med / ours
    return result


if __name__ == "__main__":
    sys.exit(main())
