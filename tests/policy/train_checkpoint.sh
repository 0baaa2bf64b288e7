#!/bin/sh
# A tiny trained run at $3/run (and one at frame delay 3 at $3/run_delay) for the policy's C and
# Python tests: train_checkpoint.sh
# SLIPSTREAM SRC DIR. Its loader reads the fields as libmelee does (replays.fields), so the
# libmelee adapter's frames are the ones it trained on.
set -eu
cli=$1 src=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
"$cli" run --config "$src/configs/train_bc.yaml" \
  --set replays.batch_size=8 --set replays.window=16 --set replays.stride=16 \
  --set replays.synthetic=4 --set "replays.synthetic_dir=$dir/synth" --set replays.fields=libmelee \
  --set core.d_model=16 --set core.layers=1 --set core.d_state=8 \
  --set run.steps=3 --set run.validate_every=0 --set run.device=cpu \
  --set "run.runs_dir=$dir/runs" >"$dir/train.log" 2>&1 || { cat "$dir/train.log"; exit 1; }
ln -s "$(ls -d "$dir"/runs/*)" "$dir/run"
# The same at frame delay 3 (replays.delay): the libmelee adapter pairs each state with the input
# sent 3 frames later, as the loader did.
"$cli" run --config "$src/configs/train_bc.yaml" \
  --set replays.batch_size=8 --set replays.window=16 --set replays.stride=16 \
  --set replays.synthetic=4 --set "replays.synthetic_dir=$dir/synth" --set replays.fields=libmelee \
  --set replays.delay=3 --set core.d_model=16 --set core.layers=1 --set core.d_state=8 \
  --set run.steps=3 --set run.validate_every=0 --set run.device=cpu \
  --set "run.runs_dir=$dir/delay_runs" >"$dir/train_delay.log" 2>&1 ||
  { cat "$dir/train_delay.log"; exit 1; }
ln -s "$(ls -d "$dir"/delay_runs/*)" "$dir/run_delay"
