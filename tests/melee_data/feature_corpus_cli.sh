#!/bin/bash
# The feature corpus and bounded memory from the command line: `corpus build --features`, a run
# that reads its games on demand (resident_games: N, and auto under a small memory budget), and
# a resume that continues it as if it had not stopped.
# Usage: feature_corpus_cli.sh SLIPSTREAM WORK_DIR
set -u
BIN=$1
W=$2
rm -rf "$W" && mkdir -p "$W"
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" synth --games 8 --seed 5 --frames 1200 --out "$W/slp" > /dev/null || fail "synth"
"$BIN" corpus build --features --out "$W/fc" "$W/slp" > "$W/build.log" 2>&1 || fail "build"
grep -q "feature corpus $W/fc: 8 games" "$W/build.log" || fail "build report: $(cat "$W/build.log")"
"$BIN" corpus build --features --zstd --out "$W/fc2" "$W/slp" > "$W/zstd.log" 2>&1 &&
  fail "--features with --zstd accepted"
grep -q "drop --zstd" "$W/zstd.log" || fail "--zstd refusal: $(cat "$W/zstd.log")"

common=(--preset cpu_quick --set "replays.paths=[$W/fc]" --set replays.batch_size=8
        --set run.log_every=10 --set ckpt.every=10 --set run.runs_dir="$W/runs")
run_once() {  # NAME STEPS EXTRA...
  local name=$1 steps=$2
  shift 2
  "$BIN" run "${common[@]}" --set run.steps="$steps" "$@" > "$W/$name.log" 2>&1 ||
    fail "$name: $(tail -5 "$W/$name.log")"
}
run_once straight 20 --set replays.resident_games=3
grep -q "games read on demand, at most 3 resident (pools of 1 games" "$W/straight.log" ||
  fail "no on-demand note: $(grep replays "$W/straight.log")"
# auto under a budget of 8.5 games' features: on demand, the 3 that fit 40 % of it
run_once auto 5 --set replays.memory=0.0019
grep -q "games are read on demand, at most 3 in memory (resident_games: auto" "$W/auto.log" ||
  fail "auto: $(grep replays "$W/auto.log")"
# 10 steps, then a resume to 20: the same step-20 loss as the straight run
run_once first 10 --set replays.resident_games=3 --set run.runs_dir="$W/first"
dir=$(ls -d "$W"/first/*/)
"$BIN" run --resume "$dir" --set run.steps=20 > "$W/resumed.log" 2>&1 ||
  fail "resume: $(tail -5 "$W/resumed.log")"
a=$(grep -E "^step 20/20" "$W/straight.log" | sed 's/|.*samples\/s.*//; s/lr [^ ]*//')
b=$(grep -E "^step 20/20" "$W/resumed.log" | sed 's/|.*samples\/s.*//; s/lr [^ ]*//')
[ -n "$a" ] && [ "$a" = "$b" ] || fail "resume differs: '$a' vs '$b'"
echo "ok"
