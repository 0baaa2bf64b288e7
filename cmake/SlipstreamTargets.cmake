# Project-wide compile flags and the helpers every folder uses to declare targets and tests.
set(SLIPSTREAM_WARNINGS -Wall -Wextra -Werror)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # GCC 12 at -O3 reports false positives inside libstdc++'s std::string/std::variant
  # (GCC bugs 105329, 105651, 107138); they stay visible as warnings.
  list(APPEND SLIPSTREAM_WARNINGS -Wno-error=restrict -Wno-error=maybe-uninitialized
                                  -Wno-error=array-bounds -Wno-error=stringop-overflow)
endif()
if(SLIPSTREAM_SANITIZE)
  # vptr is off: oneTBB's flow graph downcasts a task after running its destructor, only to hand
  # the memory back to its allocator (graph_task::destruct_and_deallocate); UBSan flags that cast.
  add_compile_options(-fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined -fno-sanitize=vptr)
endif()

# slipstream_warnings(target): our own code builds warning-free.
function(slipstream_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${SLIPSTREAM_WARNINGS}>
                                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
endfunction()

# slipstream_add_test(NAME SOURCES a.cpp ... LIBS x y LABELS unit [ENV k=v])
# One GoogleTest binary; each TEST becomes its own ctest entry. A GTEST_SKIP is reported
# by ctest as skipped, not passed.
function(slipstream_add_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  slipstream_warnings(${name})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    SLIPSTREAM_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    SLIPSTREAM_BINARY_DIR="${CMAKE_BINARY_DIR}")
  set(_props LABELS "${T_LABELS}" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  if(T_ENV)
    list(APPEND _props ENVIRONMENT "${T_ENV}")
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR} PROPERTIES ${_props})
endfunction()
include(GoogleTest)

# slipstream_add_test_plugin(name source): a stage plugin for tests, built as a module in lib/
# that resolves the engine's symbols from whoever loads it (an executable exporting them, or
# libslipstream_policy).
function(slipstream_add_test_plugin name source)
  add_library(${name} MODULE ${source})
  slipstream_warnings(${name})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/generated/sdk)
  target_link_libraries(${name} PRIVATE TBB::tbb yaml-cpp nlohmann_json::nlohmann_json)
  set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib)
  add_dependencies(${name} slipstream_sdk_abi)
endfunction()

# slipstream_emulated_library(NAME CU_SOURCES a_cuda.cu ... SOURCES x.cpp ... LIBS ...): the CUDA
# sources compiled as C++ for the CPU emulator (kernels/emulation), each through a generated
# wrapper that defines SLIPSTREAM_CUDA_EMULATION, so their entry points land in the
# `cuda_emulated` namespaces. Sanitizer builds too: the emulator tells ASan of each switch of
# stack, so ASan and UBSan check the device code's indexing on the CPU.
function(slipstream_emulated_library name)
  cmake_parse_arguments(E "" "" "CU_SOURCES;SOURCES;LIBS" ${ARGN})
  set(_sources ${E_SOURCES})
  foreach(_cu ${E_CU_SOURCES})
    get_filename_component(_stem ${_cu} NAME_WE)
    set(_wrapper ${CMAKE_CURRENT_BINARY_DIR}/emulated/${_stem}_emulated.cpp)
    file(CONFIGURE OUTPUT ${_wrapper}
         CONTENT "#define SLIPSTREAM_CUDA_EMULATION 1\n#include \"${_cu}\"\n")
    list(APPEND _sources ${_wrapper})
  endforeach()
  add_library(${name} STATIC ${_sources})
  slipstream_warnings(${name})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${E_LIBS})
  # The wrappers #include the kernel sources, so GCC takes their anonymous namespaces for a
  # header's and warns about the launch lambdas that capture them; `#pragma unroll` is nvcc's.
  target_compile_options(${name} PRIVATE -Wno-subobject-linkage -Wno-unknown-pragmas)
endfunction()

# slipstream_targets_under(DIR OUT): every target declared in DIR and the folders below it.
function(slipstream_targets_under dir out)
  get_property(_targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(_subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(_sub ${_subdirs})
    slipstream_targets_under(${_sub} _more)
    list(APPEND _targets ${_more})
  endforeach()
  set(${out} ${_targets} PARENT_SCOPE)
endfunction()

# slipstream_aggregate_target(NAME DIRS a b ... [ALSO t ...]): a target that builds every target
# under DIRS (folders added EXCLUDE_FROM_ALL, so the default build leaves them out) and ALSO.
function(slipstream_aggregate_target name)
  cmake_parse_arguments(A "" "" "DIRS;ALSO" ${ARGN})
  add_custom_target(${name})
  set(_deps ${A_ALSO})
  foreach(_dir ${A_DIRS})
    slipstream_targets_under(${_dir} _found)
    list(APPEND _deps ${_found})
  endforeach()
  if(_deps)
    add_dependencies(${name} ${_deps})
  endif()
endfunction()
