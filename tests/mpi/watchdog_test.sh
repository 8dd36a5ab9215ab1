#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The collective watchdog ends a hung job: 4 ranks, rank 2 never reaches a barrier; within the
# 2 s timeout (+ slack) every process is gone, the exit code is 5 and rank 0 names rank 2.
set -u
probe=$1; shift
mpiexec=$1; shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
timeout -k 5 30 "$mpiexec" -n 4 "$@" "$probe" 2 2 > "$out" 2>&1
code=$?
elapsed=$(( $(date +%s) - start ))
cat "$out"
fail=0
[ "$code" = 5 ] || { echo "FAIL: exit code $code, expected 5"; fail=1; }
grep -q 'collective timeout: barrier at step 3' "$out" || { echo "FAIL: no timeout message"; fail=1; }
grep -q 'ranks that did not arrive: 2 (last seen in barrier at step 2' "$out" ||
  { echo "FAIL: rank 0 did not name rank 2"; fail=1; }
[ "$elapsed" -le 20 ] || { echo "FAIL: took ${elapsed}s"; fail=1; }
# Every process gone (zombies awaiting their parent's reaping count as gone) within 5 s.
left=1
for _ in 1 2 3 4 5; do
  left=$(ps -o stat= -C watchdog_probe | grep -vc Z)
  [ "$left" = 0 ] && break
  sleep 1
done
[ "$left" = 0 ] || { echo "FAIL: $left processes left behind"; pkill -9 -x watchdog_probe; fail=1; }
# Stopped INSIDE the collective (it reported arriving): rank 0 still names it, from the silence
# of its heartbeats.
# (A 5 s timeout: it reports, then keeps its heartbeats 2 s, then is silent for 3 s > 1.5 s.)
timeout -k 5 30 "$mpiexec" -n 4 "$@" "$probe" 2 5 inside > "$out" 2>&1
code2=$?
cat "$out"
[ "$code2" = 5 ] || { echo "FAIL: (inside) exit code $code2, expected 5"; fail=1; }
grep -q 'ranks that did not arrive: 2 (in barrier at step 3 but silent for' "$out" ||
  { echo "FAIL: (inside) rank 0 did not name the silent rank 2"; fail=1; }
pkill -9 -x watchdog_probe 2>/dev/null
echo "watchdog: exit $code after ${elapsed}s"
[ $fail = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
