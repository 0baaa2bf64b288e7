# slipstream — `make run` and `make test` work on a fresh Debian machine (root, or sudo).
PRESET ?= cpu_quick
ARGS ?=
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

# Debian packages the build and tests need; `make deps` installs only the missing ones.
DEB_PACKAGES := build-essential cmake ninja-build pkg-config git \
  libtbb-dev libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev \
  nlohmann-json3-dev libopenblas-dev libopenmpi-dev openmpi-bin libzstd-dev \
  zlib1g-dev libcairo2-dev libprotobuf-dev protobuf-compiler libsleef-dev libdnnl-dev libonnx-dev \
  python3 python3-numpy python3-pip python3-setuptools python3-wheel tmux
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build run test test-sanitize bench format clean gpu-check gpu-deps gpu-bundle gpu-ab-base gpu-peer-bundle

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	  | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing $$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "make deps: all Debian packages present"; fi
	@python3 -c 'import safetensors, numpy' 2>/dev/null || python3 -m pip install -q safetensors numpy 2>/dev/null \
	  || echo "make deps: python safetensors unavailable; the checkpoint interop test will skip"
	@python3 -c 'import setuptools, wheel' 2>/dev/null || python3 -m pip install -q setuptools wheel 2>/dev/null \
	  || echo "make deps: python setuptools/wheel unavailable; the Python package's wheel test will fail"
	@python3 -c 'import melee' 2>/dev/null || python3 -m pip install -q melee 2>/dev/null \
	  || echo "make deps: libmelee (PyPI melee) unavailable; the libmelee adapter test will skip"
	@python3 -c 'import onnxruntime' 2>/dev/null || python3 -m pip install -q onnxruntime 2>/dev/null \
	  || echo "make deps: onnxruntime unavailable; the ONNX export's run under it will skip"
	@python3 -c 'import tensorboard' 2>/dev/null || python3 -m pip install -q tensorboard 2>/dev/null \
	  || echo "make deps: python tensorboard unavailable; the TensorBoard read-back test will skip"

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

# The tools and libraries; tests and benchmarks build with `make test` and `make bench`.
build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Real replays beside the checkout when present; otherwise the loader generates synthetic ones.
REPLAYS ?= $(if $(wildcard ../shared/replays),../shared/replays,)

# A resume (ARGS="--resume RUN ...") continues with the run's own config.yaml: no preset, no paths.
run: build
	$(BUILD_DIR)/bin/slipstream run $(if $(findstring --resume,$(ARGS)),,--preset $(PRESET) \
	  $(if $(REPLAYS),--set 'replays.paths=[$(REPLAYS)]')) $(ARGS)

test: build
	cmake --build $(BUILD_DIR) -j $(JOBS) --target slipstream_tests
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900 -LE slow

# AddressSanitizer + UBSan build of the tests (CPU code) in $(SANITIZE_DIR). SANITIZE_TESTS names
# test binaries to build and run (CI runs such a reduced set); left empty, every test via ctest.
# SANITIZE_OPT: the optimisation level (-O1 builds the instrumented code about twice as fast; -O3,
# the default, runs the emulated kernel tests of the whole suite faster).
SANITIZE_DIR ?= build-sanitize
SANITIZE_TESTS ?=
SANITIZE_OPT ?= -O3
test-sanitize: deps
	cmake -S . -B $(SANITIZE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIPSTREAM_SANITIZE=ON \
	  -DSLIPSTREAM_CUDA=OFF "-DCMAKE_CXX_FLAGS_RELEASE=$(SANITIZE_OPT) -DNDEBUG" $(CMAKE_FLAGS)
ifeq ($(strip $(SANITIZE_TESTS)),)
	cmake --build $(SANITIZE_DIR) -j $(JOBS) --target slipstream_tests
	cd $(SANITIZE_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 1800 -LE slow
else
	cmake --build $(SANITIZE_DIR) -j $(JOBS) --target $(SANITIZE_TESTS)
	@for t in $(SANITIZE_TESTS); do echo "== $$t (ASan+UBSan)"; \
	  ASAN_OPTIONS=allocator_may_return_null=1 $(SANITIZE_DIR)/bin/$$t --gtest_brief=1 || exit 1; done
endif

# Google Benchmark binaries (bench/*): each prints its table; pass e.g. ARGS=--benchmark_format=json.
bench: build
	cmake --build $(BUILD_DIR) -j $(JOBS) --target slipstream_benchmarks
	@for b in $(BUILD_DIR)/bin/bench_*; do echo "== $$b"; $$b $(ARGS) || exit 1; done

# On a lent GPU machine: build for sm_90, gpu tests, sanitizers, GPU benchmarks, one summary
# (tools/gpu_check/gpu_check.sh). Needs no internet; `make gpu-deps` (here) fetches the Debian
# packages such a machine may lack into .gpu-deps/, to be carried along.
gpu-check:
	bash tools/gpu_check/gpu_check.sh

# A build for sm_90 made here, packed for a GPU machine (.gpu-carry/prebuilt.tar.xz, and
# ../shared/replays as .gpu-carry/replays.tar.xz for gpu-check's gpu_quick run; carry .gpu-carry
# and run GPU_CHECK_PREBUILT=.gpu-carry/prebuilt.tar.xz make gpu-check there).
gpu-bundle: deps
	cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLIPSTREAM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
	  -DSLIPSTREAM_ONNX=OFF
	cmake --build build-gpu -j $(JOBS) --target all slipstream_tests slipstream_benchmarks
	bash tools/gpu_check/bundle.sh build-gpu .gpu-carry/prebuilt.tar.xz
	if [ -d ../shared/replays ]; then tar -C ../shared -cf - replays | xz -9 >.gpu-carry/replays.tar.xz; fi

# build-gpu's bench_e2e as it is, before the bundle is remade from a change
# (.gpu-carry/ab_base_bench_e2e.xz): gpu-check's GPU_CHECK_AB=build times the new bundle's whole
# step against it, alternating, with GPU_CHECK_AB_BASE=.gpu-carry/ab_base_bench_e2e.xz.
gpu-ab-base:
	xz -6 -T0 -c build-gpu/bin/bench_e2e >.gpu-carry/ab_base_bench_e2e.xz

# mamba-ssm's and causal-conv1d's fused kernels for the PyTorch peer, built here for sm_90
# (.gpu-carry/mamba_peer.tar.xz, 8-27 min on 2 cores; GPU_CHECK_MAMBA_SSM names it there).
gpu-peer-bundle:
	bash bench/peers/build_mamba_ssm.sh

gpu-deps:
	mkdir -p .gpu-deps && cd .gpu-deps && apt-get download $$(grep -v '^#' ../tools/gpu_check/debs.txt)

format:
	git ls-files '*.h' '*.c' '*.cpp' '*.cu' '*.cuh' '*.inc' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR)
