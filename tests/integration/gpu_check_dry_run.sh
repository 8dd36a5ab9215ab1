#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/gpu-check.sh cannot rot between GPU runs (issue 62): its dry run (as on a machine
# without a GPU) runs every tier, each of which says "skipped: no GPU" where it needs the GPU,
# in well under a minute, and writes the run's folder as a GPU run would (at most 7 files, the
# device tool returns 8). The rotation (scripts/gpu_rotation.py): never-run cases first, then
# the oldest, as many as fit by their last times; gtest output read into results, a case cut
# off by the time limit included.
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
build=$(cd "$(dirname "$DPTRAIN")/.." && pwd)
ROT=$DPTRAIN_SRC/scripts/gpu_rotation.py

start=$SECONDS
bash "$DPTRAIN_SRC/scripts/gpu-check.sh" --build "$build" --out "$TMP/out" --dry-run \
  >"$TMP/check.out" 2>&1
rc=$?
secs=$((SECONDS - start))
sed 's/^/  | /' "$TMP/check.out" | grep -v 'would run'
check "the dry run exits 0 (exit $rc)" test "$rc" = 0
check "the dry run takes well under a minute (${secs}s)" test "$secs" -lt 30
run=$(find "$TMP/out" -mindepth 1 -maxdepth 1 -type d -name '*-nogpu' | head -1)
check "the run's folder is DATE-TIME-nogpu" test -n "$run"
for t in 1 2 3 4; do
  check "tier $t ran and is in the summary" grep -q "^tier $t (" "$run/summary.txt"
done
for t in 2 3 4; do
  check "tier $t says 'skipped: no GPU'" grep -q "^tier $t .*0 failed, 1 skipped" "$run/summary.txt"
done
check "every tier's budget and time are in timings.tsv" test "$(wc -l <"$run/timings.tsv")" = 5
check "tier 1 shows dptrain info" grep -q '^backends built: ' "$run/env.log"
check "tier 1: mpirun -np 2 starts two processes" grep -q 'RESULT pass mpirun -np 2 starts' \
  "$run/env.log"
check "tier 1: two ranks train on the CPU" grep -q 'RESULT pass mpirun -np 2 dptrain train' \
  "$run/env.log"
if [[ -x $build/tests/cuda/cuda_tests ]]; then
  check "tier 3 picks cases in rotation" grep -Eq 'this run takes [1-9][0-9]* of them' \
    "$run/tier3.log"
else
  skip "tier 3's cases: this build has no CUDA backend"
fi
check "tier 4 picks a speed row" grep -q 'speed row this run: resnet' "$run/tier4.log"
files=$(find "$run" -type f | wc -l)
check "at most 7 files in the run's folder ($files)" test "$files" -le 7

# The rotation on a state of its own.
printf '# case\tlast run (UTC)\tresult\tseconds\n' >"$TMP/state"
printf 'a\t2026-12-01T10:00Z\tpass\t4.0\nb\t2026-12-03T10:00Z\tpass\t1.0\n' >>"$TMP/state"
printf 'c\t2026-12-02T10:00Z\tpass\t50.0\n' >>"$TMP/state"
picked=$(printf 'a\nb\nc\nd\n' | python3 "$ROT" pick --state "$TMP/state" --budget 10 --guess 2 |
  paste -sd' ' -)
check "pick: never run first, then oldest, skipping what does not fit ($picked)" \
  test "$picked" = "d a b"
cat >"$TMP/gtest.out" <<'GTEST'
[ RUN      ] S.One
[       OK ] S.One (1500 ms)
[ RUN      ] S.Two
[  FAILED  ] S.Two (20 ms)
[ RUN      ] S.Three
[  SKIPPED ] S.Three (0 ms)
[ RUN      ] S.Four
GTEST
python3 "$ROT" gtest --cut 30 <"$TMP/gtest.out" >"$TMP/results"
check "gtest: pass, FAIL, skip and the case cut off" diff <(printf 'S.One\tpass\t1.5\nS.Two\tFAIL\t0.0\nS.Three\tskip\t0.0\nS.Four\tcut\t30.0\n') "$TMP/results"
python3 "$ROT" update --state "$TMP/state" --out "$TMP/state2" --when 2026-12-08T09:00Z \
  <"$TMP/results"
check "update: results replace the old lines, the rest stays" \
  grep -q -P '^S.Four\t2026-12-08T09:00Z\tcut\t30.0$' "$TMP/state2"
check "update keeps the cases not run" grep -q -P '^c\t2026-12-02T10:00Z\tpass\t50.0$' "$TMP/state2"
finish
