#!/usr/bin/env bash
# How much of the gradient allreduce the backward pass hides: the same multi-rank CPU run with
# `sync.overlap` on and off, alternating, several repeats; medians of each run's train rows
# (the first row, warm-up, left out) of samples/s and of the allreduce stage's own figures:
# sync/comm_ms (first bucket posted -> last bucket averaged) and sync/exposed_ms (what the
# optimizer waited after the backward pass).
#
#   bench/dist/mpi_overlap.sh [RANKS] [REPEATS] [extra --set args...]
# Defaults: 2 ranks, 3 repeats, the production model's core (d_model 256, 3 layers, d_state 32)
# at batch 16 per rank, window 30, 100 steps, one thread per rank.
set -euo pipefail
ranks=${1:-2}
repeats=${2:-3}
shift $(( $# > 2 ? 2 : $# ))
root=$(cd "$(dirname "$0")/../.." && pwd)
exe=$root/build/bin/slipstream
[ -x "$exe" ] || { echo "build first: make build" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "mpirun not found (apt install openmpi-bin)" >&2; exit 1; }
out=$(mktemp -d /tmp/slipstream-overlap-XXXXXX)
trap 'rm -rf "$out"' EXIT
sets=(--preset cpu_quick --set replays.synthetic_dir="$out/synth" --set core.d_model=256
      --set core.layers=3 --set core.d_state=32 --set replays.batch_size=16
      --set run.runs_dir="$out/runs" --set run.log_every=20 --set run.validate_every=0
      --set run.steps=100 --set ckpt.every=0 --set run.threads=1 --set step.warmup=0 "$@")
for ((r = 1; r <= repeats; r++)); do
  for overlap in true false; do
    mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$exe" run "${sets[@]}" \
      --set sync.overlap=$overlap --set run.name=overlap-$overlap-$r > "$out/log-$overlap-$r.txt" 2>&1 ||
      { cat "$out/log-$overlap-$r.txt" >&2; exit 1; }
  done
done
python3 - "$out/runs" <<'PY'
import glob, json, statistics as st, sys
runs = sys.argv[1]
def figures(overlap):
    per_run = []
    for f in sorted(glob.glob(f"{runs}/overlap-{overlap}-*/metrics.jsonl")):
        rows = [json.loads(l) for l in open(f)]
        train = [r for r in rows if r.get("split") == "train"][1:]
        per_run.append([st.median(r[k] for r in train)
                        for k in ("samples_per_s", "sync/comm_ms", "sync/exposed_ms")])
    return [st.median(x[i] for x in per_run) for i in range(3)], per_run
on, on_runs = figures("true")
off, off_runs = figures("false")
for name, runs_ in (("overlap on ", on_runs), ("overlap off", off_runs)):
    for x in runs_:
        print(f"{name}: {x[0]:8.1f} samples/s  comm {x[1]:7.2f} ms  exposed {x[2]:6.2f} ms")
print(f"median on : {on[0]:.1f} samples/s, exposed {on[2]:.2f} ms of a {on[1]:.1f} ms window")
print(f"median off: {off[0]:.1f} samples/s, exposed {off[2]:.2f} ms (the whole allreduce)")
print(f"hidden by overlap: {100 * (1 - on[2] / off[2]):.0f}% of the allreduce; "
      f"throughput ratio on/off {on[0] / off[0]:.3f}")
PY
