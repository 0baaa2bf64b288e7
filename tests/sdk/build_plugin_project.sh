#!/bin/sh
# The SDK as a user meets it: installs the tools and sdk components of build $1 under $2, writes
# a plugin project with the installed `slipstream new-stage NAME --out DIR`, configures it with
# find_package(slipstream) against the prefix alone, builds it and runs its own tests (the
# installed CLI loading the plugin: schema and gradient check); then a graph that lists the
# plugin trains two steps and a wrong backward fails the gradient check.
set -eu
build=$1 prefix=$2
work="$prefix.work"
rm -rf "$prefix" "$work"
cmake --install "$build" --prefix "$prefix" --component tools >/dev/null
cmake --install "$build" --prefix "$prefix" --component sdk >/dev/null
for f in bin/slipstream share/slipstream/presets/cpu_quick.yaml \
         include/slipstream/sdk/engine/registry.h include/slipstream/sdk/stages/ops/with_ops.h; do
  test -f "$prefix/$f" || { echo "not installed: $f"; exit 1; }
done
test -f "$(ls -d "$prefix"/lib*/cmake/slipstream | head -n 1)/slipstreamConfig.cmake" ||
  { echo "no slipstreamConfig.cmake"; exit 1; }
slip="$prefix/bin/slipstream"
# Presets are found beside the installed binary, from any directory.
(cd / && "$slip" validate cpu_quick >/dev/null)
"$slip" new-stage sdk_gain --out "$work/proj"
cmake -S "$work/proj" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
(cd "$work/build" && ctest --output-on-failure)
plugin="$work/build/libsdk_gain.so"
# The plugin as a stage of a training graph, run by the installed binary for two steps.
cat >"$work/graph.yaml" <<YAML
plugins: [$plugin]
stages:
  - {name: replays, kind: slippi_replays,
     params: {synthetic: 4, synthetic_dir: $work/synth, window: 8, stride: 8, batch_size: 4}}
  - {name: embed, kind: melee_embedding, inputs: [replays]}
  - {name: gain, kind: sdk_gain, inputs: [embed.x]}
  - {name: core, kind: mamba, inputs: [gain], params: {d_model: 16, layers: 1, d_state: 4}}
  - {name: heads, kind: controller_heads, inputs: [core.y]}
  - {name: loss, kind: bc_loss, inputs: [heads, replays, embed]}
  - {name: step, kind: adamw, inputs: [loss]}
  - {name: ckpt, kind: checkpoint, inputs: [step]}
run: {steps: 2, device: cpu, runs_dir: $work/runs, validate_every: 0}
YAML
"$slip" run --config "$work/graph.yaml" >"$work/run.log" 2>&1 || { cat "$work/run.log"; exit 1; }
grep -q "gain" "$work"/runs/*/config.yaml || { echo "the run's config lacks the plugin stage"; exit 1; }
# The installed policy library plays that run: the skeleton's kernel calls (function templates
# of namespace slipstream) resolve against it, as the engine's do.
cmake --install "$build" --prefix "$prefix" --component policy >/dev/null
export PKG_CONFIG_PATH="$(ls -d "$prefix"/lib*/pkgconfig | head -n 1)"
cc -std=c11 -o "$work/policy_example" "$prefix/share/slipstream/examples/policy_example.c" \
  $(pkg-config --cflags --libs slipstream_policy) -lm
"$work/policy_example" "$(ls -d "$work"/runs/*)" 30 >"$work/play.log" 2>&1 ||
  { cat "$work/play.log"; echo "the policy library cannot play the plugin's run"; exit 1; }
# A wrong backward must fail the check the project's tests run.
# (Here: the bias gradient left out.)
sed -i 's/o_.column_sum_accumulate(dy, db,/if (false) o_.column_sum_accumulate(dy, db,/' \
  "$work/proj/sdk_gain.cpp"
grep -q "if (false) o_.column_sum_accumulate" "$work/proj/sdk_gain.cpp" ||
  { echo "the skeleton's backward changed: update this test's wrong backward"; exit 1; }
cmake --build "$work/build" >/dev/null 2>&1
if "$slip" --plugin "$plugin" stage check sdk_gain --input x=4,8; then
  echo "a wrong backward passed the gradient check"; exit 1
fi
echo "sdk: installed, plugin project built and tested against the prefix"
