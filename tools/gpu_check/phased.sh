#!/usr/bin/env bash
# gpu-check in two phases within one time limit, for a GPU machine lent by the quarter hour:
# the bundle unpacked once, then groups whose result does not depend on timing (tests, sanitize,
# train) side by side, each its own gpu-check, then the timed groups (kernels, e2e, peer, profile)
# alone, with what is left of the limit. Each gpu-check writes to $OUT/<name>/ (console.txt,
# steps.tsv, its logs and JSON); the last lines of each are printed at the end.
#
#   GPU_CHECK_PREBUILT=.gpu-carry/prebuilt.tar.xz \
#   PHASE1="a:tests;b:sanitize;c:train" PHASE2="kernels e2e" LIMIT_S=540 \
#     bash tools/gpu_check/phased.sh
#
# PHASE1: NAME:GROUPS entries separated by ';' (run side by side, each at most PHASE1_S
# seconds, default 300); PHASE2: the groups of the last gpu-check; PHASE1_PEER / PHASE2_PEER:
# GPU_CHECK_PEER for each phase (a phase-1 torch.compile fills the compile caches the timed
# phase then reads). Other GPU_CHECK_* variables pass through.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-gpu-out}
T0=$(date +%s)
END=$((T0 + ${LIMIT_S:-540}))
: "${GPU_CHECK_PREBUILT:?the bundle to unpack (make gpu-bundle)}"

# check NAME GROUPS SECONDS BUNDLE: one gpu-check into $OUT/NAME, in a session of its own that
# is ended (TERM, then KILL 5 s later) after SECONDS: everything it started stops with it.
# (`timeout` alone signals only its child: a compute-sanitizer run cut at phase 1's limit went
# on beside phase 2's timed kernels, doubling their times, on an H100.) setsid does not fork
# here (a background job of a shell without job control leads no process group), so $! is the
# session's id.
check() {
  mkdir -p "$OUT/$1"
  OUT=$OUT/$1 GPU_CHECK_PREBUILT=$4 GPU_CHECK_ONLY="$2" \
    setsid bash tools/gpu_check/gpu_check.sh >"$OUT/$1/console.txt" 2>&1 &
  local pid=$!
  (sleep "$3" && kill -TERM -- -$pid && sleep 5 && kill -KILL -- -$pid) >/dev/null 2>&1 &
  local watchdog=$!
  wait $pid
  local rc=$?
  kill $watchdog 2>/dev/null
  echo "[$(($(date +%s) - T0)) s] $1 ($2): rc $rc"
}

# The bundle, unpacked where its binaries expect it; the phases then use that folder.
check unpack none 180 "$GPU_CHECK_PREBUILT"
BUILT=$(cat "$OUT/unpack/build_dir.txt" 2>/dev/null)
[ -d "$BUILT" ] || { echo "phased: the bundle did not unpack (unpack/console.txt)"; exit 1; }

if [ -n "${PHASE1:-}" ]; then
  IFS=';' read -ra entries <<<"$PHASE1"
  for e in "${entries[@]}"; do
    GPU_CHECK_PEER=${PHASE1_PEER:-eager} check "${e%%:*}" "${e#*:}" "${PHASE1_S:-300}" "$BUILT" &
  done
  wait
fi
left=$((END - $(date +%s)))
if [ -n "${PHASE2:-}" ]; then
  if [ $left -gt 30 ]; then
    GPU_CHECK_PEER=${PHASE2_PEER:-eager} check timed "$PHASE2" $left "$BUILT"
  else
    echo "phased: ${left} s left, too little for $PHASE2"
  fi
fi
for d in "$OUT"/*/; do
  echo "== $d"
  # A check its time limit stopped printed no summary: the summary of the steps it finished.
  grep -q '=== gpu-check summary' "$d/console.txt" ||
    python3 tools/gpu_check/summary.py "$d" >>"$d/console.txt" 2>&1
  sed -n '/=== gpu-check summary/,$p' "$d/console.txt"
done
