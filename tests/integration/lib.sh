# SPDX-License-Identifier: Apache-2.0
# Shared helpers for the end-to-end shell tests (tests/integration/*.sh), sourced by each script:
# environment (DPTRAIN, DPTRAIN_SRC, DPTRAIN_DATA, Open MPI settings), a temp dir removed on exit,
# expect_fail / check / known_broken, and the closing 'N passed, N failed' line (finish).
#
# Environment (ctest sets the first two; see CMakeLists.txt beside this file):
#   DPTRAIN       the dptrain binary (default: $DPTRAIN_SRC/build/launcher/dptrain)
#   DPTRAIN_HOOKED  the test-hooks build of it (default: $DPTRAIN_SRC/build/tests/dptrain_hooked)
#   DPTRAIN_SRC   the source tree (default: two folders up from this file)
#   DPTRAIN_DATA  converted datasets, fmnist/{train,test}.h5 (default: $DPTRAIN_SRC/data)
#   MPIEXEC       the MPI launcher (default: mpirun)
#   DPTRAIN_IT_KEEP=1   keep the temp dir (its path is printed) for a post-mortem
# shellcheck shell=bash
# Variables set here are read by the scripts that source this file.
# shellcheck disable=SC2034
set -u -o pipefail

DPTRAIN_SRC=${DPTRAIN_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
DPTRAIN=${DPTRAIN:-$DPTRAIN_SRC/build/launcher/dptrain}
# The same command line with test hooks read from DPTRAIN_TEST_* (tests/testing/dptrain_hooked_main.cc):
# only fault-injection cases use it; the production binary ignores those variables.
DPTRAIN_HOOKED=${DPTRAIN_HOOKED:-$DPTRAIN_SRC/build/tests/dptrain_hooked}
DPTRAIN_DATA=${DPTRAIN_DATA:-$DPTRAIN_SRC/data}
MPIEXEC=${MPIEXEC:-mpirun}
export DPTRAIN DPTRAIN_HOOKED DPTRAIN_SRC DPTRAIN_DATA

if [[ ! -x $DPTRAIN ]]; then
  echo "FAIL: DPTRAIN=$DPTRAIN is not an executable (build it: cmake --build BUILD --target dptrain)"
  echo "0 passed, 1 failed"
  exit 1
fi

# Open MPI settings for oversubscribed local runs (as root too): part of the project.
# shellcheck source=../../scripts/mpi-env.sh
. "$DPTRAIN_SRC/scripts/mpi-env.sh"
# Several ranks share 2 cores with other tests: one compute thread each, passive waits.
export OMP_WAIT_POLICY=passive

# Launcher prefixes: "${MPI4[@]}" "$DPTRAIN" train ... (used by the scripts that source this)
MPI2=("$MPIEXEC" -np 2 --oversubscribe)
MPI3=("$MPIEXEC" -np 3 --oversubscribe)
MPI4=("$MPIEXEC" -np 4 --oversubscribe)
# fail_fast_teardown: for scripts whose multi-rank cases end with a rank exiting non-zero (the
# error tests). mpirun then sends the job's other ranks SIGTERM and waits
# odls_base_sigkill_timeout (1 s; 2 s in all for a 1-rank job) before it sends SIGKILL and
# returns: 1-2 s of each such case's 1.2-2.2 s (0.13-0.19 s without it, on a 2-core AMD EPYC).
# 0 sends SIGKILL at once. What the cases assert is the same either way: the exit code, the
# message printed once, every rank gone. Not for a script that signals a job and expects its
# ranks to act on SIGTERM (checkpoint_preempt.sh).
fail_fast_teardown() { export OMPI_MCA_odls_base_sigkill_timeout=0; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/dptrain-it.XXXXXX")
PASSED=0
FAILED=0
SKIPPED=0
SCRIPT_START=$SECONDS

cleanup() {
  if [[ ${DPTRAIN_IT_KEEP:-0} == 1 ]]; then
    echo "kept $TMP"
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT

pass() {
  PASSED=$((PASSED + 1))
  echo "PASS: $*"
}
fail() {
  FAILED=$((FAILED + 1))
  echo "FAIL: $*"
}
skip() {
  SKIPPED=$((SKIPPED + 1))
  echo "SKIP: $*"
}

# Exits 77 (ctest: skipped) with the reason when the converted Fashion-MNIST files are missing.
require_fmnist() {
  local f
  for f in "$DPTRAIN_DATA/fmnist/train.h5" "$DPTRAIN_DATA/fmnist/test.h5"; do
    if [[ ! -f $f ]]; then
      echo "SKIP: $f is missing (run 'make data', or point DPTRAIN_DATA at the converted files)"
      exit 77
    fi
  done
}

# Exits 77 (ctest: skipped) with the reason unless a GPU is visible and the CUDA backend can use
# it; sets NGPU (the GPUs NVML sees) and leaves `dptrain info`'s output in $TMP/info.out.
require_cuda() {
  "$DPTRAIN" info >"$TMP/info.out" 2>&1 || true
  NGPU=$(sed -n 's/^GPUs (NVML[^)]*): \([0-9]*\)$/\1/p' "$TMP/info.out")
  if [[ -z $NGPU || $NGPU == 0 ]]; then
    echo "SKIP: no GPU: $(grep '^GPUs' "$TMP/info.out")"
    exit 77
  fi
  if ! grep -q '^  cuda: available' "$TMP/info.out"; then
    echo "SKIP: the CUDA backend cannot run here: $(grep '^  cuda:' "$TMP/info.out")"
    exit 77
  fi
}

# A python3 that has h5py and numpy (pyenv's python3 may not; Debian's /usr/bin/python3 does),
# in PY; returns 1 when there is none.
find_h5py_python() {
  local p
  for p in python3 /usr/bin/python3; do
    if command -v "$p" >/dev/null && "$p" -c 'import h5py, numpy' 2>/dev/null; then
      PY=$p
      return 0
    fi
  done
  PY=
  return 1
}

# PIDs of live processes whose environment holds DPTRAIN_IT_TAG=$1 (what a command left behind).
# One grep over every /proc/PID/environ: a grep per process cost 0.2-0.4 s a command (a third of
# errors.sh's time), as it runs after every case. Zombies have an empty environ already: anything
# listed is still running. The tag is only ever in a command's environment, never this shell's.
tagged_pids() {
  grep -lzx "DPTRAIN_IT_TAG=$1" /proc/[0-9]*/environ 2>/dev/null |
    sed -n 's|^/proc/\([0-9]*\)/environ$|\1|p' || true
}

# Waits up to 5 s for the processes of a finished command to be gone; prints and kills (by
# PID, they are ours) the ones that stay.
reap_tagged() {
  local tag=$1 left i
  for ((i = 0; i < 50; i++)); do
    left=$(tagged_pids "$tag")
    [[ -z $left ]] && return 0
    sleep 0.1
  done
  echo "$left" | tr '\n' ' '
  # shellcheck disable=SC2086  # one PID per word
  kill -9 $left 2>/dev/null
  return 1
}

# Runs "$@" with stdout/stderr in $TMP/last.{out,err} under a 30 s limit (a hang is a failure).
# Sets LAST_RC, LAST_SECONDS, LAST_LEFT (PIDs still alive after it returned: ranks left behind).
run_limited() {
  local tag="it$$x$RANDOM$RANDOM" t0
  LAST_RC=0
  t0=$(date +%s.%N)
  DPTRAIN_IT_TAG=$tag timeout -k 5 "${RUN_LIMIT:-30}" "$@" >"$TMP/last.out" 2>"$TMP/last.err" </dev/null ||
    LAST_RC=$?
  LAST_SECONDS=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
  LAST_LEFT=$(reap_tagged "$tag") || true
}

show_last() {
  echo "  --- command: $*"
  echo "  --- stderr (first 40 lines):"
  head -n 40 "$TMP/last.err" | sed 's/^/  | /'
  echo "  --- stdout (last 10 lines):"
  tail -n 10 "$TMP/last.out" | sed 's/^/  | /'
}

# CASE names the check in PASS/FAIL lines; scripts set it before expect_fail.
CASE=${CASE:-unnamed}

# expect_fail CODE PATTERN -- command...
# The command must exit with CODE within 30 s, print PATTERN (a fixed string) on stderr exactly
# once (rank 0 prints an error every rank sees; several copies mean several ranks printed it),
# and leave no process behind.
expect_fail() {
  local code=$1 pattern=$2 n
  shift 2
  [[ ${1:-} == -- ]] && shift
  run_limited "$@"
  local why=()
  if [[ $LAST_RC == 124 || $LAST_RC == 137 ]]; then
    why+=("hung: still running after 30 s (exit $LAST_RC from timeout)")
  elif [[ $LAST_RC != "$code" ]]; then
    why+=("exit code $LAST_RC, expected $code")
  fi
  n=$(grep -cF -- "$pattern" "$TMP/last.err")
  if [[ $n == 0 ]]; then
    why+=("stderr lacks: $pattern")
  elif [[ $n != 1 ]]; then
    why+=("the message is printed $n times, expected once (several ranks printed it?)")
  fi
  [[ -n $LAST_LEFT ]] && why+=("processes still alive after the command returned: $LAST_LEFT")
  if ((${#why[@]} == 0)); then
    pass "$CASE (exit $LAST_RC, ${LAST_SECONDS}s)"
    return 0
  fi
  local w
  fail "$CASE"
  for w in "${why[@]}"; do echo "  - $w"; done
  show_last "$@"
  return 1
}

# expect_ok -- command...: exit 0 within 30 s (RUN_LIMIT seconds when set) and no process left
# behind.
expect_ok() {
  [[ ${1:-} == -- ]] && shift
  run_limited "$@"
  if [[ $LAST_RC == 0 && -z $LAST_LEFT ]]; then
    pass "$CASE (${LAST_SECONDS}s)"
    return 0
  fi
  fail "$CASE: exit $LAST_RC${LAST_LEFT:+, processes left behind: $LAST_LEFT}"
  show_last "$@"
  return 1
}

# check DESCRIPTION command...: passes when the command exits 0.
check() {
  local what=$1
  shift
  if "$@"; then
    pass "$what"
  else
    fail "$what"
  fi
}

# known_broken DESCRIPTION command...: a check for a reported bug. While it fails it is counted
# as skipped and printed as 'KNOWN BROKEN:'; once it passes it says so (remove the marker).
known_broken() {
  local what=$1
  shift
  if "$@"; then
    pass "$what (was KNOWN BROKEN and now passes: drop the known_broken marker)"
  else
    SKIPPED=$((SKIPPED + 1))
    echo "KNOWN BROKEN: $what"
  fi
}

# Last stderr holds the fixed string $1 exactly $2 times (for use with check / known_broken).
last_err_count() {
  [[ $(grep -cF -- "$1" "$TMP/last.err") == "$2" ]]
}

# limit_under_peak MIB: the whole MiB that are MIB under the last run's printed peak per rank
# ("memory: peak per rank P MiB (min) ..."), for memory.limit tests tied to the measured peak.
limit_under_peak() {
  local peak
  peak=$(sed -n 's/^memory: peak per rank \([0-9.]*\) MiB (min).*/\1/p' "$TMP/last.out")
  awk -v p="${peak:-0}" -v m="$1" 'BEGIN { printf "%d", p - m }'
}

# both NAME CODE PATTERN [--] ARGS...: `dptrain ARGS` as 1 process and as 4 ranks; each must
# exit CODE within 30 s with PATTERN printed once. When the array AS holds a command (e.g.
# setpriv to another user), both runs go through it.
AS=()
both() {
  local name=$1 code=$2 pattern=$3
  shift 3
  [[ ${1:-} == -- ]] && shift
  CASE="$name [1 process]"
  expect_fail "$code" "$pattern" -- "${AS[@]}" "$DPTRAIN" "$@"
  CASE="$name [4 ranks]"
  expect_fail "$code" "$pattern" -- "${AS[@]}" "${MPI4[@]}" "$DPTRAIN" "$@"
}

# write_base_config FILE: a small valid run (ref_cnn, synthetic data, 2 steps, global batch 32,
# run_dir $TMP/run) for error tests that change one thing each.
write_base_config() {
  cat >"$1" <<EOF
run_dir = "$TMP/run"
seed = 1

[model]
name = "ref_cnn"
classes = 10

[data]
train = "synthetic"
test = "synthetic"
synthetic_samples = 256
workers = 0

[train]
epochs = 1
max_steps = 2
global_batch = 32
lr = 0.01
log_every_steps = 1

[checkpoint]
every_epochs = 0
EOF
}

# kill_in_collective NAME TIMEOUT_S COMMAND...: runs a 2-rank training COMMAND (dptrain_hooked,
# dist.collective_timeout_s=TIMEOUT_S) in which rank 1 SIGKILLs itself in step 11 with its
# gradient collectives enqueued (DPTRAIN_TEST_KILL_IN_COLLECTIVE=1:10), rank 0 inside them. Checks
# that every rank is gone within TIMEOUT_S + 10 s of the kill, the exit is non-zero, the output
# names rank 1, and no process is left.
kill_in_collective() {
  local name=$1 timeout_s=$2 killed_at ended gone
  shift 2
  RUN_LIMIT=$((timeout_s + 120)) run_limited env DPTRAIN_TEST_KILL_IN_COLLECTIVE=1:10 "$@" \
    --set dist.collective_timeout_s="$timeout_s"
  ended=$(date +%s.%N)
  killed_at=$(grep -oE 'collectives in flight, at unix time [0-9.]+' "$TMP/last.err" | grep -oE '[0-9.]+$')
  if [[ -z $killed_at ]]; then
    fail "$name: rank 1 never reached the kill in step 11 (exit $LAST_RC)"
    show_last "$@"
    return
  fi
  gone=$(awk -v a="$killed_at" -v b="$ended" 'BEGIN { printf "%.1f", b - a }')
  check "$name: every rank gone ${gone}s after rank 1 died mid-allreduce (bound $((timeout_s + 10)) s)" \
    awk -v s="$gone" -v b=$((timeout_s + 10)) 'BEGIN { exit !(s <= b) }'
  check "$name: the job exits non-zero (exit $LAST_RC)" test "$LAST_RC" != 0
  check "$name: the output names rank 1 as the rank that died" \
    grep -qE '(process rank|rank) 1 .*(signal 9|Killed|died|exited)' "$TMP/last.out" "$TMP/last.err"
  check "$name: no process left${LAST_LEFT:+: $LAST_LEFT}" test -z "$LAST_LEFT"
}

# Prints the closing line and exits: non-zero if anything failed.
finish() {
  echo "time: $((SECONDS - SCRIPT_START)) s"
  if ((SKIPPED > 0)); then
    echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
  else
    echo "$PASSED passed, $FAILED failed"
  fi
  ((FAILED == 0))
  exit $?
}
