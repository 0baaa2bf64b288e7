#!/usr/bin/env python3
"""bench/results_table.py on made-up results: the newest run of each row, the peer's best mode
in it, which side is ours whichever way a row was written, and --check / --write on a README.
Exits 1 on the first mismatch."""
import json
import os
import subprocess
import sys
import tempfile

H200 = "NVIDIA H200 (lent)"
VM = "developer VM: AMD EPYC, 2 cores, 24 GiB, no GPU"
ZEN3 = "developer VM: AMD EPYC (Zen 3: AVX2, no AVX-512), 2 cores, 24 GiB, no GPU"


def row(date, commit, machine, name, value, unit, base_name, base_value):
    return {"date": date, "commit": commit, "machine": machine, "name": name, "value": value,
            "unit": unit, "baseline": {"name": base_name, "value": base_value}}


def rows():
    ours = "step/gpu_standard/bf16 (ours, same run)"
    out = [
        # An older run, and the newest (two modes: graph is the best).
        row("2026-11-20", "aaaaaaa", H200, "peer/torch graph fused/gpu_standard/bf16", 9.0, "ms",
            ours, 3.0),
        row("2026-11-28", "bbbbbbb", H200, "peer/torch eager fused/gpu_standard/bf16", 16.0, "ms",
            ours, 2.0),
        row("2026-11-28", "bbbbbbb", H200, "peer/torch graph fused/gpu_standard/bf16", 5.0, "ms",
            ours, 2.0),
        row("2026-11-28", "bbbbbbb", H200, "peer/torch graph fused/production/bf16", 18.0, "ms",
            "step/production/bf16 (ours, same run) / 4", 6.0),
        row("2026-11-28", "bbbbbbb", H200, "peer_kernel/selective_scan_fn/gpu_standard/bf16",
            1225.0, "us fwd+bwd", "kernel/scan_forward+backward/bf16/gpu_standard (ours)", 411.9),
        # CPU rows are written the other way round: value ours, baseline the peer.
        row("2026-11-28", "ccccccc", VM, "peer/torch eager/cpu_quick/fp32", 4.0, "ms",
            "torch eager", 48.0),
        row("2026-11-28", "ccccccc", VM, "peer/torch.compile (regions)/cpu_quick/fp32", 4.0, "ms",
            "torch.compile (regions)", 16.0),
        row("2026-11-28", "ccccccc", VM, "peer/torch.compile (whole step)/cpu_quick/fp32", 4.0,
            "ms", "torch.compile (whole step)", 14.0),
        row("2026-11-28", "ccccccc", VM, "peer/torch.compile (regions)/cpu_large/fp32", 50.0, "ms",
            "torch.compile (regions)", 250.0),
        # Another machine's row of the same name is not the AVX-512 machine's.
        row("2026-11-29", "ddddddd", ZEN3, "peer/torch.compile (regions)/cpu_quick/fp32", 12.0,
            "ms", "torch.compile (regions)", 30.0),
    ]
    return out


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def main(tool):
    with tempfile.TemporaryDirectory() as d:
        results = os.path.join(d, "results.jsonl")
        with open(results, "w") as f:
            for r in rows():
                f.write(json.dumps(r) + "\n")
        made = subprocess.run([sys.executable, tool, "--results", results], check=True,
                              capture_output=True, text=True).stdout
        lines = made.splitlines()
        expect = [
            "| H200, bf16 | gpu_standard step | 2 ms | 5 ms: mamba-ssm's fused kernels, the step "
            "as one CUDA graph | 2.50× | 2026-11-28, bbbbbbb |",
            "| H200, bf16 | production, a batch of 256 windows | 6 ms | 18 ms: mamba-ssm's fused "
            "kernels, the step as one CUDA graph | 3.00× | 2026-11-28, bbbbbbb |",
            "| H200, bf16 | the scan, forward + backward, gpu_standard | 411.9 µs | 1,225 µs: "
            "`selective_scan_fn` | 2.97× | 2026-11-28, bbbbbbb |",
            "| 2-core EPYC (AVX-512), fp32 | cpu_quick step | 4 ms | 14 ms: torch.compile | 3.50× | "
            "2026-11-28, ccccccc |",
            "| 2-core EPYC (AVX-512), fp32 | B64 W60 d_model 128, 2 layers | 50 ms | 250 ms: "
            "torch.compile by regions | 5.00× | 2026-11-28, ccccccc |",
            "| 2-core EPYC (AVX2 only), fp32 | cpu_quick step | 12 ms | 30 ms: torch.compile by "
            "regions | 2.50× | 2026-11-29, ddddddd |",
        ]
        if lines[2:] != expect:
            fail("made:\n" + made + "expected:\n" + "\n".join(expect))

        # --check fails on a README whose table differs, --write mends it, --check then passes.
        readme = os.path.join(d, "README.md")
        begin = "<!-- results-table: made by bench/results_table.py from bench/results.jsonl -->"
        with open(readme, "w") as f:
            f.write("# x\n\n" + begin + "\n| an old table |\n<!-- results-table end -->\n\nafter\n")
        args = [sys.executable, tool, "--results", results, "--readme", readme]
        if subprocess.run(args + ["--check"], capture_output=True).returncode != 1:
            fail("--check passed a README whose table is not the made one")
        subprocess.run(args + ["--write"], check=True)
        text = open(readme).read()
        if made not in text or "an old table" in text or not text.endswith("end -->\n\nafter\n"):
            fail("--write did not replace the table alone:\n" + text)
        if subprocess.run(args + ["--check"], capture_output=True).returncode != 0:
            fail("--check failed the table --write made")
        # A row with no results is an error, not an empty line.
        with open(results, "w") as f:
            f.write(json.dumps(rows()[0]) + "\n")
        if subprocess.run([sys.executable, tool, "--results", results],
                          capture_output=True).returncode == 0:
            fail("a table row with no results made a table")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])
