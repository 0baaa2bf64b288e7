#!/bin/sh
# A tiny trained run at $3/run whose graph names a stage plugin ($2, policy_test_gain between
# the embedding and the temporal model), for the policy library's plugin test:
# train_plugin_checkpoint.sh SLIPSTREAM PLUGIN DIR
set -eu
cli=$1 plugin=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
cat >"$dir/graph.yaml" <<YAML
plugins: [$plugin]
stages:
  - {name: replays, kind: slippi_replays,
     params: {synthetic: 4, synthetic_dir: $dir/synth, window: 16, stride: 16, batch_size: 8}}
  - {name: embed, kind: melee_embedding, inputs: [replays]}
  - {name: gain, kind: policy_test_gain, inputs: [embed.x]}
  - {name: core, kind: mamba, inputs: [gain], params: {d_model: 16, layers: 1, d_state: 8}}
  - {name: heads, kind: controller_heads, inputs: [core.y]}
  - {name: loss, kind: bc_loss, inputs: [heads, replays, embed]}
  - {name: step, kind: adamw, inputs: [loss]}
  - {name: ckpt, kind: checkpoint, inputs: [step]}
run: {steps: 3, device: cpu, runs_dir: $dir/runs, validate_every: 0}
YAML
"$cli" run --config "$dir/graph.yaml" >"$dir/train.log" 2>&1 || { cat "$dir/train.log"; exit 1; }
ln -s "$(ls -d "$dir"/runs/*)" "$dir/run"
