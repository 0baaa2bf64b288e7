#!/bin/sh
# torch_check.sh SLIPSTREAM SRC DIR [MODE]: a reference step of a small two-layer graph with a
# hidden head layer and label smoothing, checked by the PyTorch peer in fp64 and fp32, and in
# fp32 under MODE when it names a compile mode (compile, compile-regions). Exit 77 without torch.
set -eu
cli=$1 src=$2 dir=$3 mode=${4:-eager}
python=${PYTHON:-python3}
if ! "$python" -c "import torch, numpy, safetensors" 2>/dev/null; then
  echo "SKIPPED: $python has no torch/numpy/safetensors"
  exit 77
fi
rm -rf "$dir"
"$cli" reference-step --preset cpu_quick --out "$dir" --set core.layers=2 --set core.d_model=32 \
  --set heads.hidden=16 --set loss.label_smoothing=0.1 --set replays.batch_size=8 \
  --set replays.window=12 --set "replays.synthetic_dir=$dir/synth" --set replays.synthetic=4 \
  --set run.threads=2
"$python" "$src/bench/peers/bc_model_torch.py" --check "$dir" --mode "$mode"
