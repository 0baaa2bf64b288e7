#!/usr/bin/env python3
"""Runs compute-sanitizer's racecheck on a test binary and judges our kernels only.

Usage: racecheck_ours.py COMPUTE_SANITIZER_ARGS... (everything after the script's name is the
command, e.g. `compute-sanitizer --tool racecheck bin/kernel_ops_gpu_test --gtest_filter=...`).

Fails when the tests fail, when the sanitizer breaks down, or when a hazard is reported in one of
our kernels (their names hold `slipstream`: every kernel of ours is in that namespace). Hazards in
the libraries' kernels (cuBLAS's nvjet split-K GEMMs on an H200, say) are counted and listed, not
failed: they are the vendor's to answer for. Filtering those kernels out with the sanitizer's own
--kernel-name option is no way round: with it, cuBLASLt's bf16 GEMMs failed to launch on an H200.
"""
import collections
import re
import subprocess
import sys

HAZARD = re.compile(r"Race reported between .*? access at (.+?)\+0x[0-9a-f]+\s+and .*? access at (.+?)\+0x")


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    text = []
    for line in proc.stdout:
        sys.stdout.write(line)
        text.append(line)
    rc = proc.wait()
    # A hazard report spans two lines: "Error: Race reported between X at K+0x.." and "and ...".
    joined = re.sub(r"\n=+\s+and ", " and ", "".join(text))
    ours, theirs = collections.Counter(), collections.Counter()
    for m in HAZARD.finditer(joined):
        for kernel in {m.group(1).strip(), m.group(2).strip()}:
            (ours if "slipstream" in kernel else theirs)[kernel] += 1
    broke = "Internal Sanitizer Error" in joined
    print("\nracecheck, our kernels:", "no hazard" if not ours else f"{sum(ours.values())} hazards")
    for kernel, n in ours.most_common():
        print(f"  {n:4d}  {kernel}")
    if theirs:
        print("racecheck, library kernels (not ours, not failed):")
        for kernel, n in theirs.most_common():
            print(f"  {n:4d}  {kernel}")
    if broke:
        print("racecheck: the sanitizer itself failed (Internal Sanitizer Error)")
    if rc != 0:
        print(f"racecheck: the tests exited {rc}")
    return 1 if ours or broke or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
