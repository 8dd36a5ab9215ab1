# SPDX-License-Identifier: Apache-2.0
# FindNCCL's version gate, run in script mode by ctest (cmake.find_nccl_version): an nccl.h
# older than the 2.14 the build needs is rejected at configure time (and its version is named),
# 2.14 itself is accepted. Fake installs are written under WORK_DIR.
#   cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch> -P find_nccl_version.cmake
cmake_minimum_required(VERSION 3.25)
cmake_policy(SET CMP0074 NEW)
list(APPEND CMAKE_MODULE_PATH "${SOURCE_DIR}/cmake")

function(check_fake major minor patch expect_found)
  set(root "${WORK_DIR}/nccl-${major}.${minor}.${patch}")
  file(MAKE_DIRECTORY "${root}/include" "${root}/lib")
  file(WRITE "${root}/include/nccl.h"
       "#define NCCL_MAJOR ${major}\n#define NCCL_MINOR ${minor}\n#define NCCL_PATCH ${patch}\n")
  file(WRITE "${root}/lib/libnccl.so" "")
  unset(NCCL_INCLUDE_DIR CACHE)
  unset(NCCL_LIBRARY CACHE)
  unset(NCCL_INCLUDE_DIR)
  unset(NCCL_LIBRARY)
  unset(NCCL_FOUND)
  set(NCCL_ROOT "${root}")
  set(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH FALSE)
  set(CMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH FALSE)
  find_package(NCCL 2.14 QUIET)
  if(NOT "${NCCL_VERSION}" STREQUAL "${major}.${minor}.${patch}")
    message(FATAL_ERROR "NCCL ${major}.${minor}.${patch}: version parsed as '${NCCL_VERSION}'")
  endif()
  if(expect_found AND NOT NCCL_FOUND)
    message(FATAL_ERROR "NCCL ${major}.${minor}.${patch} was rejected; 2.14 is enough")
  endif()
  if(NOT expect_found AND NCCL_FOUND)
    message(FATAL_ERROR "NCCL ${major}.${minor}.${patch} was accepted; the build needs 2.14")
  endif()
  message(STATUS "NCCL ${major}.${minor}.${patch}: found=${NCCL_FOUND} as expected")
endfunction()

check_fake(2 12 7 FALSE)
check_fake(2 13 4 FALSE)
check_fake(2 14 3 TRUE)
check_fake(2 27 7 TRUE)
