# write_if_changed(FILE TEXT): writes TEXT to FILE only when it differs, so what depends on a
# generated header rebuilds only when its content changed (GitCommit.cmake, SdkAbi.cmake).
function(write_if_changed file text)
  set(old "")
  if(EXISTS ${file})
    file(READ ${file} old)
  endif()
  if(NOT old STREQUAL text)
    file(WRITE ${file} "${text}")
  endif()
endfunction()
