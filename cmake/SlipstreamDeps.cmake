# Every dependency comes from Debian's packages or the CUDA toolkit (see `make deps`).
# SLIPSTREAM_KERNELS_ONLY needs the first group alone (`make gpu-check` on a machine without the
# rest).
find_package(Threads REQUIRED)
find_package(TBB REQUIRED)
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
if(NOT SLIPSTREAM_KERNELS_ONLY)
  find_package(yaml-cpp REQUIRED)
  find_package(CLI11 REQUIRED)
  find_package(nlohmann_json REQUIRED)
  find_package(zstd REQUIRED)
  if(SLIPSTREAM_MPI)
    find_package(MPI REQUIRED COMPONENTS CXX)
  endif()
endif()
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread REQUIRED)
# SLEEF (libsleef-dev): the CPU kernels' vector exp/log1p at AVX2 and AVX-512 width.
find_library(SLEEF_LIBRARY sleef REQUIRED)
find_path(SLEEF_INCLUDE_DIR sleef.h PATH_SUFFIXES x86_64-linux-gnu REQUIRED)
# oneDNN (libdnnl-dev), optional: fp32 GEMMs on AVX-512 CPUs and native bf16 GEMMs on CPUs with
# AVX-512 BF16 or AMX (kernels/gemm_onednn.h). Its CMake package wants OpenCL's headers for a GPU
# runtime we do not use, so the library is found directly.
find_library(DNNL_LIBRARY dnnl)
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
if(DNNL_LIBRARY AND DNNL_INCLUDE_DIR)
  set(SLIPSTREAM_HAS_ONEDNN ON)
else()
  set(SLIPSTREAM_HAS_ONEDNN OFF)
  message(STATUS "slipstream: no oneDNN (libdnnl-dev): the CPU's GEMMs run on OpenBLAS alone")
endif()
if(SLIPSTREAM_KERNELS_ONLY)
elseif(TARGET zstd::libzstd_shared)
  set(SLIPSTREAM_ZSTD zstd::libzstd_shared)
else()
  set(SLIPSTREAM_ZSTD zstd::libzstd_static)
endif()

set(SLIPSTREAM_HAS_CUDA OFF)
if(NOT SLIPSTREAM_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # CMake < 3.26 does not know nvcc's C++20 flag and refuses CMAKE_CUDA_STANDARD 20 ("requires
    # the language dialect CUDA20"); nvcc >= 12 accepts -std=c++20.
    if(CMAKE_VERSION VERSION_LESS 3.26)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    # CUDNN_ROOT / NCCL_ROOT (variables or environment) point at other installs, such as the
    # nvidia-cudnn-cu13 and nvidia-nccl-cu13 Python wheels (which ship only versioned .so files).
    foreach(_lib CUDNN NCCL)
      string(TOLOWER ${_lib} _name)
      set(_roots ${${_lib}_ROOT} $ENV{${_lib}_ROOT})
      find_library(${_lib}_LIBRARY NAMES ${_name} lib${_name}.so.9 lib${_name}.so.2
                   HINTS ${_roots} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
                   PATH_SUFFIXES lib lib64)
      find_path(${_lib}_INCLUDE_DIR ${_name}.h HINTS ${_roots} ${CUDAToolkit_INCLUDE_DIRS}
                PATH_SUFFIXES include)
    endforeach()
    if(NOT CUDNN_LIBRARY OR NOT NCCL_LIBRARY)
      message(FATAL_ERROR "CUDA found but cuDNN or NCCL missing (cudnn=${CUDNN_LIBRARY} nccl=${NCCL_LIBRARY});"
                          " configure with -DSLIPSTREAM_CUDA=OFF for a CPU-only build")
    endif()
    set(SLIPSTREAM_HAS_CUDA ON)
    # Binaries find the toolkit's libraries through RPATH: no LD_LIBRARY_PATH needed.
    get_filename_component(_cudnn_dir ${CUDNN_LIBRARY} DIRECTORY)
    get_filename_component(_nccl_dir ${NCCL_LIBRARY} DIRECTORY)
    set(CMAKE_BUILD_RPATH ${CUDAToolkit_LIBRARY_DIR} ${_cudnn_dir} ${_nccl_dir})
    set(CMAKE_INSTALL_RPATH ${CMAKE_BUILD_RPATH})
    message(STATUS "slipstream: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(SLIPSTREAM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "SLIPSTREAM_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
if(NOT SLIPSTREAM_HAS_CUDA)
  message(STATUS "slipstream: CUDA backend OFF (CPU-only build)")
endif()
