#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A real single-node Slurm cluster for tests/integration/slurm.sh: munged, slurmctld and slurmd
# from Debian's packages, run as root without systemd, everything (config, state, logs, PID
# files, munge key and socket) under one directory, on loopback only. The node claims CPUS CPUs
# (default 4, even on a 2-core machine: SlurmdParameters=config_overrides) and FAKE_GPUS fake GPUs
# (default 4) declared through gres: character devices with /dev/null's numbers, so Slurm does
# its real GPU bookkeeping (CUDA_VISIBLE_DEVICES per job and per task) without any hardware.
#
#   slurm_cluster.sh up DIR     write the config, start the daemons (their PIDs in
#                               DIR/run/*.daemon-pid), wait until the node is idle (bounded);
#                               then `. DIR/env` gives SLURM_CONF for sbatch/srun/squeue/scontrol
#   slurm_cluster.sh down DIR   cancel what is left, stop slurmd, slurmctld, munged by their
#                               recorded PIDs (TERM, 10 s, then KILL), remove DIR (KEEP=1 keeps it)
# The two TCP ports are chosen free for each cluster, so clusters of parallel runs do not meet.
set -euo pipefail

die() {
  echo "slurm_cluster: $*" >&2
  exit 1
}

port_free() { ! ss -ltnH "sport = :$1" 2>/dev/null | grep -q .; }

cmd_up() {
  local R=$1 cpus=${CPUS:-4} gpus=${FAKE_GPUS:-4} mem=${MEM_MB:-8000} i p ctl_port='' d_port='' state=''
  for t in munged mungekey slurmctld slurmd sbatch sinfo; do
    command -v $t >/dev/null || die "$t is missing (scripts/install-deps.sh --cluster-tests)"
  done
  [[ -f $R/run/slurmctld.daemon-pid ]] && kill -0 "$(cat "$R/run/slurmctld.daemon-pid")" 2>/dev/null &&
    die "a cluster under $R is still running (slurm_cluster.sh down $R)"
  mkdir -p "$R"/{state,spool,log,run,dev,munge}
  chmod 755 "$R" "$R/munge"  # munged insists that its socket directory is searchable by all
  # Two free ports, starting from a PID-dependent point in 20000-39999.
  p=$((20000 + ($$ * 7) % 20000))
  for ((i = 0; i < 2000; i++)); do
    p=$((p >= 39999 ? 20000 : p + 1))
    port_free $p || continue
    if [[ -z $ctl_port ]]; then ctl_port=$p; else d_port=$p && break; fi
  done
  [[ -n $d_port ]] || die "no free TCP ports found"

  local gpu_files=
  if ((gpus > 0)); then
    for ((i = 0; i < gpus; i++)); do mknod -m 666 "$R/dev/nvidia$i" c 1 3; done
    gpu_files="$R/dev/nvidia[0-$((gpus - 1))]"
  fi
  cat >"$R/slurm.conf" <<CONF
ClusterName=dptrainit
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$R/munge/munge.sock
StateSaveLocation=$R/state
SlurmdSpoolDir=$R/spool
SlurmctldPidFile=$R/run/slurmctld.pid
SlurmdPidFile=$R/run/slurmd.pid
SlurmctldLogFile=$R/log/slurmctld.log
SlurmdLogFile=$R/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: /proc process tracking, no task binding (CI containers rarely allow cgroups).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Open MPI's mpirun starts its daemons with srun; srun --mpi=pmix is asked for explicitly.
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
# Trust the CPU count below although the machine may have fewer cores.
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=5
Waittime=0
# Requeued jobs (slurm/preemptible.sbatch) may start again at once.
SchedulerParameters=bf_interval=1
JobRequeue=1
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem${gpu_files:+ Gres=gpu:$gpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  {
    echo "AutoDetect=off"
    [[ -n $gpu_files ]] && echo "NodeName=localhost Name=gpu File=$gpu_files"
  } >"$R/gres.conf"
  : >"$R/cgroup.conf"  # read by some code paths even with cgroups off
  echo "export SLURM_CONF=$R/slurm.conf" >"$R/env"
  export SLURM_CONF=$R/slurm.conf

  # Daemons in the foreground (-F / -D) under setsid: $! is the daemon's own PID.
  start() {
    local name=$1
    shift
    setsid "$@" </dev/null >"$R/log/$name.out" 2>&1 &
    echo $! >"$R/run/$name.daemon-pid"
  }
  mungekey -c -k "$R/munge/munge.key"
  start munged munged -F --socket="$R/munge/munge.sock" --key-file="$R/munge/munge.key" \
    --pid-file="$R/munge/munged.pid" --log-file="$R/log/munged.log" --seed-file="$R/munge/munged.seed"
  for ((i = 0; i < 100; i++)); do
    [[ -S $R/munge/munge.sock ]] && break
    sleep 0.1
  done
  munge -S "$R/munge/munge.sock" -n | unmunge -S "$R/munge/munge.sock" >/dev/null ||
    die "munged does not answer (log: $R/log/munged.log)"
  start slurmctld slurmctld -D -i -f "$R/slurm.conf"
  start slurmd slurmd -D -N localhost -f "$R/slurm.conf"

  for ((i = 0; i < 300; i++)); do  # 60 s
    state=$(timeout 10 sinfo -h -N -n localhost -o %T 2>/dev/null || true)
    [[ $state == idle ]] && return 0
    for d in munged slurmctld slurmd; do
      kill -0 "$(cat "$R/run/$d.daemon-pid")" 2>/dev/null ||
        { tail -n 20 "$R/log/$d.out" "$R/log/$d.log" 2>/dev/null >&2; die "$d exited during start"; }
    done
    sleep 0.2
  done
  tail -n 20 "$R"/log/*.log >&2
  die "the node is '$state', not idle, after 60 s"
}

cmd_down() {
  local R=$1 rc=0 d f pid i
  export SLURM_CONF=$R/slurm.conf
  if [[ -f $R/run/slurmctld.daemon-pid ]] && kill -0 "$(cat "$R/run/slurmctld.daemon-pid")" 2>/dev/null; then
    timeout 10 scancel --quiet --user=root 2>/dev/null || true
  fi
  for d in slurmd slurmctld munged; do
    f=$R/run/$d.daemon-pid
    [[ -f $f ]] || continue
    pid=$(cat "$f")
    # Only signal the PID if it is still the program this script started.
    if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "^$d "; then
      kill -TERM "$pid"
      for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      if kill -0 "$pid" 2>/dev/null; then
        echo "slurm_cluster: $d ($pid) ignored TERM for 10 s, killing it" >&2
        kill -KILL "$pid"
        rc=1
      fi
    fi
    rm -f "$f"
  done
  [[ ${KEEP:-0} == 1 ]] || rm -rf "$R"
  return $rc
}

case "${1:-}" in
  up) cmd_up "${2:?DIR}" ;;
  down) cmd_down "${2:?DIR}" ;;
  *) die "usage: $0 up DIR | down DIR" ;;
esac
