#!/usr/bin/env python3
"""The README's "How fast" table, made from bench/results.jsonl.

Each row of the table names a machine, a shape and the results rows that hold the PyTorch peer's
figures for it (one row per peer mode, each with our figure of the same run). The newest
measurement of those rows (by date, then by position in the file) gives the row: our figure, the
peer's best mode there (its lowest time) and their ratio. Nothing in the table is typed by hand.

    python3 bench/results_table.py            # print the table
    python3 bench/results_table.py --write    # replace the table between README.md's markers
    python3 bench/results_table.py --check    # exit 1 when README.md's table is not the made one
"""
import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- results-table: made by bench/results_table.py from bench/results.jsonl -->"
END = "<!-- results-table end -->"

AVX512_VM = "developer VM: AMD EPYC, 2 cores, 24 GiB, no GPU"
AVX2_VM = "developer VM: AMD EPYC (Zen 3: AVX2, no AVX-512)"

# (where, shape, machine: the results row's machine begins with it, name: a regex of the peer's rows)
TABLE = [
    ("H200, bf16", "gpu_standard step", "NVIDIA H200", r"peer/torch \w+ fused/gpu_standard/bf16"),
    ("H200, bf16", "production, a batch of 256 windows", "NVIDIA H200",
     r"peer/torch \w+ fused/production/bf16"),
    ("H200, bf16", "the scan, forward + backward, gpu_standard", "NVIDIA H200",
     r"peer_kernel/selective_scan_fn/gpu_standard/bf16"),
    ("2-core EPYC (AVX-512), fp32", "cpu_quick step", AVX512_VM, r"peer/torch[^/]*/cpu_quick/fp32"),
    ("2-core EPYC (AVX-512), fp32", "B64 W60 d_model 128, 2 layers", AVX512_VM,
     r"peer/torch[^/]*/cpu_large/fp32"),
    ("2-core EPYC (AVX2 only), fp32", "cpu_quick step", AVX2_VM, r"peer/torch[^/]*/cpu_quick/fp32"),
]

# The peer's mode (the second part of the row's name) as the table says it.
MODES = {
    "torch graph fused": "mamba-ssm's fused kernels, the step as one CUDA graph",
    "torch eager fused": "mamba-ssm's fused kernels, eager",
    "torch.compile (whole step)": "torch.compile",
    "torch.compile (regions)": "torch.compile by regions",
    "torch eager": "eager",
    "selective_scan_fn": "`selective_scan_fn`",
}
UNITS = {"ms": "ms", "us": "µs", "us fwd+bwd": "µs"}


def figure(v):
    """At most 4 significant digits, thousands separated: 1.828, 411.9, 1,225."""
    if v >= 1000:
        return f"{v:,.0f}"
    digits = max(0, 4 - len(str(int(v)))) if v >= 1 else 4
    return f"{v:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{v:.0f}"


def sides(row):
    """(ours, peer) of a results row: the side whose name says "(ours" is ours."""
    base = row.get("baseline") or {}
    if "(ours" in base.get("name", ""):
        return base["value"], row["value"]
    return row["value"], base["value"]


def make_rows(results):
    out = []
    for where, shape, machine, pattern in TABLE:
        name = re.compile(pattern + "$")
        found = [(i, r) for i, r in enumerate(results)
                 if r["machine"].startswith(machine) and name.match(r["name"])
                 and (r.get("baseline") or {}).get("value")]
        if not found:
            raise SystemExit(f"results_table: no row of {machine!r} matches {pattern!r}")
        newest = max((r["date"], i) for i, r in found)
        newest_date = newest[0]
        newest_commit = results[newest[1]]["commit"]
        run = [r for _, r in found if r["date"] == newest_date and r["commit"] == newest_commit]
        best = min(run, key=lambda r: sides(r)[1])  # the peer's best mode: its lowest time
        ours, peer = sides(best)
        unit = UNITS.get(best["unit"], best["unit"])
        mode = MODES.get(best["name"].split("/")[1], best["name"].split("/")[1])
        out.append((where, shape, f"{figure(ours)} {unit}", f"{figure(peer)} {unit}: {mode}",
                    f"{peer / ours:.2f}×", f"{newest_date}, {newest_commit[:7]}"))
    return out


def table(results):
    lines = ["| where | shape | ours | PyTorch's best mode | ratio | measured |",
             "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in make_rows(results)]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(ROOT / "bench" / "results.jsonl"))
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true")
    group.add_argument("--check", action="store_true")
    a = ap.parse_args()
    results = [json.loads(line) for line in open(a.results, encoding="utf-8") if line.strip()]
    made = table(results)
    if not a.write and not a.check:
        sys.stdout.write(made)
        return 0
    text = Path(a.readme).read_text(encoding="utf-8")
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        raise SystemExit(f"results_table: {a.readme} has no {BEGIN!r} ... {END!r}")
    start = b + len(BEGIN) + 1
    if a.check:
        if text[start:e] != made:
            sys.stderr.write(f"results_table: {a.readme}'s table is not the one results.jsonl "
                             f"makes; run python3 bench/results_table.py --write\n"
                             f"--- made:\n{made}--- in the file:\n{text[start:e]}")
            return 1
        return 0
    Path(a.readme).write_text(text[:start] + made + text[e:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
