#!/usr/bin/env python3
"""Reads a run directory's TensorBoard event files with TensorBoard's own readers (both its
event accumulators: CRC checks, SessionLog START purges) and checks them against the run's
metrics.jsonl: every number of every row but `step` and `time` is a scalar tagged
`<split>/<key>` at the row's step, holding the row's value as a float32 (NaN/Inf where the row
has null), written at the row's time.

  read_tfevents.py RUN_DIR
  read_tfevents.py --run SLIPSTREAM --work DIR   # first a short real run and a resume of it

Exits 77 (ctest: skipped) when the tensorboard package cannot be imported; `make deps` installs
it, SLIPSTREAM_PYTHON picks the interpreter (a virtual environment's) in ctest."""

import argparse
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_scalars(run_dir):
    """(tag, step) -> (value, time) from metrics.jsonl."""
    out = {}
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            for key, value in row.items():
                if key in ("step", "time", "split") or isinstance(value, (str, bool)):
                    continue
                if value is not None and not isinstance(value, (int, float)):
                    continue
                if value is None and row["split"] == "end":
                    continue
                out[(row["split"] + "/" + key, row["step"])] = (value, row["time"])
    return out


def load_legacy(run_dir):
    """Through event_accumulator: simple_value scalars; any SessionLog START purges."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(run_dir, size_guidance={ea.SCALARS: 0})
    acc.Reload()
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            yield tag, e.step, e.value, e.wall_time


def load_plugin(run_dir):
    """Through plugin_event_accumulator, what `tensorboard --load_fast=false` serves: scalars
    migrated to tensors; only a START after the run's first purges."""
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea
    from tensorboard.util import tensor_util

    acc = pea.EventAccumulator(run_dir, size_guidance={pea.TENSORS: 0})
    acc.Reload()
    for tag in acc.Tags()["tensors"]:
        for e in acc.Tensors(tag):
            yield tag, e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time


def check(run_dir):
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    if not files:
        sys.exit(f"{run_dir}: no events.out.tfevents.* file")
    want = expected_scalars(run_dir)
    for name, load in (("event_accumulator", load_legacy), ("plugin_event_accumulator", load_plugin)):
        got = {}
        for tag, step, value, wall_time in load(run_dir):
            if (tag, step) in got:
                sys.exit(f"{name}: {tag} at step {step} twice")
            got[(tag, step)] = (value, wall_time)
        errors = []
        for key in sorted(set(want) | set(got)):
            if key not in got:
                errors.append(f"{key}: in metrics.jsonl, not in the events files")
                continue
            if key not in want:
                errors.append(f"{key}: in the events files, not in metrics.jsonl")
                continue
            (w, wt), (g, gt) = want[key], got[key]
            same = (not math.isfinite(g)) if w is None else (g == f32(w))
            if not same:
                errors.append(f"{key}: value {g} in the events files, {w} in metrics.jsonl")
            if gt != wt:
                errors.append(f"{key}: written at {gt}, the row's time is {wt}")
        if errors:
            print("\n".join(errors[:40]))
            sys.exit(f"{run_dir}: {name}: {len(errors)} mismatch(es) between the events files "
                     "and metrics.jsonl")
        tags = sorted({t for t, _ in got})
        print(f"{name}: {len(files)} events file(s), {len(got)} scalars under {len(tags)} tags "
              f"match metrics.jsonl")
    print(f"{run_dir}: tags {', '.join(tags)}")
    return tags


def run(cli, work):
    """A short real run, then a resume from an earlier checkpoint past its end: the events files
    then hold steps that metrics.jsonl dropped, which TensorBoard must drop too."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    sets = ["replays.synthetic=4", f"replays.synthetic_dir={work}/synth", "replays.batch_size=8",
            "core.d_model=16", "run.log_every=2", "run.validate_every=4", "run.validate_batches=2",
            "ckpt.every=4", "ckpt.keep=10", f"run.runs_dir={work}/runs"]

    def slipstream(*args):
        cmd = [cli, *args]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            print(p.stdout)
            sys.exit(f"{' '.join(cmd)}: exit {p.returncode}")

    first = ["run", "--preset", "cpu_quick", "--set", "run.steps=10"]
    for s in sets:
        first += ["--set", s]
    slipstream(*first)
    (run_dir,) = glob.glob(os.path.join(work, "runs", "*"))
    slipstream("run", "--resume", os.path.join(run_dir, "checkpoints", "step-4"),
               "--set", "run.steps=14")
    return run_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("run_dir", nargs="?")
    ap.add_argument("--run", metavar="SLIPSTREAM", help="make a run with this binary first")
    ap.add_argument("--work", help="where --run puts its run (replaced)")
    a = ap.parse_args()
    try:
        import tensorboard  # noqa: F401
    except ImportError as e:
        print(f"skipped: the tensorboard package is not importable by {sys.executable} ({e}); "
              "`make deps` installs it, or set SLIPSTREAM_PYTHON to a python that has it")
        sys.exit(77)
    if a.run:
        if not a.work:
            ap.error("--run needs --work")
        run_dir = run(a.run, a.work)
    elif a.run_dir:
        run_dir = a.run_dir
    else:
        ap.error("give RUN_DIR or --run")
    tags = check(run_dir)
    if a.run:
        files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
        if len(files) != 2:
            sys.exit(f"{run_dir}: {len(files)} events files; a run and its resume write 2")
        for t in ("train/loss", "validation/loss"):
            if t not in tags:
                sys.exit(f"{run_dir}: no {t} scalars")


if __name__ == "__main__":
    main()
