#!/usr/bin/env python3
"""Parse throughput of peppi-py (the Rust peppi parser behind Python) over the same replays as
bench_slp, for a like-for-like ratio. Setup: pip install peppi-py.

Usage: peppi_parse.py [REPLAY_DIR] [--repeats N]
Prints MB/s and frames/s (one thread, best of N passes, files already in the page cache; peppi
reads each file from disk and builds Arrow arrays, so the figure includes that).
"""
import argparse
import pathlib
import sys
import time
from importlib.metadata import version

try:
    import peppi_py
except ImportError:
    sys.exit("peppi-py is not installed: pip install peppi-py")


def main():
    default_dir = pathlib.Path(__file__).resolve().parents[3] / "shared" / "replays"
    ap = argparse.ArgumentParser()
    ap.add_argument("replays", nargs="?", default=str(default_dir))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    paths = sorted(pathlib.Path(args.replays).rglob("*.slp"))
    ok, failed = [], []
    for p in paths:
        try:
            peppi_py.read_slippi(str(p))
            ok.append(p)
        except Exception as e:  # peppi rejects corrupt.slp; count only files it parses
            failed.append((p, e))
    total_bytes = sum(p.stat().st_size for p in ok)
    frames = sum(len(peppi_py.read_slippi(str(p)).frames.id) for p in ok)

    best = best_cpu = float("inf")
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for p in ok:
            peppi_py.read_slippi(str(p))
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, time.process_time() - c0)

    print(f"peppi-py {version('peppi-py')}: {len(ok)} files ({len(failed)} rejected), "
          f"{total_bytes / 1e6:.1f} MB, {frames} frames")
    for p, e in failed:
        print(f"  rejected {p.name}: {e}")
    print(f"best of {args.repeats}: {best * 1e3:.1f} ms  {total_bytes / best / 1e6:.1f} MB/s  "
          f"{frames / best / 1e3:.1f} kframes/s (wall)")
    # On a shared machine CPU time is the steadier figure.
    print(f"best of {args.repeats}: {best_cpu * 1e3:.1f} ms CPU  {total_bytes / best_cpu / 1e6:.1f} MB/s  "
          f"{frames / best_cpu / 1e3:.1f} kframes/s (CPU time)")


if __name__ == "__main__":
    main()
