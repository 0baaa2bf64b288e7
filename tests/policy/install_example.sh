#!/bin/sh
# Installs the policy component of build $1 under $2, builds the installed example with cc and
# pkg-config against the installed files only, and plays two short games with checkpoint $3.
set -eu
build=$1 prefix=$2 run=$3
rm -rf "$prefix"
cmake --install "$build" --prefix "$prefix" --component policy >/dev/null
for f in include/slipstream/policy.h share/slipstream/examples/policy_example.c; do
  test -f "$prefix/$f" || { echo "not installed: $f"; exit 1; }
done
pc=$(ls -d "$prefix"/lib*/pkgconfig | head -n 1)
export PKG_CONFIG_PATH="$pc"
# What pkg-config gives is all a program needs: it starts without LD_LIBRARY_PATH (the .pc file
# carries the rpath), and the installed library names no folder of the build tree.
cc -std=c11 -Wall -Wextra -Werror -o "$prefix/policy_example" \
  "$prefix/share/slipstream/examples/policy_example.c" \
  $(pkg-config --cflags --libs slipstream_policy) -lm
lib=$(ls "$(pkg-config --variable=libdir slipstream_policy)"/libslipstream_policy.so.* | head -n 1)
if readelf -d "$lib" | grep -E 'R(UN)?PATH' | grep -qF "$(cd "$build" && pwd)"; then
  echo "the installed library's RUNPATH names the build tree: $(readelf -d "$lib" | grep PATH)"
  exit 1
fi
out=$(env -u LD_LIBRARY_PATH "$prefix/policy_example" "$run" 120)
echo "$out"
echo "$out" | grep -q "^slipstream policy: .*(step 3)" || { echo "no description line"; exit 1; }
echo "$out" | grep -q "^240 steps: latency p50" || { echo "no latency line"; exit 1; }
