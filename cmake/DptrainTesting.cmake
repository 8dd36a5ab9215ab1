# Test helpers.
#   dptrain_add_gtest(NAME LABEL label [RESOURCE_LOCK lock] SOURCES ...): a GoogleTest
#     executable, one ctest per test (RESOURCE_LOCK: tests that must not run beside each other,
#     e.g. dptrain_gpus for everything that opens a GPU).
#   dptrain_add_mpi_test(NAME name NP n SOURCES ...): runs under mpiexec with n ranks; flags for
#     containers / root (--oversubscribe, --allow-run-as-root) come from MPIEXEC_PREFLAGS.
function(dptrain_add_gtest name)
  cmake_parse_arguments(A "" "LABEL;RESOURCE_LOCK" "SOURCES" ${ARGN})
  if(NOT A_SOURCES)
    return()
  endif()
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE dptrain_testing GTest::gtest_main dptrain::warnings)
  # One compute thread per test process: ctest runs tests side by side on few cores, and
  # OpenMP teams that outnumber the cores spin-wait on each other.
  set(_lock)
  if(A_RESOURCE_LOCK)
    set(_lock RESOURCE_LOCK ${A_RESOURCE_LOCK})
  endif()
  # Sanitizer builds: scripts/sanitize.sh runs ASan with fast_unwind_on_malloc=0 (the leak
  # suppressions need whole stacks through Open MPI), so every allocation unwinds its stack and
  # allocation-heavy tests run 10-60x slower than in Release. ctest's --timeout does not
  # override this property, so the scaling lives here.
  set(_timeout 300)
  if(DPTRAIN_SANITIZE)
    set(_timeout 900)
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST
                       PROPERTIES LABELS ${A_LABEL} TIMEOUT ${_timeout}
                       ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=passive" ${_lock})
endfunction()

function(dptrain_add_mpi_test)
  cmake_parse_arguments(A "" "NAME;NP" "SOURCES" ${ARGN})
  set(exe mpi_${A_NAME})
  if(NOT TARGET ${exe})  # the same test may be registered for several rank counts
    add_executable(${exe} ${A_SOURCES} ${PROJECT_SOURCE_DIR}/tests/testing/mpi_main.cc)
    target_link_libraries(${exe} PRIVATE dptrain_testing GTest::gtest dptrain::warnings
                                         dptrain::mpi)
  endif()
  string(REPLACE ";" " " _flags "${MPIEXEC_PREFLAGS}")
  separate_arguments(_pre UNIX_COMMAND "${_flags}")
  add_test(NAME mpi.${A_NAME}.np${A_NP}
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${A_NP} ${_pre} $<TARGET_FILE:${exe}>
            ${MPIEXEC_POSTFLAGS})
  # Sanitizer builds (make sanitize) run 5-10x slower: mpi.shard.np4 took ~125 s under ASan+UBSan
  # on the 2-core CI machine, past 120.
  set(_timeout 120)
  if(DPTRAIN_SANITIZE)
    set(_timeout 600)
  endif()
  set_tests_properties(mpi.${A_NAME}.np${A_NP} PROPERTIES PROCESSORS ${A_NP} TIMEOUT ${_timeout}
    LABELS mpi ENVIRONMENT "OMPI_MCA_mpi_yield_when_idle=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_hwloc_base_binding_policy=none;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMP_NUM_THREADS=1;DPTRAIN_DATA=${PROJECT_SOURCE_DIR}/data")
endfunction()
