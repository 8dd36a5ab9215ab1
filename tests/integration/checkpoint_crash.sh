#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Crash safety: rank 0 of a 2-rank run is SIGKILLed while it writes the step-10 checkpoint (the
# test hook DPTRAIN_TEST_CHECKPOINT_PAUSE_S parks the writer with half of the temporary file on
# disk, which makes the timing certain). The step-5 checkpoint still verifies, only a
# .ckpt-*.tmp holds the partial write, and resume = auto removes that temporary, resumes from
# step 5 and ends bitwise equal to an uninterrupted run. A torn file under a final name (what a
# non-atomic writer would leave) is reported and skipped, never picked.
# shellcheck disable=SC2034  # CASE is read by expect_ok / expect_fail (lib.sh)
# shellcheck source=checkpoint_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/checkpoint_common.sh"

STEPS=(--set train.max_steps=20 --set checkpoint.every_steps=5 --set checkpoint.keep=5)

echo "== uninterrupted reference"
CASE="2 ranks, 20 steps"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/ref" "${STEPS[@]}"

echo "== SIGKILL rank 0 in the middle of the step-10 write"
R=$TMP/run
DPTRAIN_TEST_CHECKPOINT_PAUSE_S=60 DPTRAIN_TEST_CHECKPOINT_PAUSE_STEP=10 \
  bg_start crash "${MPI2[@]}" "$DPTRAIN_HOOKED" train --config "$CONFIG" --set "run_dir=$R" "${STEPS[@]}"
if wait_for "$TMP/crash.err" "test hook: pausing" 60; then
  pid=$(sed -n 's/.*test hook: pausing .* (pid \([0-9]*\)).*/\1/p' "$TMP/crash.err" | head -n 1)
  echo "  writer paused in rank 0 (pid $pid): $(grep -F 'test hook' "$TMP/crash.err")"
  check "the paused process is a dptrain rank" grep -q dptrain "/proc/$pid/cmdline"
  kill -9 "$pid"
  pass "rank 0 killed with SIGKILL during the write"
else
  fail "the writer never reached the test hook"
  tail -n 5 "$TMP/crash.err"
fi
bg_wait 60
check "the job failed (mpirun exit $BG_RC)" test "$BG_RC" -ne 0
check "the step-5 checkpoint exists and verifies" ckpt_py valid "$(ckpt "$R" 5)"
check "the interrupted write left only a temporary: .ckpt-00000010.h5.tmp" \
  test -f "$R/checkpoints/.ckpt-00000010.h5.tmp"
check "the temporary is partial (smaller than a complete checkpoint)" test \
  "$(stat -c %s "$R/checkpoints/.ckpt-00000010.h5.tmp")" -lt "$(stat -c %s "$(ckpt "$R" 5)")"
check "no ckpt-00000010.h5 under the final name" test ! -e "$(ckpt "$R" 10)"
CASE="dptrain inspect: the step-5 checkpoint is valid"
expect_ok -- "$DPTRAIN" inspect "$(ckpt "$R" 5)"
check "verdict valid" grep -qF "verdict: valid" "$TMP/last.out"

echo "== resume = auto after the crash"
CASE="2 ranks resume"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$R" "${STEPS[@]}"
check "it resumes from step 5" grep -qF "resuming from $(ckpt "$R" 5): step 5" "$TMP/last.out"
check "it removes the partial temporary" \
  grep -qF "removed $R/checkpoints/.ckpt-00000010.h5.tmp" "$TMP/last.out"
check "the resumed run ends bitwise equal to the uninterrupted one" \
  ckpt_py same "$(ckpt "$R" 20)" "$(ckpt "$TMP/ref" 20)"

echo "== a torn file under a final name is never picked"
T=$TMP/torn
mkdir -p "$T/checkpoints"
cp "$(ckpt "$TMP/ref" 10)" "$(ckpt "$TMP/ref" 15)" "$T/checkpoints/"
size=$(stat -c %s "$(ckpt "$TMP/ref" 15)")
head -c $((size - 100000)) "$(ckpt "$TMP/ref" 15)" >"$(ckpt "$T" 15)"
CASE="resume = auto with a torn ckpt-00000015.h5"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$T" "${STEPS[@]}"
check "the torn file is reported by name on stderr, once" \
  last_err_count "skipping an invalid checkpoint: [rank 0/2 $(hostname)] " 1
check "... naming the file" grep -qF "checkpoint $(ckpt "$T" 15)" "$TMP/last.err"
check "the run resumes from step 10" grep -qF "resuming from $(ckpt "$T" 10): step 10" "$TMP/last.out"
check "and still ends bitwise equal to the uninterrupted run" \
  ckpt_py same "$(ckpt "$T" 20)" "$(ckpt "$TMP/ref" 20)"

finish
