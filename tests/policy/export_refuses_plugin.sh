#!/bin/sh
# `slipstream export --format onnx` of a run whose model has a plugin stage (policy_test_gain
# between the embedding and the temporal model): the ONNX graph cannot hold it, so the export
# is refused naming it and writes nothing, instead of a model that answers otherwise.
# export_refuses_plugin.sh SLIPSTREAM RUN OUT_DIR
set -eu
cli=$1 run=$2 out=$3
rm -rf "$out"
mkdir -p "$out"
if "$cli" export --checkpoint "$run" --format onnx --out "$out/policy.onnx" >"$out/log" 2>&1; then
  cat "$out/log"
  echo "a model with a plugin stage was exported"
  exit 1
fi
cat "$out/log"
grep -q "has stage 'gain' (policy_test_gain), which the export cannot express" "$out/log" ||
  { echo "the refusal does not name the plugin stage"; exit 1; }
test ! -e "$out/policy.onnx" || { echo "a refused export left $out/policy.onnx"; exit 1; }
