#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Preemption of a 2-rank run: SIGUSR1 to mpirun (Open MPI forwards it to every rank) -> every
# rank stops after the same step, rank 0 writes a checkpoint there, exit 0, and the resumed run
# ends bitwise equal to an uninterrupted one. Also SIGTERM to every rank (what srun/scancel do),
# --requeue-exit-code, a second signal during the checkpoint write (the write completes, the
# file appears atomically), and Open MPI's own handling of SIGTERM sent to mpirun.
# shellcheck disable=SC2034  # CASE is read by expect_ok / expect_fail (lib.sh)
# shellcheck source=checkpoint_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/checkpoint_common.sh"

STEPS=(--set train.max_steps=200 --set train.log_every_steps=5)

# preempt NAME SIGNAL TARGET [train args...]: starts 2 ranks in $TMP/NAME, sends SIGNAL once
# step 10 is logged to TARGET ("mpirun" or "ranks"), waits; sets BG_RC and STOP (the step it
# stopped after, from rank 0's message).
preempt() {
  local name=$1 sig=$2 target=$3
  shift 3
  bg_start "$name" "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/$name" \
    "${STEPS[@]}" "$@"
  if wait_for "$TMP/$name.out" "step 10/" 60; then
    if [[ $target == mpirun ]]; then
      kill "-$sig" "$BG_PID"
    else
      # shellcheck disable=SC2046  # one PID per word
      kill "-$sig" $(pgrep -P "$BG_PID" -x dptrain)
    fi
  fi
  bg_wait 60
  STOP=$(sed -n 's/.* received: every rank stops after step \([0-9]*\) .*/\1/p' "$TMP/$name.out")
  echo "  $name: exit $BG_RC, stopped after step ${STOP:-?}"
  grep -E "received|preempted|checkpoint /" "$TMP/$name.out" | sed 's/^/  | /'
}

echo "== uninterrupted reference"
CASE="2 ranks, 200 steps"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/ref" \
  "${STEPS[@]}"

echo "== SIGUSR1 to mpirun"
preempt usr1 USR1 mpirun
check "exit 0" test "$BG_RC" = 0
check "stopped mid-run at an agreed step" test -n "$STOP" -a "${STOP:-0}" -lt 200
check "mpirun forwarded the signal" grep -qF "Forwarding signal 10 to job" "$TMP/usr1.err"
check "the message is printed once (rank 0 speaks for all)" \
  test "$(grep -c "SIGUSR1 received" "$TMP/usr1.out")" = 1
check "a checkpoint at exactly that step" test -f "$(ckpt "$TMP/usr1" "${STOP:-0}")"
check "it verifies" ckpt_py valid "$(ckpt "$TMP/usr1" "${STOP:-0}")"
check "it is the only checkpoint (no step triggers)" \
  test "$(find "$TMP/usr1/checkpoints" -type f | wc -l)" = 1
check "metrics.jsonl summary records the signal" grep -q '"stop_signal":10' "$TMP/usr1/metrics.jsonl"
CASE="resume after SIGUSR1"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/usr1" \
  "${STEPS[@]}"
check "it resumes from the preemption checkpoint" \
  grep -qF "resuming from $(ckpt "$TMP/usr1" "${STOP:-0}"): step ${STOP:-0}," "$TMP/last.out"
check "the resumed run ends bitwise equal to the uninterrupted one" \
  ckpt_py same "$(ckpt "$TMP/usr1" 200)" "$(ckpt "$TMP/ref" 200)"

echo "== SIGTERM to every rank (srun, scancel)"
preempt term TERM ranks
check "exit 0" test "$BG_RC" = 0
check "SIGTERM received, checkpoint at the agreed step" \
  test -n "$STOP" -a -f "$(ckpt "$TMP/term" "${STOP:-0}")"

echo "== --requeue-exit-code"
preempt requeue USR1 mpirun --requeue-exit-code 99
check "exit 99" test "$BG_RC" = 99
check "it says why" grep -qF "exiting with code 99 (--requeue-exit-code)" "$TMP/requeue.out"
check "the checkpoint is there" test -n "$STOP" -a -f "$(ckpt "$TMP/requeue" "${STOP:-0}")"
CASE="--requeue-exit-code 300 is a usage error"
expect_fail 2 "--requeue-exit-code" -- "$DPTRAIN" train --config "$CONFIG" \
  --requeue-exit-code 300

echo "== a second signal during the checkpoint write"
S=$TMP/second
DPTRAIN_TEST_CHECKPOINT_PAUSE_S=3 bg_start second "${MPI2[@]}" "$DPTRAIN_HOOKED" train \
  --config "$CONFIG" --set "run_dir=$S" "${STEPS[@]}"
if wait_for "$TMP/second.out" "step 10/200" 60; then
  kill -USR1 "$BG_PID"
  if wait_for "$TMP/second.err" "test hook: pausing" 30; then
    pid=$(sed -n 's/.*(pid \([0-9]*\)).*/\1/p' "$TMP/second.err" | head -n 1)
    kill -USR1 "$BG_PID"  # forwarded to every rank again
    kill -TERM "$pid"     # and a SIGTERM straight to rank 0, the writer
    pass "second and third signal sent while rank 0 (pid $pid) writes"
  else
    fail "the preemption checkpoint write never reached the test hook"
  fi
fi
bg_wait 60
STOP=$(sed -n 's/.* received: every rank stops after step \([0-9]*\) .*/\1/p' "$TMP/second.out")
check "exit 0 after the extra signals" test "$BG_RC" = 0
check "the checkpoint is complete and verifies" ckpt_py valid "$(ckpt "$S" "${STOP:-0}")"
check "no temporary file left" bash -c "! ls -A '$S/checkpoints' | grep -q tmp"
check "it says the extra signals changed nothing" \
  grep -qF "stop signals received on this rank; the first one counted" "$TMP/second.out"

echo "== SIGTERM to mpirun (Open MPI: the job is terminated, ranks get SIGTERM late)"
# Open MPI 4 does not forward SIGTERM: it sends SIGCONT, then SIGTERM after
# odls_base_sigkill_timeout seconds, then SIGKILL after as long again, and exits 1.
OMPI_MCA_odls_base_sigkill_timeout=3 preempt mpirun-term TERM mpirun --set train.max_steps=5000
check "the ranks still got SIGTERM and agreed on a step" test -n "$STOP"
check "the checkpoint at that step verifies" ckpt_py valid "$(ckpt "$TMP/mpirun-term" "${STOP:-0}")"
echo "  mpirun's own exit code after SIGTERM: $BG_RC (Open MPI reports a terminated job)"

finish
