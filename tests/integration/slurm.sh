#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Slurm batch scripts on a real Slurm: brings up a single-node cluster (munged, slurmctld,
# slurmd from Debian's packages, tests/integration/slurm_cluster.sh; 4 CPUs and 4 fake GPUs
# declared through gres) under the test's temp dir, and
#   - submits slurm/train.sbatch (mpirun in the allocation) and slurm/train-srun.sbatch
#     (srun --mpi=pmix) for a short Fashion-MNIST run with 2 tasks: state COMPLETED, exit 0:0,
#     metrics.jsonl, a rank table with local ranks 0/2 and 1/2, the same losses both ways;
#   - train.sbatch's time-limit warning by hand (scancel --batch --signal=USR1): mpirun forwards
#     it, the ranks checkpoint and the job completes with exit 0;
#   - runs `dptrain info` in jobs under --gpus-per-node=4 (mpirun and srun) and
#     --gpus-per-task=1 and =2 (srun) and checks the GPU each task would get;
#   - preempts for real: `scancel --signal=USR1` on a running slurm/preemptible.sbatch job ->
#     checkpoint, requeue (same job id, Restarts=1), the resumed run finishes, and its final
#     evaluation and final parameters equal those of the uninterrupted srun run exactly.
# Every wait is bounded; the daemons are stopped by their recorded PIDs on exit.
# Skipped (exit 77) without root, without Slurm/munge installed (scripts/install-deps.sh
# --cluster-tests; `make test` installs them) or without the data.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_fmnist
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [[ $(id -u) != 0 ]]; then
  echo "SKIP: the test cluster's slurmd runs jobs as root and needs root to start"
  exit 77
fi
for tool in munged mungekey slurmctld slurmd sbatch scontrol scancel; do
  if ! command -v $tool >/dev/null; then
    echo "SKIP: $tool is missing (scripts/install-deps.sh --cluster-tests installs Slurm and munge)"
    exit 77
  fi
done

CL=$TMP/cluster
chmod 755 "$TMP"  # munged refuses a socket below a directory that others cannot search
stop_cluster() {
  local t=$SECONDS
  KEEP=${DPTRAIN_IT_KEEP:-0} bash "$here/slurm_cluster.sh" down "$CL" || echo "note: a daemon needed SIGKILL"
  echo "cluster stopped ($((SECONDS - t))s)"
  cleanup
}
trap stop_cluster EXIT
t=$SECONDS
if ! bash "$here/slurm_cluster.sh" up "$CL"; then
  fail "start the Slurm cluster"
  tail -n 20 "$CL"/log/*.log 2>/dev/null
  finish
fi
# shellcheck disable=SC1091
. "$CL/env"
pass "Slurm cluster up ($((SECONDS - t))s): $(sinfo -h -N -o '%N %T cpus=%c gres=%G')"

# Jobs inherit this environment (sbatch --export=ALL): DPTRAIN (the binary the scripts run),
# SLURM_CONF, and lib.sh's Open MPI settings for a small shared machine.
export DPTRAIN
CONFIG=$DPTRAIN_SRC/configs/fmnist_cnn.toml
STEPS=200
TRAIN_ARGS=(--set "train.max_steps=$STEPS" --set train.log_every_steps=10
  --set checkpoint.every_epochs=0 --set data.workers=1
  --set "data.train=$DPTRAIN_DATA/fmnist/train.h5" --set "data.test=$DPTRAIN_DATA/fmnist/test.h5")
# What the test cluster offers: 4 CPUs, 4 GPUs. The scripts ask for 8 CPUs per task (a real
# node); 2 tasks x 1 CPU here.
SMALL=(--ntasks=2 --ntasks-per-node=2 --cpus-per-task=1 --chdir="$TMP")

state_of() {  # JOBID -> "JobState=X Restarts=n ExitCode=a:b"
  scontrol show job "$1" 2>/dev/null | grep -oE '(JobState|ExitCode|Restarts)=[^ ]+' | paste -sd' '
}
# True when no process of job JOBID is left on this node (its slurmstepd, named
# "slurmstepd: [JOBID.batch]" / "[JOBID.0]", and everything started with SLURM_JOB_ID=JOBID).
job_gone() {
  local d
  for d in /proc/[0-9]*; do
    if { tr '\0' '\n' <"$d/cmdline"; } 2>/dev/null | head -n 1 | grep -q "^slurmstepd: \[$1\." ||
      { tr '\0' '\n' <"$d/environ"; } 2>/dev/null | grep -qx "SLURM_JOB_ID=$1"; then
      return 1
    fi
  done
  return 0
}
# job_ended JOBID: the job is in a final state. Not "neither RUNNING nor PENDING": scontrol can
# fail for a moment on a busy machine (an empty state) and a job passes through CONFIGURING and
# COMPLETING; a poll loop that stopped on those missed its whole job (CI, 2026-11-28).
job_ended() { final_state "$(state_of "$1")"; }
final_state() {  # STATE (state_of's line): a final JobState
  case $1 in
    *JobState=COMPLETED* | *JobState=FAILED* | *JobState=CANCELLED* | *JobState=TIMEOUT* | \
      *JobState=NODE_FAIL* | *JobState=OUT_OF_MEMORY* | *JobState=BOOT_FAIL* | *JobState=DEADLINE*)
      return 0 ;;
  esac
  return 1
}
# wait_job JOBID SECONDS: waits until the job has ended (bounded; cancels it at the limit).
# Slurm holds a requeued job for about 2 minutes before it may start again; the test moves its
# begin time to now, but only once every process of the previous run is gone (the same job id
# starting while the old batch step still reports its exit makes Slurm end the new run).
wait_job() {
  local jid=$1 limit=$2 s end=$((SECONDS + $2)) pending_since=-1
  while ((SECONDS < end)); do
    s=$(state_of "$jid")
    case $s in
      *JobState=PENDING*Restarts=[1-9]*)
        ((pending_since < 0)) && pending_since=$SECONDS
        # (a job of another test cluster with the same id could keep job_gone false: 30 s cap)
        if { job_gone "$jid" && sleep 1 && job_gone "$jid"; } || ((SECONDS - pending_since > 30)); then
          scontrol update JobId="$jid" StartTime=now 2>/dev/null || true
        fi ;;
    esac
    final_state "$s" && return 0
    sleep 0.5
  done
  echo "  job $jid still not finished after ${limit}s ($(state_of "$jid")): cancelling it"
  scancel "$jid"
  return 1
}
completed_ok() {  # JOBID: COMPLETED with exit 0:0
  local s
  s=$(state_of "$1")
  [[ $s == *JobState=COMPLETED* && $s == *ExitCode=0:0* ]]
}
last_step() {  # METRICS: the last step line's step, or 0 (a line still being written is skipped)
  python3 -c '
import json, sys
s = 0
for line in open(sys.argv[1]):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j.get("kind") == "step":
        s = j["step"]
print(s)' "$1" 2>/dev/null || echo 0
}
final_eval() {  # METRICS: the last eval line, as "test_loss test_accuracy"
  python3 -c '
import json, sys
e = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "eval"]
print(repr(e[-1]["test_loss"]), repr(e[-1]["test_accuracy"]))' "$1" 2>/dev/null
}
show_job() {  # JOBID OUTFILE: for a failure
  echo "  --- $(state_of "$1")"
  tail -n 25 "$2" 2>/dev/null | sed 's/^/  | /'
}

# ---- 1 and 2: the two launch styles ---------------------------------------------------------
for style in mpirun srun; do
  script=$DPTRAIN_SRC/slurm/train.sbatch
  extra=(--gpus-per-node=4)
  if [[ $style == srun ]]; then
    script=$DPTRAIN_SRC/slurm/train-srun.sbatch
    extra=()  # the script's own --gpus-per-task=1
  fi
  out=$TMP/$style.out
  t=$SECONDS
  jid=$(sbatch --parsable "${SMALL[@]}" "${extra[@]}" --output="$out" "$script" \
    "$CONFIG" "${TRAIN_ARGS[@]}" --set "run_dir=$TMP/run-$style")
  wait_job "$jid" 300
  if completed_ok "$jid"; then
    pass "slurm/$(basename "$script") ($style): job $jid COMPLETED, exit 0:0 ($((SECONDS - t))s)"
  else
    fail "slurm/$(basename "$script") ($style): job $jid"
    show_job "$jid" "$out"
  fi
  check "  $style: metrics.jsonl reaches step $STEPS" \
    test "$(last_step "$TMP/run-$style/metrics.jsonl")" = $STEPS
  check "  $style: the rank table shows local ranks 0/2 and 1/2 with 1 thread each (OMP_NUM_THREADS from --cpus-per-task)" \
    bash -c "grep -qE '^0 +[^ ]+ +0/2 +[^ ]+ +1\$' '$out' && grep -qE '^1 +[^ ]+ +1/2 +[^ ]+ +1\$' '$out'"
done
check "mpirun and srun runs have the same final evaluation" \
  test "$(final_eval "$TMP/run-mpirun/metrics.jsonl")" = "$(final_eval "$TMP/run-srun/metrics.jsonl")"

# train.sbatch's time-limit warning (--signal=B:USR1@120) by hand: SIGUSR1 to the batch shell,
# which is mpirun; mpirun forwards it to the ranks, which checkpoint and exit 0.
out=$TMP/mpirun-usr1.out
run=$TMP/run-mpirun-usr1
jid=$(sbatch --parsable "${SMALL[@]}" --gpus-per-node=4 --output="$out" \
  "$DPTRAIN_SRC/slurm/train.sbatch" "$CONFIG" "${TRAIN_ARGS[@]}" --set "run_dir=$run")
signalled=0
for ((i = 0; i < 600; i++)); do  # 120 s
  if (($(last_step "$run/metrics.jsonl") >= 10)); then
    scancel --batch --signal=USR1 "$jid" && signalled=1
    break
  fi
  job_ended "$jid" && break
  sleep 0.2
done
wait_job "$jid" 300
stopped=$(grep -oE 'preempted by SIGUSR1 at step [0-9]+' "$out" | grep -oE '[0-9]+$')
if ((signalled)) && completed_ok "$jid" && [[ -n $stopped && $stopped -lt $STEPS ]] &&
  [[ -f $run/checkpoints/ckpt-$(printf %08d "$stopped").h5 ]]; then
  pass "train.sbatch: SIGUSR1 to the batch shell (mpirun) -> checkpoint at step $stopped, exit 0:0"
else
  fail "train.sbatch: SIGUSR1 to the batch shell (signalled=$signalled, stopped at '${stopped}')"
  show_job "$jid" "$out"
fi

# slurm/imagenet_resnet50.sbatch (issue 14's recipe on 2 nodes x 4 GPUs) runs train.sbatch with
# configs/imagenet_resnet50.toml: here on the one test node, shrunk to Fashion-MNIST on the CPU.
out=$TMP/imagenet.out
jid=$(DPTRAIN_SLURM_DIR=$DPTRAIN_SRC/slurm DPTRAIN_CONFIG=$DPTRAIN_SRC/configs/imagenet_resnet50.toml \
  sbatch --parsable "${SMALL[@]}" --nodes=1 --gpus-per-node=4 --output="$out" \
  "$DPTRAIN_SRC/slurm/imagenet_resnet50.sbatch" "${TRAIN_ARGS[@]}" --set "run_dir=$TMP/run-imagenet" \
  --set model.name=ref_cnn --set model.classes=10 --set data.augment=none --set data.crop=0 \
  --set "data.mean=[0.286]" --set "data.std=[0.353]" --set dist.device=cpu \
  --set train.precision=fp32 --set train.warmup_steps=0 --set train.global_batch=64 \
  --set train.max_steps=20)
wait_job "$jid" 300
if completed_ok "$jid" && grep -q "config .*configs/imagenet_resnet50.toml" "$out" &&
  [[ $(last_step "$TMP/run-imagenet/metrics.jsonl") == 20 ]]; then
  pass "slurm/imagenet_resnet50.sbatch: train.sbatch with the ImageNet config, job $jid COMPLETED"
else
  fail "slurm/imagenet_resnet50.sbatch: job $jid"
  show_job "$jid" "$out"
fi

# ---- 3: GPU binding with fake GPUs ----------------------------------------------------------
# Each task prints Slurm's CUDA_VISIBLE_DEVICES and its local-rank variables, then `dptrain info`.
probe='echo "task ${OMPI_COMM_WORLD_RANK:-$SLURM_PROCID} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"; exec "$DPTRAIN" info'
info_job() {  # NAME SBATCH-OPTIONS... -- LAUNCHER...
  local name=$1 opts=() jid
  shift
  while [[ $1 != -- ]]; do opts+=("$1"); shift; done
  shift
  jid=$(sbatch --parsable "${SMALL[@]}" "${opts[@]}" --output="$TMP/info-$name.out" \
    --wrap "$* bash -c '$probe'")
  wait_job "$jid" 120
  if completed_ok "$jid"; then
    pass "dptrain info in a job: $name"
  else
    fail "dptrain info in a job: $name"
    show_job "$jid" "$TMP/info-$name.out"
  fi
}
# task_sees NAME TASK CVD: task TASK saw CUDA_VISIBLE_DEVICES=CVD
task_sees() { grep -qx "task $2 CUDA_VISIBLE_DEVICES=$3" "$TMP/info-$1.out"; }
info_job per-node-mpirun --gpus-per-node=4 -- mpirun --bind-to none
info_job per-node-srun --gpus-per-node=4 -- srun --mpi=pmix
info_job per-task-srun --gpus-per-task=1 -- srun --mpi=pmix
info_job two-per-task-srun --gpus-per-task=2 -- srun --mpi=pmix
for n in per-node-mpirun per-node-srun per-task-srun two-per-task-srun; do
  sed "s/^/  $n | /" "$TMP/info-$n.out"
done
# binds INFO-NAME LOCAL-RANK ENTRY SLOT LIST: `dptrain info` shows local rank LOCAL-RANK bound
# to ENTRY, the SLOT-th candidate of CUDA_VISIBLE_DEVICES=LIST (and narrowed to it: remap).
binds() {
  grep -qE "local rank $2 of [0-9]+: $3 \(candidate $4 of CUDA_VISIBLE_DEVICES='$5'\), CUDA_VISIBLE_DEVICES=$3\$" \
    "$TMP/info-$1.out"
}
both() {  # INFO-NAME CHECK...: a bash -c with task_sees/binds defined
  bash -c "$(declare -f task_sees binds); TMP='$TMP'; $*"
}
check "--gpus-per-node=4, mpirun: both ranks see all 4 GPUs (Slurm: CUDA_VISIBLE_DEVICES=0,1,2,3)" \
  both "task_sees per-node-mpirun 0 0,1,2,3 && task_sees per-node-mpirun 1 0,1,2,3"
check "--gpus-per-node=4, mpirun: local ranks 0 and 1 from OMPI_COMM_WORLD_LOCAL_RANK" \
  both "grep -q 'local rank 0 (from OMPI_COMM_WORLD_LOCAL_RANK)' '$TMP/info-per-node-mpirun.out' &&
        grep -q 'local rank 1 (from OMPI_COMM_WORLD_LOCAL_RANK)' '$TMP/info-per-node-mpirun.out'"
check "--gpus-per-node=4, mpirun: dptrain info binds local rank 0 -> GPU 0 and 1 -> GPU 1 (remap)" \
  both "binds per-node-mpirun 0 0 0 0,1,2,3 && binds per-node-mpirun 1 1 1 0,1,2,3"
check "--gpus-per-node=4, srun: both tasks see 0,1,2,3; local ranks 0 and 1 from SLURM_LOCALID" \
  both "task_sees per-node-srun 0 0,1,2,3 && task_sees per-node-srun 1 0,1,2,3 &&
        grep -q 'local rank 0 (from SLURM_LOCALID)' '$TMP/info-per-node-srun.out' &&
        grep -q 'local rank 1 (from SLURM_LOCALID)' '$TMP/info-per-node-srun.out'"
check "--gpus-per-node=4, srun: dptrain info binds local rank 0 -> GPU 0 and 1 -> GPU 1" \
  both "binds per-node-srun 0 0 0 0,1,2,3 && binds per-node-srun 1 1 1 0,1,2,3"
check "--gpus-per-task=1, srun: task 0 sees only GPU 0 and task 1 only GPU 1" \
  both "task_sees per-task-srun 0 0 && task_sees per-task-srun 1 1"
check "--gpus-per-task=1, srun: dptrain info binds each task to its one GPU (the only candidate)" \
  both "binds per-task-srun '[0-9]+' 0 0 0 && binds per-task-srun '[0-9]+' 1 0 1"
check "--gpus-per-task=2, srun: task 0 sees GPUs 0,1 and task 1 sees 2,3" \
  both "task_sees two-per-task-srun 0 0,1 && task_sees two-per-task-srun 1 2,3"
two=$TMP/info-two-per-task-srun.out
check "--gpus-per-task=2, srun: dptrain info knows the local size (2, from SLURM_STEP_TASKS_PER_NODE)" \
  grep -q 'local rank 1 (from SLURM_LOCALID) of 2 (from SLURM_STEP_TASKS_PER_NODE' "$two"
check "--gpus-per-task=2, srun: each task binds the first GPU of its own pair" \
  both "grep -q \"local rank 0 of 2: 0 (candidate 0 of this task's own CUDA_VISIBLE_DEVICES='0,1'\" '$two' &&
        grep -q \"local rank 1 of 2: 2 (candidate 0 of this task's own CUDA_VISIBLE_DEVICES='2,3'\" '$two'"
check "--gpus-per-task=2, srun: dptrain info warns that the second GPU of each pair is idle" \
  grep -q 'warning: srun gave each task 2 GPUs' "$two"

# ---- 4: preemption for real -----------------------------------------------------------------
out=$TMP/preempt.out
run=$TMP/run-preempt
t=$SECONDS
jid=$(sbatch --parsable "${SMALL[@]}" --output="$out" "$DPTRAIN_SRC/slurm/preemptible.sbatch" \
  "$CONFIG" "${TRAIN_ARGS[@]}" --set "run_dir=$run")
# Signal it once training is under way (step 10 logged), long before its last step.
signalled=0
for ((i = 0; i < 600; i++)); do  # 120 s
  step=$(last_step "$run/metrics.jsonl")
  if ((step >= 10)); then
    scancel --signal=USR1 "$jid" && signalled=1
    echo "sent SIGUSR1 to job $jid at logged step $step"
    break
  fi
  job_ended "$jid" && break
  sleep 0.2
done
check "preemptible job $jid got SIGUSR1 (scancel --signal=USR1) while training" test $signalled = 1
wait_job "$jid" 300
if completed_ok "$jid" && [[ $(state_of "$jid") == *Restarts=1* ]]; then
  pass "preemptible job: requeued once (same job id, Restarts=1) and COMPLETED 0:0 ($((SECONDS - t))s)"
else
  fail "preemptible job: $(state_of "$jid")"
  show_job "$jid" "$out"
fi
sed 's/^/  preempt | /' "$out" | grep -E 'preempted|requeue|resuming|checkpoint|done:|final:|restart' || true
stop_ckpt=$(grep -oE 'preempted by SIGUSR1 at step [0-9]+' "$out" | grep -oE '[0-9]+$' | head -n 1)
check "the first run stopped on SIGUSR1 before step $STEPS (at step ${stop_ckpt:-?})" \
  test "${stop_ckpt:-$STEPS}" -lt $STEPS
check "  and rank 0 wrote a checkpoint at that step" \
  test -f "$run/checkpoints/ckpt-$(printf %08d "${stop_ckpt:-0}").h5"
check "  and the job script requeued the job" grep -q 'requeueing job' "$out"
check "the requeued run resumed from that checkpoint" \
  grep -qE "resuming from .*ckpt-$(printf %08d "${stop_ckpt:-0}")\.h5: step ${stop_ckpt:-x}" "$out"
check "the resumed run reached step $STEPS" test "$(last_step "$run/metrics.jsonl")" = $STEPS
ref_eval=$(final_eval "$TMP/run-srun/metrics.jsonl")
got_eval=$(final_eval "$run/metrics.jsonl")
check "final evaluation equals the uninterrupted run's exactly ($got_eval vs $ref_eval)" \
  test -n "$ref_eval" -a "$got_eval" = "$ref_eval"
last=$(printf 'ckpt-%08d.h5' $STEPS)
if find_h5py_python; then
  check "final parameters ($last) equal the uninterrupted run's bit for bit" \
    "$PY" - "$TMP/run-srun/checkpoints/$last" "$run/checkpoints/$last" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = sorted(a["params"])
assert names and names == sorted(b["params"]), (names, sorted(b["params"]))
diff = [n for n in names if not np.array_equal(a["params"][n][()], b["params"][n][()])]
assert not diff, f"differing tensors: {diff}"
print(f"{len(names)} tensors identical")
PY
else
  fail "no python3 with h5py to compare the checkpoints (scripts/install-deps.sh installs python3-h5py)"
fi

finish
