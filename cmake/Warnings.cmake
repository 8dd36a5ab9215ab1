# Warnings and sanitizers live on INTERFACE targets linked by every dptrain target.
add_library(dptrain_warnings INTERFACE)
target_compile_options(dptrain_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wundef>
  # Shadowed locals: GCC spells it -Wshadow=local, clang (fuzz and lint builds) differently.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wshadow=local>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wshadow-uncaptured-local>
  $<$<COMPILE_LANGUAGE:CXX>:-Wnon-virtual-dtor>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wundef>)
if(DPTRAIN_WERROR)
  target_compile_options(dptrain_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror> $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
endif()
# The source root, for the two files that read it (core/error.cc strips it from __FILE__; a unit
# test finds the fuzz corpus). Only on them: an absolute path on every command line would keep two
# clones of one commit from sharing ccache entries (cmake/Ccache.cmake).
set(DPTRAIN_SOURCE_DIR_DEFINITION DPTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

if(DPTRAIN_SANITIZE)
  target_compile_options(dptrain_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DPTRAIN_SANITIZE} -fno-omit-frame-pointer>)
  target_link_options(dptrain_warnings INTERFACE -fsanitize=${DPTRAIN_SANITIZE})
  if(DPTRAIN_SANITIZE MATCHES "undefined")
    # Undefined behaviour ends the process like an ASan report: a test cannot pass over it.
    target_compile_options(dptrain_warnings INTERFACE
      $<$<COMPILE_LANGUAGE:CXX>:-fno-sanitize-recover=undefined>)
  endif()
endif()

# Fuzzing: coverage instrumentation for libFuzzer on every dptrain target; the fuzz executables
# link libFuzzer itself (tests/fuzz). Clang only: GCC has no libFuzzer.
if(DPTRAIN_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "DPTRAIN_BUILD_FUZZERS=ON needs clang (CXX=clang++), not "
                        "${CMAKE_CXX_COMPILER_ID}")
  endif()
  target_compile_options(dptrain_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link>)
endif()
add_library(dptrain::warnings ALIAS dptrain_warnings)
