#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# dist.shard benchmark (not a test), issue 15's targets, measured against `none` in the same run:
#  1. memory: the measured peak per rank (the allocator's, from metrics.jsonl) of an MLP with
#     about 20M parameters trained with AdamW on 4 ranks, for dist.shard = none / optimizer /
#     gradients (targets: at least 25% and 40% lower than none), and `dptrain plan`'s total for
#     the same config (target: within 15% of the measured peak);
#  2. speed: ref_cnn (Fashion-MNIST) and resnet8 (random 3x32x32) on 2 ranks x 1 thread, none
#     against optimizer, interleaved, median of BENCH_REPEAT runs each (target: at most 5% slower),
#     next to PyTorch's DDP on the same job at its best (bench/pytorch_env.sh: OpenBLAS on one
#     thread, malloc tunables; best of BENCH_REPEAT processes).
#
#   bash bench/shard.sh [BUILD_DIR]
#   BENCH_REPEAT=N   runs per speed measurement on each side (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
dptrain=$build/launcher/dptrain
py=/usr/bin/python3
# shellcheck source=scripts/mpi-env.sh
. scripts/mpi-env.sh
[ -x "$dptrain" ] || { echo "bench: $dptrain missing (make build)"; exit 1; }
fmnist=${DPTRAIN_DATA:-data}/fmnist/train.h5
[ -f "$fmnist" ] || { echo "bench: $fmnist missing (run make data)"; exit 1; }
work=$(mktemp -d /tmp/dptrain-shard-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
repeat=${BENCH_REPEAT:-5}
# shellcheck source=bench/pytorch_env.sh
. bench/pytorch_env.sh
pytorch_best_setup
echo
calc() { awk "BEGIN{printf \"$1\", $2}"; }

# 784 -> 2048 -> 2048 x 4 -> 10: 20.4M parameters, so AdamW's state is 163 MB; batch 8 per rank
# keeps the activations small next to it. dist.bucket_mb = 8: with "gradients" two groups of
# gradients are in flight at once (docs/memory.md), so the bucket bounds that scratch.
cat >"$work/mlp.toml" <<'TOML'
[model]
classes = 10
layers = [
  { type = "flatten" },
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 2048 }, { type = "relu" },
  { type = "linear", out = 10 },
]
[data]
train = "synthetic"
test = ""
synthetic_samples = 256
workers = 1
[train]
epochs = 0
max_steps = 6
global_batch = 32
optimizer = "adamw"
lr = 1e-3
log_every_steps = 3
[checkpoint]
every_epochs = 0
resume = "never"
[dist]
threads = 1
bucket_mb = 8
TOML

echo "== memory per rank: MLP, $(sed -n 's/.*out = \([0-9]*\).*/\1/p' "$work/mlp.toml" | head -1)-wide, AdamW, 4 ranks"
printf '%-10s %12s %9s %12s %9s\n' shard peak_MiB vs_none plan_MiB plan/peak
none_peak=0
for shard in none optimizer gradients; do
  run=$work/mlp-$shard
  mpirun --oversubscribe -np 4 "$dptrain" train --config "$work/mlp.toml" --set "run_dir=$run" \
    --set "dist.shard=$shard" >"$run.log" 2>&1 || { tail -n 20 "$run.log" >&2; exit 1; }
  peak=$("$py" -c 'import json,sys
rows=[r for r in map(json.loads, open(sys.argv[1])) if r.get("kind")=="step"]
print(int(rows[-1]["peak_mem_bytes"]["max"]))' "$run/metrics.jsonl")
  plan=$("$dptrain" plan --config "$work/mlp.toml" --ranks 4 --set "dist.shard=$shard" --json |
    "$py" -c 'import json,sys; print(json.load(sys.stdin)["total_bytes"])')
  [ "$shard" = none ] && none_peak=$peak
  printf '%-10s %12.1f %8.0f%% %12.1f %9.3f\n' "$shard" "$(calc %.1f "$peak / 1048576")" \
    "$(calc %.0f "100 * ($peak - $none_peak) / $none_peak")" "$(calc %.1f "$plan / 1048576")" \
    "$(calc %.3f "$plan / $peak")"
done
echo "targets: optimizer <= -25%, gradients <= -40%; plan/peak within 0.85..1.15"

# samples/s between the first log line and the last (metrics.jsonl).
speed() {  # model shard run
  local model=$1 shard=$2 run=$work/speed-$1-$2-$3 config data
  if [ "$model" = ref_cnn ]; then config=configs/fmnist_cnn.toml data=$fmnist; else
    config=configs/$model.toml data=synthetic; fi
  OMP_NUM_THREADS=1 mpirun -np 2 "$dptrain" train --config "$config" --set "run_dir=$run" \
    --set "data.train=$data" --set data.test= --set data.augment=none \
    --set data.synthetic_samples=4096 --set train.global_batch=64 --set dist.threads=1 \
    --set data.workers=1 --set train.max_steps=160 --set train.log_every_steps=40 \
    --set checkpoint.every_epochs=0 --set checkpoint.resume=never --set "dist.shard=$shard" \
    >"$run.log" 2>&1 || { tail -n 20 "$run.log" >&2; exit 1; }
  "$py" -c 'import json,sys
rows=[r for r in map(json.loads, open(sys.argv[1])) if r.get("kind")=="step"]
a,b=rows[0],rows[-1]; print(round((b["step"]-a["step"])*64/(b["time_s"]-a["time_s"])))' \
    "$run/metrics.jsonl"
}
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print NR%2 ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

echo
echo "== speed: 2 ranks x 1 thread, batch 64, fp32, samples/s (dptrain: median of $repeat," \
  "interleaved; PyTorch DDP (gloo): best of $repeat processes, $pt_format," \
  "${pt_env[*]}${pt_unset[*]:+, env ${pt_unset[*]}})"
printf '%-8s %10s %10s %8s %10s %12s\n' model none optimizer ratio pt_ddp optimizer/pt
for model in ref_cnn resnet8; do
  a=() b=() pt=()
  # PyTorch's steps: about the samples dptrain times (160 steps of 64 after 40 of warm-up).
  for i in $(seq "$repeat"); do
    a+=("$(speed "$model" none "$i")")
    b+=("$(speed "$model" optimizer "$i")")
    pt+=("$(pytorch_run "$model" 2 1 64 fp32 40 120)")
  done
  ma=$(median "${a[@]}") mb=$(median "${b[@]}")
  best=$(printf '%s\n' "${pt[@]}" | sort -n | tail -n 1)
  printf '%-8s %10s %10s %8.3f %10.0f %12.2f   (none: %s; optimizer: %s; PyTorch: %s)\n' \
    "$model" "$ma" "$mb" "$(calc %.3f "$mb / $ma")" "$best" "$(calc %.2f "$mb / $best")" \
    "${a[*]}" "${b[*]}" "${pt[*]}"
done
echo "target: optimizer/none >= 0.95 (the PyTorch column is context: issue 17 holds its targets)"
