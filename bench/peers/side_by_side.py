#!/usr/bin/env python3
"""Our training step and the PyTorch peer's (bc_model_torch.py) on the same model, the same
windows and the same thread count, run back to back, alternating, several repeats: medians and
the ratio.

    python3 bench/peers/side_by_side.py [--shape cpu_quick|cpu_large] [--repeats 3] [--json OUT]
    python3 bench/peers/side_by_side.py --device cuda --shape gpu_standard [--precision bf16]

First `slipstream reference-step` writes a batch, the starting weights and their gradients; the
peer must reproduce the loss and gradients (`bc_model_torch.py --check`) before any time counts.
Then, per repeat: `slipstream bench` (steady-state step time, start-up excluded) and the peer's
training loop in each mode (eager, torch.compile; fp32, or bf16 under torch.autocast with
--precision bf16). `--device cuda` runs both on the GPU (the check too, TF32 off) at the GPU
presets' shapes (gpu_quick, gpu_standard, production). PyTorch comes from the running Python
when it has it, else from a venv this script creates with pip (skipped, with a message, when that
fails). Machines are shared and noisy: compare the ratio, measured in the same run.

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
    ap.add_argument("--modes", default="eager,compile", help="peer modes, comma-separated")
    ap.add_argument("--venv", default=str(ROOT / "build" / "peers-venv"))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--isa", choices=sorted(ISA_ENV), default="native",
                    help="hold both sides to this x86-64 level")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="where both sides train (the reference step is always the CPU's)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = ap.parse_args()
    os.environ.update(ISA_ENV[args.isa])  # inherited by both sides' processes

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
    device = ["--device", args.device]
    check = subprocess.run([py, str(PEER), "--check", str(ref)] + device, capture_output=True,
                           text=True)
    print(check.stdout.strip().splitlines()[-1] if check.stdout.strip() else "")
    if check.returncode != 0:
        print(check.stdout + check.stderr)
        print("the peer does not reproduce our loss and gradients: no times reported")
        return 1

    modes = [m for m in args.modes.split(",") if m]
    times = {"slipstream": []} | {f"torch {m}": [] for m in modes}
    for rep in range(args.repeats):
        out = work / f"ours-{rep}.json"
        ours = run_json([args.slipstream, "bench", "--preset", preset, "--steps",
                         str(args.steps), "--warmup", str(args.warmup), "--json", str(out),
                         "--device", args.device, "--set", f"run.precision={args.precision}"]
                        + set_args, out)
        times["slipstream"].append(ours["step_median_ms"])
        for m in modes:
            out = work / f"torch-{m}-{rep}.json"
            try:
                peer = run_json([py, str(PEER), "--bench", str(ref), "--steps", str(args.steps),
                                 "--warmup", str(args.warmup), "--threads", str(args.threads),
                                 "--mode", m, "--precision", args.precision, "--json", str(out)]
                                + device, out)
                times[f"torch {m}"].append(peer["step_ms_median"])
            except RuntimeError as e:
                print(f"torch {m}: {str(e).splitlines()[0]}")
        print(f"repeat {rep + 1}/{args.repeats}: " + ", ".join(
            f"{k} {v[-1]:.2f} ms" for k, v in times.items() if len(v) > rep))

    ours = statistics.median(times["slipstream"])
    where = "GPU" if args.device == "cuda" else f"{args.isa}, {args.threads} threads"
    print(f"\n{args.shape}, {where}, {args.precision}, median step of {args.repeats} "
          f"repeats ({args.steps} steps each after {args.warmup} warm-up):")
    print(f"{'implementation':<18} {'step ms':>10} {'ours is':>10}")
    result = {"shape": args.shape, "device": args.device, "precision": args.precision,
              "isa": args.isa, "threads": args.threads, "repeats": args.repeats,
              "overrides": sets, "median_step_ms": {}, "speedup": {}}
    for name, v in times.items():
        if not v:
            continue
        med = statistics.median(v)
        result["median_step_ms"][name] = med
        ratio = med / ours
        if name != "slipstream":
            result["speedup"][name] = ratio
        print(f"{name:<18} {med:>10.2f} {ratio:>9.2f}x")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
