# Writes OUT (a header defining SLIPSTREAM_GIT_COMMIT) from `git describe` of SRC, and only
# rewrites it when the commit changed, so a build recompiles one file after a commit and none
# otherwise. Run at every build (engine/CMakeLists.txt); outside a git checkout: "unknown".
execute_process(COMMAND git -C ${SRC} rev-parse --short=12 HEAD OUTPUT_VARIABLE commit
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
else()
  execute_process(COMMAND git -C ${SRC} diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET)
  if(NOT dirty EQUAL 0)
    set(commit "${commit}-dirty")
  endif()
endif()
set(text "#define SLIPSTREAM_GIT_COMMIT \"${commit}\"\n")
include(${CMAKE_CURRENT_LIST_DIR}/WriteIfChanged.cmake)
write_if_changed(${OUT} "${text}")
