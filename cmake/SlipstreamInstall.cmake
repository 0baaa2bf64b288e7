# `cmake --install build [--prefix P] [--component C]`:
#   tools   bin/slipstream, bin/slipstream-smi, share/slipstream/{presets,configs}
#   sdk     the stage API's headers and lib/cmake/slipstream: find_package(slipstream) gives a
#           plugin project slipstream::stage_api, slipstream::slipstream (the CLI, to test a
#           plugin with) and slipstream_add_plugin(); `slipstream new-stage NAME --out DIR`
#           writes such a project
#   policy  libslipstream_policy (policy/CMakeLists.txt)
# A plugin is a module whose engine and kernel symbols resolve against the slipstream
# executable that loads it (ENABLE_EXPORTS), so the SDK is headers and CMake only: a plugin
# must be built against the headers of the slipstream that will load it (the config file
# pins the version).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS slipstream slipstream-smi RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        COMPONENT tools)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/presets ${CMAKE_SOURCE_DIR}/configs
        DESTINATION ${CMAKE_INSTALL_DATADIR}/slipstream COMPONENT tools)

set(SLIPSTREAM_SDK_INCLUDE ${CMAKE_INSTALL_INCLUDEDIR}/slipstream/sdk)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/engine/ DESTINATION ${SLIPSTREAM_SDK_INCLUDE}/engine
        COMPONENT sdk FILES_MATCHING PATTERN "*.h" PATTERN "cuda" EXCLUDE)
install(DIRECTORY ${CMAKE_SOURCE_DIR}/kernels/ DESTINATION ${SLIPSTREAM_SDK_INCLUDE}/kernels
        COMPONENT sdk FILES_MATCHING PATTERN "*.h" PATTERN "*.inc")
install(DIRECTORY ${CMAKE_SOURCE_DIR}/stages/nn/ DESTINATION ${SLIPSTREAM_SDK_INCLUDE}/stages/nn
        COMPONENT sdk FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${CMAKE_SOURCE_DIR}/stages/ops/ DESTINATION ${SLIPSTREAM_SDK_INCLUDE}/stages/ops
        COMPONENT sdk FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/generated/sdk/engine/sdk_abi.h DESTINATION ${SLIPSTREAM_SDK_INCLUDE}/engine COMPONENT sdk)

# What the headers were compiled with; a plugin must see the same (slipstreamConfig.cmake.in).
if(SLIPSTREAM_HAS_CUDA)
  set(SLIPSTREAM_SDK_CUDA 1)
else()
  set(SLIPSTREAM_SDK_CUDA 0)
endif()
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/slipstreamConfig.cmake.in
  ${CMAKE_BINARY_DIR}/sdk/slipstreamConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/slipstream
  PATH_VARS SLIPSTREAM_SDK_INCLUDE CMAKE_INSTALL_BINDIR)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/sdk/slipstreamConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY ExactVersion)
install(FILES ${CMAKE_BINARY_DIR}/sdk/slipstreamConfig.cmake
              ${CMAKE_BINARY_DIR}/sdk/slipstreamConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/slipstream COMPONENT sdk)
