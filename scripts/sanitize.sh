#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sanitizer runs (`make sanitize`; CI runs it after `make test`). Zero reports or it fails.
#   asan: AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer build; runs the ctest
#         labels unit, conformance and mpi.
#   tsan: ThreadSanitizer build; runs the threaded parts: the loader, dataset and checkpoint
#         writer unit tests, the collectives/reducer test and the watchdog test.
# Each has its own build directory with only the test executables it runs (GCC, Debug at -O1,
# CUDA off). Reports go to files under <build>/sanitizer-logs (log_path), so a report from any
# process, even one whose output a test discards, fails the run; they are printed at the end.
# Suppressions (third-party libraries only, each with its reason): tests/sanitizers/*.supp.
#   scripts/sanitize.sh [asan|tsan|all]   (ASAN_BUILD, TSAN_BUILD, JOBS, MPIEXEC_PREFLAGS)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
which=${1:-all}
jobs=${JOBS:-$(nproc)}
root_flag=""
[ "$(id -u)" -eq 0 ] && root_flag="--allow-run-as-root"
mpi_flags=${MPIEXEC_PREFLAGS:-"--oversubscribe --bind-to none $root_flag"}
supp=$root/tests/sanitizers

configure() {  # build_dir sanitizers
  cmake -S . -B "$1" -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-g -O1" \
    -DDPTRAIN_WITH_CUDA=OFF -DDPTRAIN_BUILD_BENCH=OFF -DDPTRAIN_SANITIZE="$2" \
    -DDPTRAIN_WERROR=OFF "-DMPIEXEC_PREFLAGS=$mpi_flags" >/dev/null
  # -Werror stays off: GCC's own documentation warns that sanitizers raise false positives of
  # -Wmaybe-uninitialized and friends (GCC 12 reports one inside <regex> here); the normal
  # build (make build / make test) is the one that enforces warnings.
}

# Runs ctest in $1 with ctest arguments $2..; then fails on any report file.
run_ctest() {
  local build=$1
  shift
  local logs=$build/sanitizer-logs
  rm -rf "$logs" && mkdir -p "$logs"
  local rc=0
  (cd "$build" && DPTRAIN_DATA="$root/data" ctest --output-on-failure -j "$jobs" \
    --timeout 900 "$@") || rc=$?
  if compgen -G "$logs/*" >/dev/null; then
    echo "sanitize: reports in $logs:"
    for f in "$logs"/*; do
      echo "==== $f"
      cat "$f"
    done
    rc=1
  fi
  return $rc
}

status=0
if [ "$which" = all ] || [ "$which" = asan ]; then
  b=${ASAN_BUILD:-build-asan}
  start=$(date +%s)
  echo "sanitize: ASan+UBSan build in $b"
  configure "$b" address,undefined
  # The executables of the unit, conformance and mpi labels: every mpi_* test and *_probe
  # helper (tests/mpi), found in the build graph so that new multi-rank tests are included.
  mapfile -t mpi_targets < <(ninja -C "$b" -t targets all |
    sed -n 's/^\(mpi_[A-Za-z0-9_]*\|[a-z0-9]*_probe\): phony$/\1/p')
  cmake --build "$b" -j "$jobs" --target unit_tests conformance_tests "${mpi_targets[@]}"
  echo "sanitize: ASan+UBSan build took $(( $(date +%s) - start ))s"
  start=$(date +%s)
  logs=$root/$b/sanitizer-logs
  [[ $b = /* ]] && logs=$b/sanitizer-logs
  # The suppression files are for third-party libraries only (see their comments).
  export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:fast_unwind_on_malloc=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
  run_ctest "$b" -L '^(unit|conformance|mpi)$' || status=1
  unset ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
  echo "sanitize: ASan+UBSan tests took $(( $(date +%s) - start ))s"
fi

if [ "$which" = all ] || [ "$which" = tsan ]; then
  b=${TSAN_BUILD:-build-tsan}
  start=$(date +%s)
  echo "sanitize: TSan build in $b"
  configure "$b" thread
  cmake --build "$b" -j "$jobs" --target unit_tests mpi_collectives watchdog_probe
  echo "sanitize: TSan build took $(( $(date +%s) - start ))s"
  start=$(date +%s)
  logs=$root/$b/sanitizer-logs
  [[ $b = /* ]] && logs=$b/sanitizer-logs
  # OMP_NUM_THREADS=1 (set by every test): libgomp is not instrumented, so its barriers are
  # invisible to TSan; with one OpenMP thread no OpenMP synchronisation happens at all.
  export OMP_NUM_THREADS=1
  export TSAN_OPTIONS="log_path=$logs/tsan:halt_on_error=0:second_deadlock_stack=1:history_size=4:suppressions=$supp/tsan.supp"
  run_ctest "$b" -R '^((Loader|Hdf5Dataset|Sampler|Checkpoint[A-Za-z]*)Test\.|mpi\.(collectives|watchdog)\.)' \
    || status=1
  unset TSAN_OPTIONS
  echo "sanitize: TSan tests took $(( $(date +%s) - start ))s"
fi
[ $status = 0 ] && echo "sanitize: no reports" || echo "sanitize: FAILED"
exit $status
