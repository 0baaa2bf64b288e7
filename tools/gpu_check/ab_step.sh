#!/usr/bin/env bash
# The whole training step of two builds on one GPU, alternating: a kernel change measured
# against the build before it in the same call, as docs/kernels.md asks before a change becomes
# the default. Each repeat runs the baseline's bench_e2e, then the candidate's, at each preset;
# the medians of the repeats' step medians and their ratio are printed, and every run's JSON is
# kept in OUT.
#
#   tools/gpu_check/ab_step.sh BASELINE_BIN CANDIDATE_BIN [OUT]
#
# AB_PRESETS (default "gpu_standard production"), AB_PRECISIONS (default bf16), AB_REPEATS
# (default 3). Exits 1 when a run fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
base=$1 cand=$2 out=${3:-${OUT:-build-gpu-out}/ab}
mkdir -p "$out"
presets=${AB_PRESETS:-gpu_standard production}
precisions=${AB_PRECISIONS:-bf16}
repeats=${AB_REPEATS:-3}
rc=0
for r in $(seq "$repeats"); do
  for p in $presets; do
    n=100
    [ "$p" = production ] && n=30 # production's step is 4 batches (accumulation)
    for side in base cand; do
      bin=$base
      [ $side = cand ] && bin=$cand
      "$bin/bench_e2e" --preset "$p" --steps $n --warmup $((n / 5)) --precisions $precisions \
        --json "$out/$side-$p-$r.json" >"$out/$side-$p-$r.log" 2>&1 ||
        { echo "ab_step: $side $p repeat $r failed (its log: $out/$side-$p-$r.log)"; rc=1; }
    done
  done
done
python3 - "$out" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
med = {}
for path in glob.glob(os.path.join(out, "*.json")):
    name = os.path.basename(path)[:-5]
    side, rest = name.split("-", 1)
    preset = rest.rsplit("-", 1)[0]
    for run in json.load(open(path)).get("runs", []):
        med.setdefault((preset, run["precision"], side), []).append(run["step_median_ms"])
print(f"{'preset':<14} {'precision':<10} {'baseline ms':>12} {'candidate ms':>13} {'speedup':>8}  repeats (speedup: baseline over candidate)")
for (preset, prec) in sorted({(p, q) for p, q, _ in med}):
    b, c = med.get((preset, prec, "base"), []), med.get((preset, prec, "cand"), [])
    if b and c:
        mb, mc = statistics.median(b), statistics.median(c)
        print(f"{preset:<14} {prec:<10} {mb:>12.3f} {mc:>13.3f} {mb / mc:>7.3f}x  "
              f"base {', '.join(f'{x:.3f}' for x in b)}; cand {', '.join(f'{x:.3f}' for x in c)}")
EOF
exit $rc
