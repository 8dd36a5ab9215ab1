#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU step and NCCL, on a machine with NVIDIA GPUs (issue 17 point 4; not a test). Skips, and
# says so, where nvidia-smi lists no GPU (the CPU CI machine).
#
#  1. Step time against the sum of the ops' device times: one rank, train.profile = true, which on
#     the CUDA backend times each op with CUDA events on the compute stream (nothing synchronised
#     per op, so the step runs at its own speed). step / ops is how much longer the step takes than
#     the kernels (the cuDNN, cuBLAS and dptrain kernels of its ops) keep the GPU busy: host
#     overhead, launch gaps and synchronisation. Target: at most 1.2x. resnet18 (CIFAR stem,
#     32x32, batch 256) and resnet50 (224x224, batch 64), fp32 and bf16, synthetic data.
#  2. NCCL: allreduce_bench --device cuda over every GPU of the machine, one rank each, bus
#     bandwidth as nccl-tests computes it (2 (n-1)/n x bytes / time), the bare ncclAllReduce and
#     the Reducer's 25 MB buckets.
#
#  2b. The GPU's idle time within a step: bench/device_step_bench runs the same model's step with
#     the host's work removed (the batch on the device, nothing synchronised between steps);
#     1 - its step time / the training step's is the share of the step the GPU waits for the host
#     (the data loader, host copies, synchronisation). CUPTI is not used.
#  3. PyTorch in the same run (bench/pytorch_baseline.py --device cuda: channels-last,
#     cudnn.benchmark, autocast for bf16; fp32 both with TF32 as PyTorch's default and without),
#     the best of GPU_BENCH_PYTORCH_REPEAT processes (default 5), and dptrain's samples/s over
#     that best. Left out when GPU_BENCH_PYTORCH names no python3
#     that imports torch with CUDA.
#
#   bash bench/gpu.sh [BUILD_DIR]      (a build with -DDPTRAIN_WITH_CUDA=ON)
#   GPU_BENCH_STEPS=N                  profiled steps per run (default 60)
#   GPU_BENCH_JOBS="M B P;..."         model, batch, precision of each row: fp32 (strict,
#                                      train.tf32 = false; PyTorch with TF32 off), tf32 (fp32 with
#                                      train.tf32 = true, the default; PyTorch's default fp32) or
#                                      bf16 (default: resnet18_cifar 256 and resnet50 64, each in
#                                      the three, and resnet50 128 in tf32 and bf16);
#                                      scripts/gpu-check.sh runs one row per GPU run, in rotation
#   GPU_BENCH_NCCL=0                   leave out the NCCL part
#   GPU_BENCH_PYTORCH=PYTHON           the python3 with PyTorch (default python3)
#   DPTRAIN=PATH, ALLREDUCE_BENCH=PATH, DEVICE_STEP_BENCH=PATH
#                                      the binaries, when not in BUILD_DIR (a bundle's)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
dptrain=${DPTRAIN:-$build/launcher/dptrain}
allreduce_bench=${ALLREDUCE_BENCH:-$build/bench/allreduce_bench}
device_step_bench=${DEVICE_STEP_BENCH:-$build/bench/device_step_bench}
jobs=${GPU_BENCH_JOBS:-resnet18_cifar 256 fp32;resnet18_cifar 256 tf32;resnet18_cifar 256 bf16;resnet50 64 fp32;resnet50 64 tf32;resnet50 64 bf16;resnet50 128 tf32;resnet50 128 bf16}
torch_py=${GPU_BENCH_PYTORCH:-python3}
# shellcheck source=scripts/mpi-env.sh
. scripts/mpi-env.sh
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
if [ "${gpus:-0}" = 0 ]; then
  echo "bench/gpu.sh: skipped: no GPU (nvidia-smi lists none)"
  exit 0
fi
need=("$dptrain")
[ "${GPU_BENCH_NCCL:-1}" = 0 ] || need+=("$allreduce_bench")
for exe in "${need[@]}"; do
  [ -x "$exe" ] || { echo "bench/gpu.sh: $exe missing (make build with CUDA)"; exit 1; }
done
if ! "$torch_py" -c 'import torch, torchvision; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "bench/gpu.sh: no PyTorch with CUDA in $torch_py: PyTorch left out"
  torch_py=""
fi
steps=${GPU_BENCH_STEPS:-60}
# The GPUs this run may use: CUDA_VISIBLE_DEVICES when the caller set it, else all of them.
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  visible=$CUDA_VISIBLE_DEVICES
else
  visible=$(seq -s, 0 $((gpus - 1)))
fi
IFS=, read -r -a devices <<<"$visible"
work=$(mktemp -d /tmp/dptrain-gpu-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "== machine"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
echo

echo "== the step against its ops' device time (GPU ${devices[0]}, train.profile: CUDA events per op)"
printf '%-16s %6s %5s %11s %9s %9s %10s %s\n' model batch prec samples/s step_ms ops_ms step/ops \
  target
IFS=';' read -r -a job_list <<<"$jobs"
for job in "${job_list[@]}"; do
  read -r model batch prec <<<"$job"
  # tf32 is fp32 with train.tf32 on (its default); fp32 is strict fp32.
  train_prec=$prec tf32_on=false torch_tf32=default
  case $prec in
    fp32) torch_tf32=off ;;
    tf32) train_prec=fp32 tf32_on=true ;;
  esac
  {
    dir=$work/$model-$batch-$prec
    log=$dir.log
    if ! CUDA_VISIBLE_DEVICES=${devices[0]} "$dptrain" train \
      --config configs/resnet8.toml --set model.name="$model" --set run_dir="$dir" \
      --set dist.device=cuda --set data.train=synthetic --set data.test= \
      --set data.augment=none --set data.synthetic_samples=$((batch * (steps + 2))) \
      --set train.global_batch="$batch" --set train.max_steps=$((steps + 1)) \
      --set train.precision="$train_prec" --set train.tf32="$tf32_on" \
      --set train.profile=true --set train.warmup_steps=0 \
      --set checkpoint.every_epochs=0 --set checkpoint.resume=never >"$log" 2>&1; then
      echo "$model $prec: dptrain failed:"
      tail -5 "$log"
      continue
    fi
    # The profile record (metrics.jsonl) and the samples/s of the summary line.
    /usr/bin/env python3 - "$dir/metrics.jsonl" "$log" "$model" "$batch" "$prec" <<'EOF'
import json, re, sys
metrics, log, model, batch, prec = sys.argv[1:]
prof = [r for r in map(json.loads, open(metrics)) if r.get("kind") == "profile"][-1]
done = [l for l in open(log) if l.startswith("done:")]
sps = re.search(r"([0-9.]+) samples/s", done[-1]).group(1) if done else "-"
ratio = prof["step_ms"] / prof["ops_ms"] if prof["ops_ms"] > 0 else float("inf")
timed = prof.get("ops_timed", "host")
verdict = ("met" if ratio <= 1.2 else "NOT met") if timed == "device" else "ops timed on the host"
print(f"{model:<16} {batch:>6} {prec:>5} {sps:>11} {prof['step_ms']:>9.2f} {prof['ops_ms']:>9.2f} "
      f"{ratio:>9.2f}x <=1.2x {verdict}")
EOF
    # The GPU's idle time within a step: the same model's step with the host's work removed
    # (device_step_bench: the batch already on the device, no synchronisation between steps)
    # against the training step's wall time.
    if [ -x "$device_step_bench" ]; then
      train_ms=$(/usr/bin/env python3 -c 'import json, sys
print([r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "profile"][-1]["step_ms"])' \
        "$dir/metrics.jsonl")
      dev_line=$(CUDA_VISIBLE_DEVICES=${devices[0]} "$device_step_bench" --model "$model" \
        --batch "$batch" --precision "$prec" --device cuda --steps "$steps" 2>&1 | tail -1)
      echo "  $dev_line"
      dev_ms=$(sed -n 's/.* step_ms \([0-9.]*\) .*/\1/p' <<<"$dev_line")
      if [ -n "$dev_ms" ] && [ -n "$train_ms" ]; then
        awk -v d="$dev_ms" -v t="$train_ms" -v m="$model" -v b="$batch" -v p="$prec" \
          'BEGIN {printf "  idle %s %s %s: device step %.2f ms, training step %.2f ms: the GPU waits %.1f%% of the step (target: under 2%%, issue 66)\n",
          m, b, p, d, t, 100 * (1 - d / t)}'
      fi
    fi
    [ -n "$torch_py" ] || continue
    # PyTorch in the same run: its best on this GPU, with TF32 as dptrain's row (off for strict
    # fp32, its default for tf32).
    dptrain_sps=$(sed -n 's/^done:.* \([0-9.]*\) samples\/s.*/\1/p' "$log" | tail -1)
    for tf32 in "$torch_tf32"; do
      # PyTorch at its best: the best of GPU_BENCH_PYTORCH_REPEAT processes (default 5).
      torch_sps=""
      for _ in $(seq "${GPU_BENCH_PYTORCH_REPEAT:-5}"); do
        line=$("$torch_py" bench/pytorch_baseline.py --device cuda --model "$model" \
          --batch "$batch" --precision "$train_prec" --tf32 "$tf32" --warmup 15 --steps "$steps" 2>&1 |
          tail -1)
        echo "  $line"
        sps=$(sed -n 's/.*samples_per_s \([0-9.]*\).*/\1/p' <<<"$line")
        if [ -n "$sps" ] && { [ -z "$torch_sps" ] || awk -v a="$sps" -v b="$torch_sps" \
          'BEGIN {exit !(a > b)}'; }; then
          torch_sps=$sps
        fi
      done
      if [ -n "$torch_sps" ] && [ -n "$dptrain_sps" ]; then
        awk -v d="$dptrain_sps" -v t="$torch_sps" -v m="$model" -v b="$batch" -v p="$prec" \
          -v x="$tf32" 'BEGIN {printf "  ratio %s %s %s: dptrain %s / pytorch best (tf32 %s) %s = %.2fx\n",
          m, b, p, d, x, t, d / t}'
      fi
    done
  }
done
echo "(ops: the sum over the step's ops of the time between CUDA events recorded before and after"
echo " each on the compute stream; step: the profiled steps' mean wall time)"
echo

[ "${GPU_BENCH_NCCL:-1}" = 0 ] && exit 0
echo "== NCCL allreduce over ${#devices[@]} GPU(s) ($visible), one rank each (bench/allreduce_bench.cc)"
# One GPU per rank: the local rank's entry of that list (Open MPI, MPICH or Slurm's variable).
# shellcheck disable=SC2016
DPT_BENCH_GPUS=$visible mpirun -np "${#devices[@]}" bash -c '
  IFS=, read -r -a list <<<"$DPT_BENCH_GPUS"
  r=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}}
  CUDA_VISIBLE_DEVICES=${list[$r]} exec "$0" --device cuda' "$allreduce_bench"
