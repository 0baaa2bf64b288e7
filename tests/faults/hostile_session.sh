#!/usr/bin/env bash
# A hostile session through the `slipstream` command: each way a user or the machine has lost a
# run before, on tiny runs of the real graph. Every scenario checks that no checkpoint, metrics
# row or config is lost and that the message says what happened. Closes with "N passed, M failed"
# and exits non-zero on any failure. About a minute on 2 cores.
#
#   tests/faults/hostile_session.sh SLIPSTREAM_BINARY SOURCE_DIR [WORK_DIR]
set -uo pipefail
BIN=$1
SRC=$2
W=${3:-$(mktemp -d /tmp/slipstream-hostile-XXXXXX)}
rm -rf "$W" && mkdir -p "$W"
export SLIPSTREAM_STATS_DIR=$W/stats
mkdir -p "$SLIPSTREAM_STATS_DIR"

passed=0
failed=0
ok() { echo "PASS $*"; passed=$((passed + 1)); }
bad() { echo "FAIL $*"; failed=$((failed + 1)); }
# check NAME COMMAND...: a scenario's verdict from a condition.
check() {
  local name=$1
  shift
  if "$@"; then ok "$name"; else bad "$name"; fi
}
has() { grep -qF -- "$2" "$1"; }

TINY=(--set replays.batch_size=8 --set replays.window=16 --set replays.stride=16
  --set replays.synthetic=6 --set "replays.synthetic_dir=$W/synth" --set core.d_model=16
  --set core.layers=1 --set core.d_state=8 --set embed.action_dim=8 --set "run.runs_dir=$W/runs"
  --set run.log_every=1000 --set run.validate_every=0 --set run.device=cpu)
GRAPH=$SRC/configs/train_bc.yaml

# A fresh tiny run of STEPS steps checkpointing every EVERY; prints its directory.
fresh_run() {
  local steps=$1 every=$2
  shift 2
  local before after
  before=$(ls "$W/runs" 2>/dev/null)
  "$BIN" run --config "$GRAPH" "${TINY[@]}" --set run.steps="$steps" --set ckpt.every="$every" \
    --set ckpt.keep=100 "$@" >"$W/fresh.log" 2>&1 || { cat "$W/fresh.log" >&2; return 1; }
  after=$(ls "$W/runs")
  comm -13 <(echo "$before") <(echo "$after") | head -1 | sed "s|^|$W/runs/|"
}

# Waits (up to 60 s) until FILE exists.
wait_for() {
  for _ in $(seq 600); do
    [ -e "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

# Runs a long tiny run in the background; sets LONG_PID and LONG_DIR once it is stepping.
start_long_run() {
  local before
  before=$(ls "$W/runs" 2>/dev/null)
  "$BIN" run --config "$GRAPH" "${TINY[@]}" --set run.steps=1000000 --set run.epochs=100000 \
    --set ckpt.every=0 --set run.log_every=1 "$@" >"$W/long.log" 2>&1 &
  LONG_PID=$!
  LONG_DIR=
  for _ in $(seq 600); do
    LONG_DIR=$(comm -13 <(echo "$before") <(ls "$W/runs") | head -1)
    [ -n "$LONG_DIR" ] && [ -s "$W/runs/$LONG_DIR/metrics.jsonl" ] && break
    sleep 0.1
  done
  LONG_DIR=$W/runs/$LONG_DIR
}

echo "== hostile session in $W"
mkdir -p "$W/runs"

# 1. `--resume RUN --preset cpu_quick` (what `make run ARGS="--resume RUN"` did): refused with
#    the differences, the run untouched.
R=$(fresh_run 2 1)
cp "$R/config.yaml" "$W/config.before"
"$BIN" run --resume "$R" --preset cpu_quick --set run.steps=4 >"$W/s1.log" 2>&1
rc=$?
check "resume with another preset is refused (exit 2) with its differences, config.yaml kept" \
  bash -c "[ $rc = 2 ] && grep -q 'core.d_model: 16 -> 64' '$W/s1.log' &&
    cmp -s '$R/config.yaml' '$W/config.before' && [ ! -e '$R/config.previous.yaml' ]"

# 2. A resume whose --set changes the model's shapes: fails before writing anything.
cp "$R/metrics.jsonl" "$W/metrics.before"
"$BIN" run --resume "$R" --set core.d_model=32 --set run.steps=4 >"$W/s2.log" 2>&1
rc=$?
"$BIN" run --resume "$R" --set run.steps=3 >"$W/s2b.log" 2>&1
rc2=$?
check "a resume that does not fit writes nothing; a plain resume then continues" \
  bash -c "[ $rc = 1 ] && ! grep -q 'config.yaml: updated' '$W/s2.log' &&
    [ $rc2 = 0 ] && grep -q 'done: 3 steps' '$W/s2b.log'"

# 3. Rewinding to an older checkpoint moves what came after aside, deleting nothing.
R=$(fresh_run 6 2)
n_before=$(ls "$R/checkpoints" | grep -c '^step-')
rows_before=$(wc -l <"$R/metrics.jsonl")
"$BIN" run --resume "$R/checkpoints/step-2" --set run.steps=4 >"$W/s3.log" 2>&1
aside=$(ls -d "$R"/set-aside/after-step-2-* 2>/dev/null | head -1)
check "a rewind moves later checkpoints and rows into set-aside/, deleting none" \
  bash -c "[ -n '$aside' ] && [ -d '$aside/checkpoints/step-6' ] && [ -d '$aside/checkpoints/step-4' ] &&
    [ \$(( \$(wc -l <'$aside/metrics.jsonl') )) -ge 1 ] && [ -d '$R/checkpoints/step-4' ] &&
    grep -q 'nothing deleted' '$W/s3.log' && [ $n_before = 3 ] &&
    [ \$(( \$(wc -l <'$R/metrics.jsonl') + \$(wc -l <'$aside/metrics.jsonl') )) -ge $rows_before ]"

# 4. `slipstream run ... | head -1`: the reader goes away, the run does not.
before=$(ls "$W/runs")
"$BIN" run --config "$GRAPH" "${TINY[@]}" --set run.steps=20 --set run.log_every=1 2>/dev/null |
  head -1 >/dev/null
rc=${PIPESTATUS[0]}
R=$W/runs/$(comm -13 <(echo "$before") <(ls "$W/runs") | head -1)
check "a closed output pipe costs only the console: exit 0, step-20, end row" \
  bash -c "[ $rc = 0 ] && [ -f '$R/checkpoints/step-20/DONE' ] &&
    tail -1 '$R/metrics.jsonl' | grep -q '\"split\": *\"end\"'"

# 5. The stop signals a terminal, Slurm and a CPU limit send: checkpoint, end row, exit 130.
for sig in HUP USR1 TERM XCPU; do
  start_long_run
  kill -"$sig" "$LONG_PID"
  wait "$LONG_PID"
  rc=$?
  check "SIG$sig stops the run with a checkpoint and the end row naming it (exit 130)" \
    bash -c "[ $rc = 130 ] && ls '$LONG_DIR/checkpoints' | grep -q '^step-' &&
      tail -1 '$LONG_DIR/metrics.jsonl' | grep -q 'interrupted (SIG$sig)'"
done

# 6. Two writers of one run: the second is refused with the first's PID; the first goes on.
start_long_run
"$BIN" run --resume "$LONG_DIR" >"$W/s6.log" 2>&1
rc=$?
kill -INT "$LONG_PID"
wait "$LONG_PID"
rc1=$?
check "a second resume of a running run is refused with the holder's PID" \
  bash -c "[ $rc = 1 ] && grep -q 'in use by process $LONG_PID' '$W/s6.log' && [ $rc1 = 130 ]"

# 7. A fresh run that fails at setup leaves no run directory.
mkdir -p "$W/empty"
before=$(ls "$W/runs" | wc -l)
"$BIN" run --config "$GRAPH" "${TINY[@]}" --set replays.paths="[$W/empty]" >"$W/s7.log" 2>&1
rc=$?
check "a run that fails before its first step leaves no directory" \
  bash -c "[ $rc != 0 ] && [ \$(ls '$W/runs' | wc -l) = $before ]"

# 8. A resume with --set on a full disk (a file-size limit: writes fail as on a full disk).
R=$(fresh_run 2 1)
cp "$R/config.yaml" "$W/config.before"
(
  trap '' XFSZ
  ulimit -f 1
  exec "$BIN" run --resume "$R" --set run.steps=4
) >"$W/s8.log" 2>&1
rc=$?
check "a config that cannot be written: the error names it and errno, config.yaml is whole" \
  bash -c "[ $rc = 1 ] && grep -q 'config.*File too large' '$W/s8.log' &&
    cmp -s '$R/config.yaml' '$W/config.before' && ! ls '$R' | grep -q tmp"

# 9. A YAML alias bomb (12 levels of 9 aliases each): answered at once.
{
  cat "$GRAPH"
  echo "x0: &a0 {k: v}"
  for i in $(seq 12); do
    printf 'x%d: &a%d [' "$i" "$i"
    for j in $(seq 9); do printf '*a%d%s' $((i - 1)) "$([ "$j" = 9 ] || echo ', ')"; done
    echo "]"
  done
} >"$W/bomb.yaml"
timeout 30 "$BIN" validate "$W/bomb.yaml" >"$W/s9.log" 2>&1
rc=$?
check "a YAML alias bomb is a config error in seconds, not an endless check" bash -c "[ $rc = 2 ]"

# 10. A FIFO in place of model.safetensors: refused at once, no blocking open.
R=$(fresh_run 2 1)
rm -f "$R/checkpoints/step-2/model.safetensors"
mkfifo "$R/checkpoints/step-2/model.safetensors"
timeout 30 "$BIN" eval --checkpoint "$R/checkpoints/step-2" --replays "$W/synth" >"$W/s10.log" 2>&1
rc=$?
check "a FIFO as model.safetensors is refused without waiting" \
  bash -c "[ $rc != 124 ] && [ $rc != 0 ] && grep -q 'not a regular file' '$W/s10.log'"

# 11. 50 flipped bytes in a checkpoint's weights: an error naming the damage, never other figures.
R=$(fresh_run 2 1)
f=$R/checkpoints/step-2/model.safetensors
size=$(stat -c %s "$f")
head -c 50 /dev/urandom | dd of="$f" bs=1 seek=$((size - 200)) conv=notrunc status=none
"$BIN" eval --checkpoint "$R/checkpoints/step-2" --replays "$W/synth" >"$W/s11.log" 2>&1
rc=$?
"$BIN" run --resume "$R/checkpoints/step-2" --set run.steps=3 >"$W/s11b.log" 2>&1
rc2=$?
check "flipped bytes in model.safetensors fail eval and resume, naming the damaged tensor" \
  bash -c "[ $rc = 1 ] && grep -q 'does not match its checksum' '$W/s11.log' &&
    [ $rc2 = 1 ] && grep -q 'does not match its checksum' '$W/s11b.log'"

# 12. `replay info` of a folder walks it.
"$BIN" replay info "$W/synth" >"$W/s12.log" 2>&1
rc=$?
check "replay info of a folder reads the replays in it" \
  bash -c "[ $rc = 0 ] && ! grep -q 'is a directory' '$W/s12.log'"

# 13. A virtual memory limit too low for OpenBLAS's buffers: refused at once, not a spin. Not
# under AddressSanitizer (make test-sanitize), whose shadow memory alone maps more address space
# than any such limit allows.
if ldd "$BIN" 2>/dev/null | grep -q libasan; then
  echo "SKIP ulimit -v: the binary is built with AddressSanitizer"
else
  (
    ulimit -v 1200000
    exec timeout 60 "$BIN" run --config "$GRAPH" "${TINY[@]}" --set run.steps=5
  ) >"$W/s13.log" 2>&1
  rc=$?
  check "ulimit -v below what a run maps is refused at start with what to do instead" \
    bash -c "[ $rc = 1 ] && grep -q 'virtual memory limit (ulimit -v)' '$W/s13.log' &&
      grep -q cgroup '$W/s13.log'"
fi

echo "== $W"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && rm -rf "$W"
[ "$failed" = 0 ]
