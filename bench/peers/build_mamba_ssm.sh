#!/usr/bin/env bash
# Builds the fused CUDA extensions of mamba-ssm (selective_scan_cuda) and causal-conv1d
# (causal_conv1d_cuda) from their PyPI sdists, for sm_90 (H100) only, on a machine WITHOUT a GPU,
# and packs them with the few Python files the peer benchmark needs into
#   .gpu-carry/mamba_peer.tar.xz
# which is carried to the GPU machine (no network there, torch 2.11.0+cu130 already installed).
#
# Use on the GPU machine (archive members sit at its root, so the folder is a PYTHONPATH entry):
#   mkdir -p /tmp/peer && tar -C /tmp/peer -xJf .gpu-carry/mamba_peer.tar.xz
#   PYTHONPATH=/tmp/peer python3 bench/peers/selective_scan_torch.py --fused --no-compile
# (gpu-check does this with GPU_CHECK_MAMBA_SSM=.gpu-carry/mamba_peer.tar.xz: the kernels checked
# against float64 references, then timed, and the model peer's `--scan fused`).
# then e.g. `from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, mamba_inner_fn`
# and `from causal_conv1d import causal_conv1d_fn`; only torch, einops, triton and packaging are needed.
#
# Pinned: mamba-ssm==2.3.2.post1, causal-conv1d==1.7.0, torch==2.11.0 (PyPI's default build is
# +cu130, the same as on the GPU machine), nvcc 13.0 from /usr/local/cuda, CPython 3.12 (cp312 ABI).
#
# Environment and patches, and why:
#   MAMBA_FORCE_BUILD / CAUSAL_CONV1D_FORCE_BUILD=TRUE  their setup.py otherwise first try to
#       download a prebuilt wheel from GitHub (unreachable here, and not sm_90-only anyway).
#   MAMBA_SKIP_CUDA_BUILD / CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE  only while `pip download` prepares
#       metadata, so that step does not probe nvcc.
#   MAX_JOBS=2  this machine has 2 cores; ninja would otherwise start one nvcc per core+2.
#   TORCH_CUDA_ARCH_LIST=9.0  keeps torch.utils.cpp_extension from adding arch flags of its own
#       (it would guess, with no GPU to query) and silences its warning.
#   CUDA_HOME=/usr/local/cuda  where nvcc 13 and libcudart.so.13 live.
#   sed: setup.py hard-codes -gencode for sm_75/80/87/90/100/103/110/120/121; a line inserted right
#       after that list replaces it with `-gencode arch=compute_90,code=sm_90` only (9x less compile
#       time and binary size). A second sed drops `-lineinfo` (profiler source correlation only, no
#       effect on the generated code) to keep the bundle small; set KEEP_LINEINFO=1 to keep it.
#   No CUDA-version workaround is needed: torch 2.11.0 from PyPI is built for CUDA 13.0, the same
#       major as nvcc 13, so cpp_extension's version check passes and the .so link libcudart.so.13.
#   The build venv gets torch with --no-deps plus only the pure-Python deps it imports and the three
#       NVIDIA libraries that /usr/local/cuda-13.0 lacks (cuSPARSELt, NVSHMEM, cuFile); the other
#       CUDA libraries torch loads come from /usr/local/cuda-13.0 (ldconfig). That is ~0.8 GB of
#       downloads instead of the several GB of the full cuda-toolkit dependency set. triton 3.6.0 (the
#       GPU machine's version) is installed because mamba_ssm's layer_norm imports it at import time.
#       pip then prints "ERROR: pip's dependency resolver ... torch requires cuda-toolkit..., which is
#       not installed": expected with --no-deps, harmless (`import torch` is checked right after).
#   cuobjdump: /usr/local/cuda here has nvcc but no cuobjdump, and PyPI's nvidia-cuda-cuobjdump
#       starts at 13.2 (no 13.0 build); 13.2.51 reads nvcc 13.0's sm_90 cubins fine. It is only
#       used for the arch check, and is linked into the venv's bin/ (which is on PATH).
#
# Idempotent: downloads, the venv, the unpacked and patched sources and the built wheels under
# $PEERBUILD_DIR (default /work/peerbuild, outside the repo) are reused; delete that folder (or
# its wheels/ subfolder) to force a rebuild.
#
# Time on the build machine (2 cores, no GPU): 1,582 s with the venv in place on 2026-11-26
# (causal_conv1d 9 min, selective_scan 16 min), 503 s from an empty $PEERBUILD_DIR on 2026-11-27
# (causal_conv1d 3.3 min, selective_scan 4 min: the same sessions' machines differ); a rerun with
# everything in place takes ~1 min (re-packs and re-checks the bundle). The bundle (15 MB) does
# not fit one call's 64 MiB carry beside prebuilt.tar.xz, replays.tar.xz and the working tree
# (66 MiB with them): gpu-check's peer group gets a call of its own.
#
# Seen on an H100 (2026-11-26): causal-conv1d 1.7.0's backward with SiLU is wrong by ~1 % in dx
# when the length is 1-3 past a multiple of 512 (fp32; 1-7 past 1024 in fp16/bf16): its
# csrc/causal_conv1d_bwd.cu loads the previous chunk's last inputs only under
# `chunk * kChunkSize + i < seqlen`, false for a short last chunk. Our windows (60, 120) are one
# chunk; the kernel is left as published.
#
# Run in the background, e.g.:
#   mkdir -p /work/peerbuild && nohup bash bench/peers/build_mamba_ssm.sh > /work/peerbuild/build.log 2>&1 &
set -euo pipefail

MAMBA_VERSION=2.3.2.post1
CONV_VERSION=1.7.0
TORCH_VERSION=2.11.0
TRITON_VERSION=3.6.0
PY312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python3}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
WORK=${PEERBUILD_DIR:-/work/peerbuild}
OUT_DIR=$REPO/.gpu-carry
OUT=$OUT_DIR/mamba_peer.tar.xz
VENV=$WORK/venv
PY=$VENV/bin/python
DL=$WORK/dl
SRC=$WORK/src
WHEELS=$WORK/wheels
STAGE=$WORK/stage

export PATH=$CUDA_HOME/bin:$VENV/bin:$PATH
export MAX_JOBS=2
export TORCH_CUDA_ARCH_LIST=9.0
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { echo "[$(date +%H:%M:%S) +${SECONDS}s] $*"; }

mkdir -p "$WORK" "$DL" "$SRC" "$WHEELS" "$OUT_DIR"
log "repo=$REPO work=$WORK"
nvcc --version | tail -n 2

# 1. Build venv (CPython 3.12, torch 2.11.0+cu130).
if [ ! -x "$PY" ]; then
  log "creating venv"
  "$PY312" -m venv "$VENV"
fi
if ! "$PY" -c "import torch, triton, einops, ninja, wheel, packaging, sys; sys.exit(torch.__version__ != '$TORCH_VERSION+cu130' or triton.__version__ != '$TRITON_VERSION')" 2>/dev/null \
  || [ ! -x "$VENV/lib/python3.12/site-packages/nvidia/cu13/bin/cuobjdump" ]; then
  log "installing torch==$TORCH_VERSION (no heavy deps) into the venv"
  "$PY" -m pip install --no-deps "torch==$TORCH_VERSION" "triton==$TRITON_VERSION" \
    "nvidia-cusparselt-cu13==0.8.0" "nvidia-nvshmem-cu13==3.4.5" "nvidia-cufile==1.15.1.6.*" \
    "nvidia-cuda-cuobjdump==13.2.51"
  # torch's pure-Python deps; setuptools<82 is torch's own pin and provides build_ext.
  "$PY" -m pip install filelock "typing-extensions>=4.10.0" "setuptools<82" "sympy>=1.13.3" \
    "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" wheel packaging ninja einops numpy
fi
if ! command -v cuobjdump >/dev/null; then
  ln -sf ../lib/python3.12/site-packages/nvidia/cu13/bin/cuobjdump "$VENV/bin/cuobjdump"
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# 2. Sdists. --no-build-isolation: metadata preparation runs their setup.py, which imports torch;
#    an isolated build env would have to fetch torch again (and the system pip has no cp3xx torch).
MAMBA_TGZ=$DL/mamba_ssm-$MAMBA_VERSION.tar.gz
CONV_TGZ=$DL/causal_conv1d-$CONV_VERSION.tar.gz
if [ ! -f "$MAMBA_TGZ" ] || [ ! -f "$CONV_TGZ" ]; then
  log "downloading sdists"
  (cd "$DL" && MAMBA_SKIP_CUDA_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \
    "$PY" -m pip download --no-binary :all: --no-deps --no-build-isolation -d "$DL" \
    "mamba-ssm==$MAMBA_VERSION" "causal-conv1d==$CONV_VERSION")
fi

# 3. Unpack and patch (once per source tree; a marker comment makes the patch idempotent).
MARK="# slipstream: sm_90 only"
unpack_and_patch() {
  local tgz=$1 dir=$2
  if [ ! -d "$dir" ]; then
    tar -C "$SRC" -xzf "$tgz"
  fi
  if ! grep -qF "$MARK" "$dir/setup.py"; then
    sed -i "/^    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI/i\\    cc_flag = [\"-gencode\", \"arch=compute_90,code=sm_90\"]  $MARK" "$dir/setup.py"
    if [ "${KEEP_LINEINFO:-0}" != 1 ]; then
      sed -i '/^ *"-lineinfo",$/d' "$dir/setup.py"
    fi
  fi
  # The override must be there exactly once, at the indentation of the cc_flag list it replaces.
  [ "$(grep -cF "$MARK" "$dir/setup.py")" = 1 ] || { echo "patch failed: $dir/setup.py" >&2; exit 1; }
  grep -nF "$MARK" "$dir/setup.py"
}
MAMBA_SRC=$SRC/mamba_ssm-$MAMBA_VERSION
CONV_SRC=$SRC/causal_conv1d-$CONV_VERSION
unpack_and_patch "$MAMBA_TGZ" "$MAMBA_SRC"
unpack_and_patch "$CONV_TGZ" "$CONV_SRC"

# 4. Build the wheels (in-tree build/ folders keep ninja's objects, so an interrupted build resumes).
build_wheel() {
  local dir=$1 pattern=$2
  if compgen -G "$WHEELS/$pattern" >/dev/null; then
    log "reusing $(ls "$WHEELS"/$pattern)"
    return
  fi
  log "building $(basename "$dir")"
  (cd "$dir" && MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE \
    "$PY" -m pip wheel -v --no-deps --no-build-isolation -w "$WHEELS" .)
  log "built $(ls "$WHEELS"/$pattern)"
}
build_wheel "$CONV_SRC" "causal_conv1d-$CONV_VERSION-*.whl"
build_wheel "$MAMBA_SRC" "mamba_ssm-$MAMBA_VERSION-*.whl"

# 5. Stage the bundle: the two .so, causal_conv1d whole, and only the mamba_ssm modules that
#    mamba_ssm.ops.selective_scan_interface imports (the real mamba_ssm/__init__.py pulls in the
#    models, transformers, tilelang...; here it and the subpackage __init__ files are empty).
log "staging bundle"
rm -rf "$STAGE"
mkdir -p "$STAGE/wheel_mamba" "$STAGE/wheel_conv" "$STAGE/peer"
"$PY" -m zipfile -e "$(ls "$WHEELS"/mamba_ssm-$MAMBA_VERSION-*.whl)" "$STAGE/wheel_mamba"
"$PY" -m zipfile -e "$(ls "$WHEELS"/causal_conv1d-$CONV_VERSION-*.whl)" "$STAGE/wheel_conv"
P=$STAGE/peer
cp "$STAGE"/wheel_mamba/selective_scan_cuda*.so "$STAGE"/wheel_conv/causal_conv1d_cuda*.so "$P/"
strip --strip-unneeded "$P"/*.so
cp -r "$STAGE/wheel_conv/causal_conv1d" "$P/"
M=$STAGE/wheel_mamba/mamba_ssm
for f in ops/selective_scan_interface.py ops/triton/layer_norm.py utils/torch.py utils/determinism.py; do
  mkdir -p "$P/mamba_ssm/$(dirname "$f")"
  cp "$M/$f" "$P/mamba_ssm/$f"
done
for d in . ops ops/triton utils; do
  echo "# Emptied for the slipstream peer bundle: only ops.selective_scan_interface is shipped." \
    > "$P/mamba_ssm/$d/__init__.py"
done
echo "__version__ = \"$MAMBA_VERSION\"" >> "$P/mamba_ssm/__init__.py"
mkdir -p "$P/licenses"
cp "$MAMBA_SRC/LICENSE" "$P/licenses/mamba_ssm.LICENSE"
cp "$CONV_SRC/LICENSE" "$P/licenses/causal_conv1d.LICENSE"
find "$P" -name __pycache__ -prune -exec rm -rf {} +
{
  echo "slipstream peer bundle: mamba-ssm / causal-conv1d fused CUDA extensions, sm_90 only"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m) $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $(ldd --version | head -n 1 | awk '{print $NF}')"
  echo "mamba-ssm: $MAMBA_VERSION (PyPI sdist sha256 $(sha256sum "$MAMBA_TGZ" | cut -d' ' -f1))"
  echo "causal-conv1d: $CONV_VERSION (PyPI sdist sha256 $(sha256sum "$CONV_TGZ" | cut -d' ' -f1))"
  "$PY" -c "import torch, sys; print('torch (built against):', torch.__version__, 'cuda', torch.version.cuda, 'git', torch.version.git_version, 'cxx11abi', torch._C._GLIBCXX_USE_CXX11_ABI); print('python:', sys.version.split()[0], '(cp312 ABI)')"
  echo "nvcc: $(nvcc --version | grep -o 'release [^,]*, V[0-9.]*')"
  echo "host compiler: $(c++ --version | head -n 1)"
  echo "gencode: -gencode arch=compute_90,code=sm_90 only (setup.py patched)$([ "${KEEP_LINEINFO:-0}" = 1 ] || echo ', -lineinfo dropped')"
  echo "needs at runtime: torch 2.11.0+cu130 (libc10, libtorch*, libcudart.so.13), einops, triton, packaging"
  echo "files:"
  (cd "$P" && find . -type f ! -name VERSIONS.txt | sort | sed 's|^\./|  |')
} > "$P/VERSIONS.txt"

tar -C "$P" --sort=name --owner=0 --group=0 --numeric-owner -cJf "$OUT.tmp" .
mv "$OUT.tmp" "$OUT"
log "bundle: $OUT ($(du -h "$OUT" | cut -f1))"

# 6. Checks possible without a GPU.
log "checks"
for so in "$P"/*.so; do
  echo "== $(basename "$so") ($(du -h "$so" | cut -f1))"
  echo "-- cuobjdump --list-elf"
  cuobjdump --list-elf "$so"
  archs=$(cuobjdump --list-elf "$so" | grep -o 'sm_[0-9a-z]*' | sort -u | tr '\n' ' ')
  [ "$archs" = "sm_90 " ] || { echo "unexpected archs in $so: $archs" >&2; exit 1; }
  if cuobjdump --list-ptx "$so" 2>/dev/null | grep -q .; then
    echo "unexpected PTX in $so" >&2
    exit 1
  fi
  echo "-- NEEDED"
  readelf -d "$so" | awk '/NEEDED/ {print "  " $NF}'
  readelf -d "$so" | grep -q 'libcudart.so.13' || { echo "$so does not link libcudart.so.13" >&2; exit 1; }
  echo "-- newest GLIBC / GLIBCXX symbol versions required"
  objdump -T "$so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1
  objdump -T "$so" | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n 1
done

# Import test from a fresh unpack of the archive itself, with the build venv's torch (no GPU here,
# so only imports are tested; calling the kernels needs a GPU: selective_scan_torch.py --fused).
CHK=$(mktemp -d)
trap 'rm -rf "$CHK"' EXIT
tar -C "$CHK" -xJf "$OUT"
(cd "$CHK" && PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$CHK" "$PY" - "$CHK" <<'EOF'
import os, sys
root = sys.argv[1]
import torch
import selective_scan_cuda, causal_conv1d_cuda
from mamba_ssm.ops.selective_scan_interface import selective_scan_fn, mamba_inner_fn
from causal_conv1d import causal_conv1d_fn
for m in (selective_scan_cuda, causal_conv1d_cuda, sys.modules["mamba_ssm"], sys.modules["causal_conv1d"]):
    assert os.path.realpath(m.__file__).startswith(os.path.realpath(root)), m.__file__
print("import OK:", selective_scan_fn.__name__, mamba_inner_fn.__name__, causal_conv1d_fn.__name__)
print("mamba_ssm modules loaded:", sorted(k for k in sys.modules if k.startswith("mamba_ssm")))
print("selective_scan_cuda:", [n for n in dir(selective_scan_cuda) if not n.startswith("_")])
print("causal_conv1d_cuda:", [n for n in dir(causal_conv1d_cuda) if not n.startswith("_")])
EOF
)
log "done in ${SECONDS}s; bundle $OUT ($(du -h "$OUT" | cut -f1))"
