#!/usr/bin/env python3
"""PyTorch peer of the selective scan: the sequential reference loop of mamba-ssm
(`selective_scan_ref` as bc_model_torch.py writes it: real A, variable B and C, D skip, z gate,
delta bias, softplus), forward plus backward, in eager mode and under torch.compile, on the GPU,
at the same shapes as bench_kernels_cuda. Times are CUDA events, median of repeats after a warm-up.

    python3 bench/peers/selective_scan_torch.py [--shape gpu_standard] [--json OUT.json]
"""
import argparse
import json
import os
import statistics
import sys

SHAPES = {"gpu_standard": (256, 60, 256, 16), "production": (256, 60, 512, 32)}


def time_fwd_bwd(fn, inputs, dout, warmup=3, reps=20):
    import torch

    for _ in range(warmup):
        out = fn(*inputs)
        out.backward(dout)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        for t in inputs:
            t.grad = None
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(*inputs)
        out.backward(dout)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="gpu_standard", choices=sorted(SHAPES))
    ap.add_argument("--json", help="write the results here as JSON")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("selective_scan_torch: PyTorch is not installed: nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("selective_scan_torch: no CUDA device: nothing measured")
        return 0
    # The model peer's scan: mamba-ssm's sequential reference loop.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bc_model_torch import selective_scan_ref as selective_scan_loop
    batch, L, dim, N = SHAPES[args.shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    dev = "cuda"

    def rnd(*shape, lo=-1.0, hi=1.0, grad=True):
        t = torch.rand(*shape, device=dev, generator=g) * (hi - lo) + lo
        return t.requires_grad_(grad)

    inputs = [rnd(batch, dim, L), rnd(batch, dim, L), rnd(dim, N, lo=-4.0, hi=-0.5),
              rnd(batch, N, L), rnd(batch, N, L), rnd(dim), rnd(batch, dim, L, lo=-2, hi=2),
              rnd(dim, lo=-3.0, hi=-1.0)]
    dout = rnd(batch, dim, L, grad=False)
    result = {"shape": args.shape, "batch": batch, "L": L, "d_inner": dim, "d_state": N,
              "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    result["eager_fwd_bwd_ms"] = time_fwd_bwd(selective_scan_loop, inputs, dout)
    write(result, args.json)  # eager's figure stands even if compiling is cut short
    if not args.no_compile:
        try:
            compiled = torch.compile(selective_scan_loop)
            result["compile_fwd_bwd_ms"] = time_fwd_bwd(compiled, inputs, dout)
        except Exception as e:  # report, do not hide: the summary prints the reason
            result["compile_error"] = f"{type(e).__name__}: {e}"[:300]
    print(json.dumps(result, indent=1))
    write(result, args.json)
    return 0


def write(result, path):
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
