#!/usr/bin/env bash
# `make gpu-bundle`: packs a gpu-check build made on this machine (build-gpu, sm_90) into one
# archive for a lent GPU machine, so that its minutes go to tests and benchmarks, not to the
# compiler: every binary (stripped), every ctest file, and the shared libraries they load that a
# GPU image may lack (oneTBB, yaml-cpp, OpenBLAS, Open MPI, ...; never the C library, libstdc++
# or CUDA's own). The archive records the absolute build path: test binaries name the tools and
# sources there, so gpu_check.sh unpacks it at that same path (GPU_CHECK_PREBUILT=archive).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-gpu}
ARCHIVE=${2:-.gpu-carry/prebuilt.tar.xz}
[ -x "$B/bin/slipstream" ] || { echo "gpu-bundle: $B/bin/slipstream is missing: build it first" >&2; exit 1; }
BUILD_ABS=$(cd "$B" && pwd)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
root=$STAGE/root
mkdir -p "$root/bin" "$root/bundled-lib"

# Binaries and our own shared libraries, without their symbols.
cp -a "$B/bin/." "$root/bin/"
find "$root/bin" -type f -perm -u+x -exec strip --strip-unneeded {} + 2>/dev/null || true
[ -d "$B/lib" ] && cp -a "$B/lib" "$root/lib" && find "$root/lib" -name '*.so*' -type f -exec strip --strip-unneeded {} +
# ctest's files. The tests are listed here (ctest -N runs each binary's --gtest_list_tests),
# and each discovery include becomes a plain include of its list: the GPU machine's CMake has
# another version, and the stripped binaries would look newer than their lists.
(cd "$B" && ctest -N >/dev/null)
(cd "$B" && find . -name CTestTestfile.cmake -o -name '*_tests.cmake') |
  while read -r f; do mkdir -p "$root/$(dirname "$f")" && cp "$B/$f" "$root/$f"; done
(cd "$B" && find . -name '*_include.cmake') | while read -r f; do
  printf 'include("%s/%s")\n' "$BUILD_ABS/$(dirname "${f#./}")" "$(basename "$f" _include.cmake)_tests.cmake" >"$root/$f"
done

# Shared libraries the binaries load, except the ones every Linux (or the CUDA install) has.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libcudnn|libnccl|libnvidia|libz\.)'
find "$root/bin" "$root/lib" -type f -perm -u+x 2>/dev/null | xargs -r ldd 2>/dev/null |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
    echo "$name" | grep -Eq "$skip" && continue
    cp -L "$path" "$root/bundled-lib/$name"
  done
# Open MPI opens its components by path at MPI_Init; a single-rank run never calls it.
printf '%s\n' "$BUILD_ABS" >"$root/BUILD_PATH"
git describe --always --dirty --abbrev=10 >"$root/COMMIT" 2>/dev/null || true  # -dirty: uncommitted changes
mkdir -p "$(dirname "$ARCHIVE")"
tar -C "$root" -cf - . | xz -T0 -9e >"$ARCHIVE"  # -9e: under the 64 MiB a device call carries
echo "gpu-bundle: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1)) from $BUILD_ABS, $(ls "$root/bundled-lib" | wc -l) libraries"
