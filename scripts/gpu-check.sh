#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The prepared GPU check: what a GPU machine lent for a few minutes runs, from binaries built on
# the CPU machine (scripts/gpu-bundle.sh), most important first, each tier within its own time
# budget, so that a run cut off still leaves the first tiers' results (docs/gpu.md).
#
#   1. environment (30 s): nvidia-smi, driver, CUDA/cuDNN/cuBLAS/NCCL as found and as dptrain
#      sees them (`dptrain info`), PyTorch's versions, the commit, and whether `mpirun -np 2`
#      starts two processes (if not, the tiers below run their single-process parts only);
#   2. two ranks on one GPU (150 s): the NCCL and 1-vs-2-rank equivalence tests and the
#      Fashion-MNIST runs of tests/cuda/fmnist_gpu.sh, both ranks sharing the GPU through the
#      test hook (NCCL between them over sockets), then compute-sanitizer (memcheck, racecheck)
#      on the equivalence test where the machine has it and time is left;
#   3. single-GPU cases (130 s): conformance (/cuda), cuda_tests, in rotation: the cases that ran
#      longest ago first, as many as fit (docs/gpu-runs/rotation.tsv);
#   4. speed (150 s): bench/gpu.sh on one model and precision, PyTorch's best of 5 processes in
#      the same run, the row
#      that ran longest ago (same rotation file).
#
#   bash scripts/gpu-check.sh [--bundle DIR | --build DIR] [--out DIR] [--budget S] [--dry-run]
#     --bundle DIR  DIR/dptrain-gpu.tar.xz from scripts/gpu-bundle.sh (default .gpu-bundle when
#                   it exists)
#     --build DIR   a build tree's binaries instead (default build)
#     --out DIR     where the run's folder DATE-DEVICE/ goes (default $OUT, else gpu-check-out)
#     --budget S    seconds for the whole check (default 460: under 8 minutes)
#     --dry-run     as on a machine without a GPU: every tier says so (ctest runs this)
#
# The run's folder holds at most 7 files (the device tool returns 8): env.log, tier2.log,
# tier3.log, tier4.log, timings.tsv, rotation.tsv (the updated state, to commit as
# docs/gpu-runs/rotation.tsv) and summary.txt. Exit 0 when every tier that ran passed or was
# skipped, 1 otherwise.
# The tiers' functions run in `gpu-check.sh --tier N`, a call shellcheck does not follow.
# shellcheck disable=SC2317
set -uo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$SRC" || exit 1

# A tier runs as `gpu-check.sh --tier N` under `timeout`, with the setup exported by the parent
# (GC_*), and must end by GC_TIER_END on its own clock (SECONDS).
say() { echo "$*"; }
ok() { echo "RESULT pass $*"; }
bad() { echo "RESULT FAIL $*"; }
skipped() { echo "RESULT skip $*"; }

# run_step NAME SECONDS COMMAND...: a command under its own limit; its result as a RESULT line.
run_step() {
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  local left=$((GC_TIER_END - SECONDS))
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    skipped "$name: not run, the tier's time is spent"
    return 0
  fi
  echo "--- $name (limit ${limit}s): $*"
  timeout -k 5 "$limit" "$@" || rc=$?
  local secs=$((SECONDS - t0))
  case $rc in
    0) ok "$name (${secs}s)" ;;
    77) skipped "$name: skipped by itself (exit 77, ${secs}s)" ;;
    124 | 137) bad "$name: cut at its limit of ${limit}s" ;;
    *) bad "$name: exit $rc (${secs}s)" ;;
  esac
  return 0
}

mpi_env() {
  # As ctest's multi-rank tests: Open MPI as root, oversubscribed, loopback.
  # shellcheck source=scripts/mpi-env.sh
  . "$SRC/scripts/mpi-env.sh"
  export OMP_NUM_THREADS=1
}

tier_1() {
  say "date        $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  say "host        $(uname -n) ($(uname -srm))"
  say "cpu         $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
  say "binaries    $GC_FROM"
  [[ -f $GC_B/MANIFEST ]] && sed -n '1,5s/^/manifest    /p' "$GC_B/MANIFEST"
  say "tree        $(git -C "$SRC" rev-parse HEAD 2>/dev/null || echo 'no git here (see manifest)')"
  say "gpu libs    LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  for l in libnccl.so.2 libcudnn.so.9 libcublas.so.13 libcudart.so.13; do
    say "            $l -> $(ldconfig_find "$l")"
  done
  say
  if [[ $GC_GPU == 0 ]]; then
    say "nvidia-smi: skipped: no GPU${GC_DRY:+ (dry run)}"
    skipped "gpu: no GPU"
  else
    nvidia-smi || true
    nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,compute_cap \
      --format=csv || true
  fi
  say
  say "--- dptrain info"
  timeout 20 "$GC_BIN/dptrain" info 2>&1 || true
  say
  say "--- PyTorch"
  timeout 30 python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
      "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version()
      if torch.cuda.is_available() else "-", "gpu", torch.cuda.is_available())' 2>&1 |
    tail -1 || true
  say
  say "--- mpirun -np 2 ($(command -v mpirun || echo none))"
  mpi_env
  local got
  # shellcheck disable=SC2016 # expanded by each rank's shell
  got=$(timeout 20 mpirun -np 2 sh -c 'echo "rank $OMPI_COMM_WORLD_RANK of $OMPI_COMM_WORLD_SIZE"' \
    2>&1)
  echo "$got"
  if [[ $(grep -c '^rank [01] of 2$' <<<"$got") == 2 ]]; then
    ok "mpirun -np 2 starts two processes"
    touch "$GC_WORK/mpi_ok"
  else
    bad "mpirun -np 2 does not start two processes here: the 2-rank parts are skipped"
    return
  fi
  # MPI itself between two ranks (the binaries' Open MPI, its plugins): a short CPU run.
  GC_TIER_END=$((SECONDS + 20)) run_step "mpirun -np 2 dptrain train on the CPU (3 steps)" 20 \
    mpirun -np 2 "$GC_BIN/dptrain" train --config "$SRC/configs/fmnist_cnn.toml" \
    --set dist.device=cpu --set data.train=synthetic --set data.test= \
    --set data.synthetic_samples=512 --set train.max_steps=3 --set "run_dir=$GC_WORK/cpu2" \
    --set checkpoint.every_epochs=0 --set checkpoint.resume=never
}

tier_2() {
  if [[ $GC_GPU == 0 ]]; then
    skipped "two ranks on one GPU: skipped: no GPU"
    return
  fi
  if [[ ! -f $GC_WORK/mpi_ok ]]; then
    skipped "two ranks on one GPU: mpirun does not start two processes here (tier 1)"
    return
  fi
  mpi_env
  # NCCL says why when it refuses (the log keeps it).
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  run_step "cuda.nccl.np2 (2 ranks, one GPU)" 60 mpirun -np 2 "$GC_BIN/cuda_mpi_nccl"
  run_step "cuda.equivalence.np2 (2 ranks, one GPU)" 60 mpirun -np 2 "$GC_BIN/cuda_mpi_equivalence"
  run_step "cuda.fmnist (1 rank, then 2 ranks sharing the GPU)" 150 \
    env DPTRAIN="$GC_BIN/dptrain" DPTRAIN_HOOKED="$GC_BIN/dptrain_hooked" DPTRAIN_SRC="$SRC" \
    DPTRAIN_DATA="$GC_DATA" MPIEXEC=mpirun bash "$SRC/tests/cuda/fmnist_gpu.sh"
  # compute-sanitizer where the machine has it (a CUDA toolkit; PyTorch's wheels bring none, and
  # the bundle does not carry it): memcheck, then racecheck, over both ranks of the equivalence
  # test, with whatever time the tier has left.
  local cs
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null |
    head -1 || true)
  if [[ -z $cs ]]; then
    skipped "compute-sanitizer: not on this machine"
    return
  fi
  local tool
  for tool in memcheck racecheck; do
    run_step "compute-sanitizer --tool $tool: cuda.equivalence.np2" 90 mpirun -np 2 "$cs" \
      --tool "$tool" --error-exitcode 1 --target-processes all "$GC_BIN/cuda_mpi_equivalence"
  done
}

# The single-GPU cases: "binary:Suite.Case" for every case of cuda_tests and every /cuda
# instance of the conformance suite.
list_cases() {
  local b
  for b in cuda_tests conformance_tests; do
    "$GC_BIN/$b" --gtest_list_tests 2>/dev/null | python3 "$SRC/scripts/gpu_rotation.py" list |
      { if [[ $b == conformance_tests ]]; then grep '/cuda'; else cat; fi; } | sed "s/^/$b:/"
  done
}

tier_3() {
  local budget=$((GC_TIER_END - SECONDS - 10)) picked b filter results
  list_cases >"$GC_WORK/cases"
  python3 "$SRC/scripts/gpu_rotation.py" pick --state "$GC_STATE" --budget "$budget" --guess 1.5 \
    <"$GC_WORK/cases" >"$GC_WORK/picked"
  picked=$(wc -l <"$GC_WORK/picked")
  say "$(wc -l <"$GC_WORK/cases") single-GPU cases; this run takes $picked of them (those that" \
    "ran longest ago, within ${budget}s by their last times; state: $GC_STATE)"
  if [[ $GC_GPU == 0 ]]; then
    sed 's/^/  would run /' "$GC_WORK/picked" | head -5
    skipped "single-GPU cases: skipped: no GPU"
    return
  fi
  : >"$GC_WORK/results"
  for b in cuda_tests conformance_tests; do
    filter=$(sed -n "s/^$b://p" "$GC_WORK/picked" | paste -sd: -)
    [[ -n $filter ]] || continue
    local left=$((GC_TIER_END - SECONDS - 5))
    ((left > 5)) || break
    echo "--- $b (limit ${left}s): $(tr ':' '\n' <<<"$filter" | wc -l) cases"
    timeout -k 5 "$left" "$GC_BIN/$b" --gtest_filter="$filter" --gtest_color=no 2>&1 |
      tee "$GC_WORK/$b.out" | grep -E '^\[  (FAILED|SKIPPED) |^\[  PASSED|^\[==========\]|Failure|error' |
      head -200
    python3 "$SRC/scripts/gpu_rotation.py" gtest --cut "$left" <"$GC_WORK/$b.out" |
      sed "s/^/$b:/" >>"$GC_WORK/results"
  done
  python3 "$SRC/scripts/gpu_rotation.py" update --state "$GC_STATE" --out "$GC_RUN/rotation.tsv" \
    --when "$GC_WHEN" <"$GC_WORK/results"
  results=$(cut -f2 "$GC_WORK/results" | sort | uniq -c | tr -s ' ' | paste -sd, -)
  say "results: ${results:-none}"
  if grep -q -P '\t(FAIL|cut)\t' "$GC_WORK/results"; then
    grep -P '\t(FAIL|cut)\t' "$GC_WORK/results" | sed 's/^/  /'
    bad "single-GPU cases: $results"
  else
    ok "single-GPU cases: $results"
  fi
}

tier_4() {
  local rows row
  # bench/gpu.sh's precisions: fp32 strict, tf32 (fp32 with train.tf32, the default), bf16.
  rows=$(printf 'speed:%s\n' "resnet18_cifar 256 bf16" "resnet18_cifar 256 tf32" \
    "resnet50 64 bf16" "resnet50 64 tf32" "resnet18_cifar 256 fp32" "resnet50 64 fp32" \
    "resnet50 128 bf16" "resnet50 128 tf32")
  # The current state: tier 3's update when it ran, else the committed one.
  local state=$GC_STATE
  [[ -f $GC_RUN/rotation.tsv ]] && state=$GC_RUN/rotation.tsv
  row=$(python3 "$SRC/scripts/gpu_rotation.py" pick --state "$state" --budget 1e9 --limit 1 \
    <<<"$rows")
  say "speed row this run: ${row#speed:} (the one measured longest ago; state: $state)"
  if [[ $GC_GPU == 0 ]]; then
    skipped "speed: skipped: no GPU"
    return
  fi
  local t0=$SECONDS rc=0
  GPU_BENCH_JOBS=${row#speed:} GPU_BENCH_NCCL=0 GPU_BENCH_STEPS=40 DPTRAIN="$GC_BIN/dptrain" \
    DEVICE_STEP_BENCH="$GC_BIN/device_step_bench" \
    timeout -k 5 $((GC_TIER_END - SECONDS - 5)) bash "$SRC/bench/gpu.sh" || rc=$?
  local result=pass
  [[ $rc == 0 ]] || result=FAIL
  printf '%s\t%s\t%s\n' "$row" "$result" $((SECONDS - t0)) |
    python3 "$SRC/scripts/gpu_rotation.py" update --state "$state" --out "$GC_WORK/rotation.tsv" \
      --when "$GC_WHEN"
  cp "$GC_WORK/rotation.tsv" "$GC_RUN/rotation.tsv"
  if [[ $rc == 0 ]]; then ok "speed ${row#speed:}"; else bad "speed ${row#speed:}: exit $rc"; fi
}

# ldconfig_find LIB: the file the dynamic loader would take for LIB, through LD_LIBRARY_PATH
# first (as a program started from here would).
ldconfig_find() {
  local d
  IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
  for d in "${dirs[@]}"; do
    [[ -n $d && -e $d/$1 ]] && { readlink -f "$d/$1"; return; }
  done
  ldconfig -p 2>/dev/null | awk -v l="$1" '$1 == l {print $NF; exit}' | xargs -r readlink -f ||
    true
}

if [[ ${1:-} == --tier ]]; then
  "tier_$2"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
bundle="" build="" out=${OUT:-gpu-check-out} budget=460 dry=""
while (($#)); do
  case $1 in
    --bundle) bundle=$2 && shift ;;
    --build) build=$2 && shift ;;
    --out) out=$2 && shift ;;
    --budget) budget=$2 && shift ;;
    --dry-run) dry=1 ;;
    *) echo "gpu-check: unknown argument $1 (see the header of $0)" >&2 && exit 2 ;;
  esac
  shift
done
if [[ -z $bundle && -z $build ]]; then
  if [[ -f .gpu-bundle/dptrain-gpu.tar.xz ]]; then bundle=.gpu-bundle; else build=build; fi
fi
start=$SECONDS
GC_WORK=$(mktemp -d /tmp/dptrain-gpu-check.XXXXXX)
trap 'rm -rf "$GC_WORK"' EXIT

GC_GPU=0
gpu_name=""
if [[ -z $dry ]] && command -v nvidia-smi >/dev/null; then
  gpu_name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [[ -n $gpu_name ]] && GC_GPU=1
fi
# "NVIDIA H100 80GB HBM3" -> h100; no GPU -> nogpu.
tag=$(tr '[:upper:]' '[:lower:]' <<<"$gpu_name" | sed 's/^nvidia //' | awk '{print $1}' | tr -cd 'a-z0-9')
GC_WHEN=$(date -u +%Y-%m-%dT%H:%MZ)
GC_RUN=$out/$(date -u +%Y-%m-%d-%H%M)-${tag:-nogpu}
mkdir -p "$GC_RUN" || exit 1
GC_RUN=$(cd "$GC_RUN" && pwd)
GC_STATE=${GPU_CHECK_STATE:-$SRC/docs/gpu-runs/rotation.tsv}

# The binaries: unpacked from the bundle, with its Open MPI relocated and the machine's own GPU
# libraries (PyTorch's cuDNN, cuBLAS and NCCL, CUDA's runtime) behind the bundle's libraries.
if [[ -n $bundle ]]; then
  GC_B=$GC_WORK/dptrain-gpu
  if ! xz -dc -T0 "$bundle/dptrain-gpu.tar.xz" | tar -C "$GC_WORK" -xf -; then
    echo "gpu-check: cannot unpack $bundle/dptrain-gpu.tar.xz" >&2
    exit 1
  fi
  GC_BIN=$GC_B/bin
  GC_DATA=$GC_B/data
  GC_FROM="bundle $bundle/dptrain-gpu.tar.xz"
  gpu_dirs=()
  for lib in libnccl.so.2 libcudnn.so.9 libcublas.so.13 libcudart.so.13; do
    [[ -n $(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l') ]] && continue
    # shellcheck disable=SC2046 # the site-packages folders, one word each
    found=$(find $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
      /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
      /opt -name "$lib" 2>/dev/null | head -1)
    [[ -n $found ]] && gpu_dirs+=("$(dirname "$found")")
  done
  ld=$GC_B/lib
  for d in "${gpu_dirs[@]}"; do ld+=":$d"; done
  # python3 (PyTorch) keeps the machine's own libraries: the bundle's libstdc++ is older than
  # what its extensions may need. Every python3 below goes through this wrapper.
  mkdir -p "$GC_WORK/pybin"
  printf '#!/bin/sh\n%s\nexec %s "$@"\n' \
    "$( [[ -n ${LD_LIBRARY_PATH:-} ]] && echo "export LD_LIBRARY_PATH='$LD_LIBRARY_PATH'" ||
      echo 'unset LD_LIBRARY_PATH')" "$(command -v python3)" >"$GC_WORK/pybin/python3"
  chmod +x "$GC_WORK/pybin/python3"
  export LD_LIBRARY_PATH=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$GC_WORK/pybin:$PATH
  export OPAL_PREFIX=$GC_B/ompi PMIX_PREFIX=$GC_B/pmix
  export PMIX_MCA_mca_base_component_path=$GC_B/pmix/lib/pmix
  export PATH=$GC_B/ompi/bin:$PATH
  # Open MPI looks for its system-wide settings under the prefix; none there is fine.
  export OMPI_MCA_mca_base_component_show_load_errors=0
else
  GC_B=$build
  GC_BIN=$GC_WORK/bin
  GC_DATA=$SRC/data
  GC_FROM="build tree $build"
  mkdir -p "$GC_BIN"
  for f in launcher/dptrain tests/dptrain_hooked tests/conformance_tests tests/cuda/cuda_tests \
    tests/cuda/cuda_mpi_nccl tests/cuda/cuda_mpi_equivalence; do
    [[ -x $build/$f ]] && ln -s "$(cd "$build" && pwd)/$f" "$GC_BIN/"
  done
fi
GC_DRY=$dry
export GC_WORK GC_GPU GC_RUN GC_STATE GC_WHEN GC_B GC_BIN GC_DATA GC_FROM GC_DRY

echo "gpu-check: $GC_RUN (${gpu_name:-no GPU}${dry:+, dry run}), budget ${budget}s, $GC_FROM"
printf 'tier\tname\tbudget_s\tused_s\texit\n' >"$GC_RUN/timings.tsv"
: >"$GC_RUN/summary.txt"
failed=0
# tier N NAME BUDGET LOG: runs tier N for at most BUDGET seconds (less when the check's own
# budget has less left), its output in the run's folder and on stdout.
tier() {
  local n=$1 name=$2 want=$3 log=$GC_RUN/$4 rc=0 t0=$SECONDS
  local left=$((budget - (SECONDS - start)))
  local b=$((want < left ? want : left))
  if ((b < 10)); then
    echo "tier $n ($name): not run: the check's ${budget}s are spent" | tee -a "$GC_RUN/summary.txt"
    return
  fi
  echo "== tier $n: $name (budget ${b}s)" | tee -a "$log"
  GC_TIER_END=$((b - 5)) timeout -k 5 "$b" bash "$0" --tier "$n" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  local used=$((SECONDS - t0))
  ((rc == 124 || rc == 137)) && echo "RESULT FAIL tier $n cut at its budget of ${b}s" |
    tee -a "$log"
  printf '%s\t%s\t%s\t%s\t%s\n' "$n" "$name" "$b" "$used" "$rc" >>"$GC_RUN/timings.tsv"
  local pass fail skip
  pass=$(grep -c '^RESULT pass' "$log")
  fail=$(grep -c '^RESULT FAIL' "$log")
  skip=$(grep -c '^RESULT skip' "$log")
  ((fail > 0)) && failed=1
  {
    echo "tier $n ($name, ${used}s of ${b}s): $pass passed, $fail failed, $skip skipped"
    grep -E '^RESULT (FAIL|skip)' "$log" | sed 's/^RESULT /  /'
  } | tee -a "$GC_RUN/summary.txt"
}

tier 1 environment 30 env.log
tier 2 "two ranks on one GPU" 150 tier2.log
tier 3 "single-GPU cases, in rotation" 130 tier3.log
tier 4 "speed against PyTorch, one row in rotation" 150 tier4.log
[[ -f $GC_RUN/rotation.tsv ]] || cp "$GC_STATE" "$GC_RUN/rotation.tsv" 2>/dev/null || true
echo "gpu-check: $((SECONDS - start))s; the run's files: $GC_RUN" | tee -a "$GC_RUN/summary.txt"
exit "$failed"
