# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# dptrain's side of the training benchmark, sourced by bench/run.sh (against PyTorch) and
# bench/ab.sh (two builds against each other): the model's config, one measured run, and the
# warm-up and timed steps of a row. Reads: dptrain (the binary), work (a scratch folder), fmnist
# (Fashion-MNIST's train.h5), py (python3), scale (1; 8 for a smoke run), extra (more arguments).
# The variables it sets are read by the scripts that source it.
# shellcheck disable=SC2034,SC2154

# model_args MODEL: dptrain's config for the model (resnet18_cifar: resnet8's training settings).
model_args() {
  case $1 in
    ref_cnn) echo "--config configs/fmnist_cnn.toml" ;;
    resnet8) echo "--config configs/resnet8.toml" ;;
    resnet18_cifar) echo "--config configs/resnet8.toml --set model.name=resnet18_cifar" ;;
  esac
}
# dptrain samples/s between the log line at the end of warm-up and the last one (metrics.jsonl).
# `extra`: more arguments for dptrain; the run's directory is left in `last_run`.
run_id=0 extra=() last_run=""
dptrain_run() {  # model ranks threads batch precision warmup_steps steps
  local model=$1 ranks=$2 threads=$3 batch=$4 prec=$5 warm=$6 steps=$7 data=synthetic
  local opts=() tag=$prec
  # fp32w: fp32 with train.winograd (3x3 convolutions of >= 32 channels by Winograd F(4x4, 3x3)).
  if [ "$prec" = fp32w ]; then
    prec=fp32 opts=(--set train.winograd=true)
  fi
  run_id=$((run_id + 1))
  local run=$work/dpt-$model-$ranks-$threads-$batch-$tag-$run_id
  # Fashion-MNIST for ref_cnn; else in RAM, 3x32x32, as PyTorch's random tensors.
  [ "$model" = ref_cnn ] && data=$fmnist
  local config_args
  read -r -a config_args <<<"$(model_args "$model")"
  local args=(train "${config_args[@]}" --set "run_dir=$run" --set "data.train=$data"
    --set data.test= --set data.augment=none --set data.synthetic_samples=4096
    --set model.channels_last=true
    --set "train.global_batch=$batch" --set "train.precision=$prec" --set "dist.threads=$threads"
    --set data.workers=1 --set "train.max_steps=$((warm + steps))"
    --set "train.log_every_steps=$warm" --set checkpoint.every_epochs=0
    --set checkpoint.resume=never "${opts[@]}" "${extra[@]}")
  last_run=$run
  local rc=0
  if [ "$ranks" = 1 ]; then
    OMP_NUM_THREADS=$threads "$dptrain" "${args[@]}" >"$run.log" 2>&1 || rc=$?
  else
    OMP_NUM_THREADS=$threads mpirun -np "$ranks" "$dptrain" "${args[@]}" >"$run.log" 2>&1 || rc=$?
  fi
  if [ $rc != 0 ]; then
    echo "bench: dptrain failed (exit $rc):" >&2
    tail -n 20 "$run.log" >&2
    return 1
  fi
  cp "$run.log" "$work/last-$model-$ranks-$threads-$batch-$tag.log"
  "$py" - "$run/metrics.jsonl" "$batch" "$warm" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "step"]
a = next(r for r in rows if r["step"] >= int(sys.argv[3]))
b = rows[-1]
print(f'{(b["step"] - a["step"]) * int(sys.argv[2]) / (b["time_s"] - a["time_s"]):.0f}')
PY
}

# set_steps MODEL BATCH: $warm and $steps, the warm-up and timed steps of one process (about 4 s
# of timed steps after the warm-up; the whole run: about 11 minutes, resnet18_cifar about 8 more).
set_steps() {
  local warm_samples=2560 measure_samples=30720
  [ "$1" = resnet8 ] && warm_samples=1024 measure_samples=12288
  [ "$1" = resnet18_cifar ] && warm_samples=128 measure_samples=512
  warm=$((warm_samples / scale / $2)) steps=$((measure_samples / scale / $2))
  [ $warm -ge 2 ] || warm=2
  [ $steps -ge 4 ] || steps=4
}
