# Compiles go through ccache when it is installed (DPTRAIN_CCACHE=AUTO, the default; ON insists,
# OFF never). `make test`, `make sanitize`, `make fuzz` and CI build the same sources up to five
# ways; with ccache a CI run on a machine that has built the commit before (a developer's, or
# the CI machine after the session that submitted it) compiles almost nothing, and a fresh
# machine builds as before. The cache lives outside the clone (ccache's own default,
# ~/.cache/ccache), so a clean clone in another folder hits it:
#   CCACHE_BASEDIR  paths under the source root are hashed relative to it, so two clones of one
#                   commit share entries (the one absolute path left on a command line,
#                   DPTRAIN_SOURCE_DIR, is set on the two files that read it only: Warnings.cmake);
#   CCACHE_NOHASHDIR  the build directory is not hashed for -g objects; their debug info then
#                   names the directory of the build that first compiled them (for a debugger's
#                   source lookup only: error messages and sanitizer reports use the paths in
#                   the object, which are relative to the source root).
set(DPTRAIN_CCACHE AUTO CACHE STRING "Compile through ccache: AUTO (when found), ON or OFF")
set_property(CACHE DPTRAIN_CCACHE PROPERTY STRINGS AUTO ON OFF)
set(DPTRAIN_CCACHE_SUMMARY "off")
if(NOT DPTRAIN_CCACHE STREQUAL "OFF")
  find_program(DPTRAIN_CCACHE_PROGRAM ccache)
  if(DPTRAIN_CCACHE_PROGRAM)
    set(_launcher env CCACHE_BASEDIR=${PROJECT_SOURCE_DIR} CCACHE_NOHASHDIR=true
                  ${DPTRAIN_CCACHE_PROGRAM})
    foreach(_lang C CXX CUDA)
      if(NOT DEFINED CMAKE_${_lang}_COMPILER_LAUNCHER)
        set(CMAKE_${_lang}_COMPILER_LAUNCHER ${_launcher})
      endif()
    endforeach()
    set(DPTRAIN_CCACHE_SUMMARY "${DPTRAIN_CCACHE_PROGRAM}")
  elseif(DPTRAIN_CCACHE STREQUAL "ON")
    message(FATAL_ERROR "DPTRAIN_CCACHE=ON but ccache is not installed (scripts/install-deps.sh)")
  endif()
endif()
