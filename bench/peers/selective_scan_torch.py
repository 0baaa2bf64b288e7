#!/usr/bin/env python3
"""PyTorch peers of the selective scan: the sequential reference loop of mamba-ssm
(`selective_scan_ref` as bc_model_torch.py writes it: real A, variable B and C, D skip, z gate,
delta bias, softplus), forward plus backward, in eager mode and under torch.compile, on the GPU,
at the same shapes as bench_kernels_cuda. Times are CUDA events, median of repeats after a warm-up.

With --fused, also mamba-ssm's fused CUDA kernels, what people who train Mamba run:
`selective_scan_fn` (the same scan) and causal-conv1d's `causal_conv1d_fn` (depthwise causal
conv + SiLU, our conv1d_silu), forward plus backward, in fp32 and bf16 (bf16 activations; A, D,
the delta bias and the conv weights stay fp32, as in mamba-ssm's model), at every shape. Each is
checked first against the float64 loop (resp. F.conv1d) on the same inputs: the fp32 check fails
above a relative error of 1e-3 (the kernels are built with fast math), and then nothing is timed.
The kernels come from bench/peers/build_mamba_ssm.sh's bundle on PYTHONPATH.

    python3 bench/peers/selective_scan_torch.py [--shape gpu_standard] [--json OUT.json]
    python3 bench/peers/selective_scan_torch.py --fused --no-compile --json OUT.json
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
    ap.add_argument("--fused", action="store_true",
                    help="also mamba-ssm's selective_scan_fn and causal_conv1d_fn, every shape")
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
    rc = 0
    if args.fused:
        result["fused"] = {}
        for shape in sorted(SHAPES):
            try:
                result["fused"][shape] = fused_peers(*SHAPES[shape], selective_scan_loop)
            except ImportError as e:
                result["fused_error"] = f"mamba-ssm's kernels are not importable: {e}"
                break
            if not result["fused"][shape]["checked"]:
                rc = 1
            write(result, args.json)
    print(json.dumps(result, indent=1))
    write(result, args.json)
    return rc


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def fused_peers(batch, L, dim, N, scan_loop):
    """mamba-ssm's selective_scan_fn and causal_conv1d_fn at one shape: the fp32 check against
    float64 references, then fwd+bwd times in fp32 and bf16 (ms)."""
    import torch
    import torch.nn.functional as F
    from causal_conv1d import causal_conv1d_fn
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

    g = torch.Generator(device="cuda").manual_seed(1)

    def rnd(*shape, lo=-1.0, hi=1.0):
        return torch.rand(*shape, device="cuda", generator=g) * (hi - lo) + lo

    K = 4
    base = {"u": rnd(batch, dim, L), "delta": rnd(batch, dim, L), "A": rnd(dim, N, lo=-4, hi=-0.5),
            "B": rnd(batch, N, L), "C": rnd(batch, N, L), "D": rnd(dim),
            "z": rnd(batch, dim, L, lo=-2, hi=2), "bias": rnd(dim, lo=-3, hi=-1),
            "x": rnd(batch, dim, L), "w": rnd(dim, K, lo=-0.5, hi=0.5), "b": rnd(dim)}
    dout = rnd(batch, dim, L)
    act = ("u", "delta", "B", "C", "z", "x")  # the activations: bf16 in the bf16 form

    def leaves(dtype, which):
        return {k: base[k].detach().to(dtype if k in act and dtype != torch.float64 else
                                      (torch.float64 if dtype == torch.float64 else torch.float32))
                .requires_grad_() for k in which}

    scan_keys = ("u", "delta", "A", "B", "C", "D", "z", "bias")
    conv_keys = ("x", "w", "b")

    def scan_fused(t):
        return selective_scan_fn(t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"],
                                 t["bias"], delta_softplus=True)

    def scan_ref(t):
        return scan_loop(t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"], t["z"], t["bias"])

    def conv_fused(t):
        return causal_conv1d_fn(t["x"], t["w"], t["b"], activation="silu")

    def conv_ref(t):
        return F.silu(F.conv1d(t["x"], t["w"][:, None, :], t["b"], padding=K - 1,
                               groups=dim)[..., :L])

    res = {"batch": batch, "L": L, "d_inner": dim, "d_state": N, "d_conv": K, "checked": True}
    for name, keys, fused, ref in (("selective_scan_fn", scan_keys, scan_fused, scan_ref),
                                   ("causal_conv1d_fn", conv_keys, conv_fused, conv_ref)):
        r64 = leaves(torch.float64, keys)
        out64 = ref(r64)
        out64.backward(dout.double())
        for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            t = leaves(dtype, keys)
            out = fused(t)
            out.backward(dout.to(out.dtype))
            errs = {"out": rel_err(out, out64)}
            errs.update({"d" + k: rel_err(t[k].grad, r64[k].grad) for k in keys})
            worst = max(errs.values())
            res[f"{name}/{label}/rel_err"] = worst
            if label == "fp32" and not worst <= 1e-3:  # NaN fails too
                res["checked"] = False
                res[f"{name}/fp32/errors"] = errs
                continue
            ins = list(t.values())

            def run(fused=fused, t=t):
                return fused(t)

            res[f"{name}/{label}/fwd_bwd_ms"] = time_fwd_bwd(
                lambda *_: run(), ins, dout.to(out.dtype), warmup=5, reps=50)
    return res


def write(result, path):
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
