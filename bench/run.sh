#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# End-to-end benchmark (not a test): ref_cnn training throughput of dptrain next to PyTorch on the
# same machine in the same run, then the per-step time breakdown, the reducer against a bare
# MPI_Allreduce, and the framework overhead of a step. Prints ratios, never absolute targets:
# these machines are noisy, so only numbers measured together are compared.
#
#   bash bench/run.sh [BUILD_DIR]        (make bench does this)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
dptrain=$build/launcher/dptrain
py=/usr/bin/python3  # Debian's python3-torch lives here, not in a pyenv python
# shellcheck source=scripts/mpi-env.sh
. scripts/mpi-env.sh
data=${DPTRAIN_DATA:-data}/fmnist/train.h5
[ -f "$data" ] || { echo "bench: $data missing (run make data)"; exit 1; }
work=$(mktemp -d /tmp/dptrain-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
steps=120

# dptrain samples/s between the step-40 and the last step line of metrics.jsonl (after warm-up).
dptrain_run() {  # ranks threads batch precision
  local ranks=$1 threads=$2 batch=$3 prec=$4 run=$work/run-$1-$2-$3-$4
  local args=(train --config configs/fmnist_cnn.toml --set "run_dir=$run" --set "data.train=$data"
    --set data.test= --set "train.global_batch=$batch" --set "train.precision=$prec"
    --set "dist.threads=$threads" --set data.workers=1 --set "train.max_steps=$steps"
    --set train.log_every_steps=20 --set checkpoint.every_epochs=0 --set checkpoint.resume=never)
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=$threads "$dptrain" "${args[@]}" > "$run.log" 2>&1
  else
    mpirun -np "$ranks" "$dptrain" "${args[@]}" > "$run.log" 2>&1
  fi
  "$py" - "$run/metrics.jsonl" "$batch" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"kind": "step"' in l or '"kind":"step"' in l]
a = next(r for r in rows if r["step"] >= 40); b = rows[-1]
print(f'{(b["step"] - a["step"]) * int(sys.argv[2]) / (b["time_s"] - a["time_s"]):.0f}')
PY
}

# PyTorch, best of the machine's OpenBLAS settings as found and with them unset (they are set
# for old numpy builds and can slow torch): the baseline is PyTorch at its best here.
pytorch_run() {  # ranks threads batch precision
  local n=$((steps * 64 / $3)) best=0 v
  for envmode in keep unset; do
    if [ "$envmode" = keep ]; then
      v=$("$py" bench/pytorch_baseline.py --ranks "$1" --threads "$2" --batch "$3" \
        --precision "$4" --steps "$n" | awk '{print $NF}')
    else
      v=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$py" bench/pytorch_baseline.py \
        --ranks "$1" --threads "$2" --batch "$3" --precision "$4" --steps "$n" | awk '{print $NF}')
    fi
    [ "${v%.*}" -gt "$best" ] && best=${v%.*}
  done
  echo "$best"
}

echo "== ref_cnn training throughput (samples/s, global batch, Fashion-MNIST in RAM)"
printf '%-14s %6s %6s %10s %10s %10s %14s\n' layout batch prec dptrain pytorch ratio vs_pt_fp32
declare -A pt_fp32
for batch in 64 256; do
  for layout in "1 2" "2 1"; do
    set -- $layout
    pt_fp32["$1x$2-$batch"]=$(pytorch_run "$1" "$2" "$batch" fp32)
    for prec in fp32 bf16; do
      d=$(dptrain_run "$1" "$2" "$batch" "$prec")
      if [ "$prec" = fp32 ]; then p=${pt_fp32["$1x$2-$batch"]}; else p=$(pytorch_run "$1" "$2" "$batch" bf16); fi
      printf '%-14s %6s %6s %10s %10s %10s %14s\n' "$1 rank x $2 thr" "$batch" "$prec" "$d" "$p" \
        "$(awk -v a="$d" -v b="$p" 'BEGIN{printf "%.2fx", a/b}')" \
        "$(awk -v a="$d" -v b="${pt_fp32["$1x$2-$batch"]}" 'BEGIN{printf "%.2fx", a/b}')"
    done
  done
done
echo "(targets: fp32 >= 2.5x PyTorch fp32; bf16 >= 4x -- vs_pt_fp32 column -- see bench/README.md)"

echo
echo "== per-step time breakdown (2 ranks x 1 thread, batch 64, fp32; from dptrain's summary)"
grep '^done:' "$work/run-2-1-64-fp32.log" || true

echo
echo "== gradient allreduce: reducer vs bare MPI_Allreduce (2 ranks)"
mpirun -np 2 "$build/bench/allreduce_bench"

echo
echo "== framework overhead of a step (step time vs time inside backend ops, in place)"
OMP_NUM_THREADS=2 "$build/bench/step_bench" --benchmark_filter='^Step/' \
  --benchmark_counters_tabular=true 2>/dev/null | grep -E '^(Benchmark|Step)'
