#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Failures never hang (DESIGN.md section 4), end to end with 4 ranks on Fashion-MNIST:
#   - SIGKILL one rank (rank 2) mid-training: every process of the job is gone within 30 s, the
#     launcher exits non-zero, and the last checkpoint written before the kill is intact (every
#     tensor's crc32 verifies in `dptrain inspect`, and a new run resumes from it);
#   - SIGSTOP one rank (rank 2) mid-training: the collective watchdog fires within
#     dist.collective_timeout_s (5 s here) plus slack, rank 0's message names rank 2 as the rank
#     that did not arrive, the job exits 5 and no process is left (the stopped one included);
#   - a rank that SIGKILLs itself with its gradient allreduce in flight (2 ranks, the test hook
#     DPTRAIN_TEST_KILL_IN_COLLECTIVE; cuda.fmnist runs the same case over NCCL): every rank is
#     gone within dist.collective_timeout_s + 10 s, and the output names the rank.
# Skipped (exit 77) without the converted data (make data).
# shellcheck disable=SC2034  # CASE is read by lib.sh's expect_ok
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_fmnist

cd "$DPTRAIN_SRC" || exit 1
COMMON=(train --config configs/fmnist_cnn.toml --set train.max_steps=5000
  --set train.log_every_steps=5 --set checkpoint.every_epochs=0 --set data.workers=1
  --set "data.train=$DPTRAIN_DATA/fmnist/train.h5" --set "data.test=$DPTRAIN_DATA/fmnist/test.h5")

last_step() {  # METRICS: the last step line's step, or 0
  python3 -c '
import json, sys
s = [j["step"] for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "step"]
print(s[-1] if s else 0)' "$1" 2>/dev/null || echo 0
}
# rank_pid TAG RANK: the PID of the dptrain process of world rank RANK in the tagged job.
rank_pid() {
  local pid
  for pid in $(tagged_pids "$1"); do
    if [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == *dptrain\ train* ]] &&
      tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}
# start_job TAG RUN_DIR ARGS...: mpirun -np 4 in the background (bounded to 300 s); JOB_PID.
start_job() {
  local tag=$1 run=$2
  shift 2
  DPTRAIN_IT_TAG=$tag timeout -k 5 300 "${MPI4[@]}" "$DPTRAIN" "${COMMON[@]}" \
    --set "run_dir=$run" "$@" >"$run.out" 2>"$run.err" </dev/null &
  JOB_PID=$!
}
# wait_for_step RUN_DIR STEP JOB_PID: until metrics.jsonl logs STEP (60 s bound).
wait_for_step() {
  local i
  for ((i = 0; i < 600; i++)); do
    (($(last_step "$1/metrics.jsonl") >= $2)) && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# wait_gone JOB_PID TAG SECONDS: the launcher has exited and no tagged process is left; sets
# GONE_S (seconds it took) and JOB_RC.
wait_gone() {
  local pid=$1 tag=$2 limit=$3 t0 i
  t0=$(date +%s.%N)
  for ((i = 0; i < limit * 10; i++)); do
    if ! kill -0 "$pid" 2>/dev/null && [[ -z $(tagged_pids "$tag") ]]; then break; fi
    sleep 0.1
  done
  GONE_S=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  LEFT=$(tagged_pids "$tag" | tr '\n' ' ')
  LAUNCHER_LEFT=0
  kill -0 "$pid" 2>/dev/null && LAUNCHER_LEFT=1
  # Still running past the bound: a failure; end it (SIGKILL also ends a stopped process).
  # shellcheck disable=SC2086  # one PID per word
  [[ -n $LEFT ]] && kill -KILL $LEFT 2>/dev/null
  JOB_RC=0
  wait "$pid" || JOB_RC=$?
}

# ---- SIGKILL one rank ---------------------------------------------------------------------
RUN=$TMP/kill
tag="faults$$k"
start_job "$tag" "$RUN" --set checkpoint.every_steps=10 --set checkpoint.keep=100
if wait_for_step "$RUN" 25 "$JOB_PID" && victim=$(rank_pid "$tag" 2); then
  step=$(last_step "$RUN/metrics.jsonl")
  kill -KILL "$victim"
  echo "SIGKILL to rank 2 (pid $victim) after logged step $step"
  wait_gone "$JOB_PID" "$tag" 30
  check "SIGKILL rank 2: every process gone within 30 s (${GONE_S}s)${LEFT:+; left: $LEFT}" test -z "$LEFT"
  check "SIGKILL rank 2: the launcher exits non-zero (exit $JOB_RC)" \
    test "$LAUNCHER_LEFT" = 0 -a "$JOB_RC" != 0
  ckpt=$(ls "$RUN"/checkpoints/ckpt-*.h5 2>/dev/null | tail -n 1)
  if [[ -n $ckpt ]]; then
    echo "last checkpoint: $ckpt"
    CASE="the last checkpoint is intact: dptrain inspect reads it"
    expect_ok -- "$DPTRAIN" inspect "$ckpt"
    n_ok=$(grep -cE 'crc32 [0-9a-f]{8} ok$' "$TMP/last.out")
    check "  and every tensor's crc32 verifies ($n_ok tensors; verdict: valid)" \
      bash -c "grep -q '^verdict: valid' '$TMP/last.out' && ! grep 'crc32' '$TMP/last.out' | grep -qv ' ok\$'"
    ck_step=$((10#$(basename "$ckpt" .h5 | sed 's/^ckpt-//')))
    CASE="a new run (2 ranks) resumes from it (step $ck_step) and trains 5 more steps"
    expect_ok -- "${MPI2[@]}" "$DPTRAIN" "${COMMON[@]}" --set "run_dir=$RUN" \
      --set train.max_steps=$((ck_step + 5)) --set train.eval_every_epochs=0
    check "  it says it resumed from $(basename "$ckpt")" \
      grep -q "resuming from .*$(basename "$ckpt")" "$TMP/last.out" "$TMP/last.err"
  else
    fail "no checkpoint was written before the kill (checkpoint.every_steps=10, killed after step $step)"
  fi
else
  fail "SIGKILL case: training did not reach step 25 within 60 s"
  tail -n 20 "$RUN.err"
  kill "$JOB_PID" 2>/dev/null
  wait "$JOB_PID" 2>/dev/null
  reap_tagged "$tag" >/dev/null
fi

# ---- SIGSTOP one rank ---------------------------------------------------------------------
RUN=$TMP/stop
tag="faults$$s"
TIMEOUT_S=5
# Every step logged, and 128 samples per rank: the stop below lands in rank 2's forward pass.
start_job "$tag" "$RUN" --set dist.collective_timeout_s=$TIMEOUT_S --set train.log_every_steps=1 \
  --set train.global_batch=512
# SIGSTOP rank 2 within a millisecond of rank 0 logging a step (>= 10): every rank has just left
# that step's last collective, so rank 2 stops computing the next step, outside any collective,
# and the others wait for it in the next one. (Stopped inside a collective it would have
# reported its arrival already, and the watchdog could only say that every rank reached it.)
stop_after_logged_step() {  # METRICS PID STEP: prints the step it stopped after
  python3 - "$@" <<'PY'
import json, os, signal, sys, time
path, pid, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
size, end = -1, time.monotonic() + 60
while time.monotonic() < end:
    try:
        s = os.stat(path).st_size
    except FileNotFoundError:
        s = -1
    if s != size and s > 0:
        size = s
        with open(path, "rb") as f:
            f.seek(max(0, s - 4096))
            last = f.read().decode(errors="replace").strip().splitlines()[-1]
        try:
            j = json.loads(last)
        except ValueError:
            continue
        if j.get("kind") == "step" and j["step"] >= want:
            os.kill(pid, signal.SIGSTOP)
            print(j["step"])
            sys.exit(0)
    time.sleep(0.0002)
sys.exit(1)
PY
}
if victim=$(for ((i = 0; i < 300; i++)); do rank_pid "$tag" 2 && break; sleep 0.2; done) &&
  stopped=$(stop_after_logged_step "$RUN/metrics.jsonl" "$victim" 10); then
  echo "SIGSTOP to rank 2 (pid $victim) right after logged step $stopped"
  wait_gone "$JOB_PID" "$tag" 30
  out="$RUN.err"
  sed 's/^/  | /' "$out" | grep -v '^  | *$' | head -n 20
  bound=$((TIMEOUT_S + 15))
  sigstop_check=check
  $sigstop_check "SIGSTOP rank 2: the job ended within dist.collective_timeout_s=$TIMEOUT_S + 15 s (${GONE_S}s)" \
    awk -v s="$GONE_S" -v b=$bound 'BEGIN { exit !(s <= b) }'
  $sigstop_check "SIGSTOP rank 2: exit code 5 (communication failure), got $JOB_RC" test "$JOB_RC" = 5
  $sigstop_check "SIGSTOP rank 2: the watchdog reports a collective timeout" grep -q 'collective timeout' "$out"
  $sigstop_check "SIGSTOP rank 2: rank 0 names rank 2 as the rank that did not arrive" \
    grep -qE 'ranks that did not arrive: 2( |$|\()' "$out"
  # The step the others waited in (the trainer reports it with Watchdog::SetStep).
  $sigstop_check "SIGSTOP rank 2: the message names the step the job hung at (>= $stopped, not -1)" \
    bash -c "s=\$(grep -oE 'collective timeout: [^;]* at step -?[0-9]+' '$out' | grep -oE -- '-?[0-9]+\$' | head -n 1);
             [[ -n \$s ]] && ((s >= $stopped))"
  $sigstop_check "SIGSTOP rank 2: no process left (the stopped rank included)${LEFT:+: $LEFT}" \
    test -z "$LEFT" -a "$LAUNCHER_LEFT" = 0
else
  fail "SIGSTOP case: rank 2 not found, or training did not log step 10 within 60 s"
  tail -n 20 "$RUN.err"
  kill "$JOB_PID" 2>/dev/null
  wait "$JOB_PID" 2>/dev/null
  reap_tagged "$tag" >/dev/null
fi

# ---- a rank lost mid-allreduce ------------------------------------------------------------
kill_in_collective "rank 1 killed mid-allreduce [2 ranks, MPI]" 5 "${MPI2[@]}" "$DPTRAIN_HOOKED" \
  "${COMMON[@]}" --set "run_dir=$TMP/killcoll" --set train.log_every_steps=1

finish
