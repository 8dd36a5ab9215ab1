#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every user error dptrain can report today, run as one process and as 4 ranks under mpirun:
# each must exit with its DESIGN.md section 8 code within 30 s (no hang, no rank left behind)
# and print a message naming what is wrong exactly once (rank 0 speaks for errors all ranks see).
# Bad HDF5 files are crafted with h5py; the runs are tiny (synthetic data, 2 steps, batch 32).
# shellcheck disable=SC2034  # CASE and AS are read by lib.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
fail_fast_teardown  # every multi-rank case here ends with a rank exiting non-zero

# ---------------------------------------------------------------------------------------------
# Inputs.
# A valid base config on synthetic data: the cases below change one thing each.
BASE=$TMP/base.toml
write_base_config "$BASE"
# Same config with one unknown key and with one value of the wrong type.
sed 's/^lr = 0.01$/lr = 0.01\nlearning_rate = 0.1/' "$BASE" >"$TMP/unknown.toml"
UNKNOWN_LINE=$(grep -n '^learning_rate' "$TMP/unknown.toml" | cut -d: -f1)
sed 's/^lr = 0.01$/lr = "fast"/' "$BASE" >"$TMP/wrongtype.toml"
WRONGTYPE_LINE=$(grep -n '^lr = "fast"' "$TMP/wrongtype.toml" | cut -d: -f1)
touch "$TMP/a-file"

# Dataset files: a valid one written by `dptrain convert --from npy`, a truncated copy of it,
# random bytes, and files that break the schema one rule at a time.
head -c 100000 /dev/urandom >"$TMP/random.h5"
HAVE_H5=0
if find_h5py_python; then
  HAVE_H5=1
  "$PY" - "$TMP" <<'EOF'
import sys, h5py, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
n = 256
img = rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)
lab = rng.integers(0, 10, n).astype(np.int64)
np.save(f"{d}/images.npy", img)
np.save(f"{d}/labels.npy", lab)

def make(name, **datasets):
    with h5py.File(f"{d}/{name}", "w") as f:
        for k, v in datasets.items():
            f[k] = v

make("names.h5", x=img, y=lab)                              # wrong dataset names
make("dtype.h5", images=img.astype(np.int64), labels=lab)   # /images int64
make("rank2.h5", images=img.reshape(n, -1), labels=lab)     # /images [N, 784]
make("nmismatch.h5", images=img, labels=lab[:200])          # 256 images, 200 labels
bad = lab.copy(); bad[17] = 12
make("labelrange.h5", images=img, labels=bad)               # label 12 with 10 classes
f32 = img.astype(np.float32) / 255; f32[5, 0, 3, 4] = np.nan
make("nan.h5", images=f32, labels=lab)                      # NaN pixel in sample 5
make("small.h5", images=img[:3], labels=lab[:3])            # 3 samples
make("half.h5", images=img[:128], labels=lab[:128])         # a valid file of another size
make("rgb.h5", images=rng.integers(0, 256, (64, 3, 32, 32), dtype=np.uint8),
     labels=lab[:64])                                       # samples of another shape
EOF
  if "$DPTRAIN" convert --from npy --images "$TMP/images.npy" --labels "$TMP/labels.npy" \
    --out "$TMP/good.h5" >"$TMP/convert.log" 2>&1; then
    pass "setup: dptrain convert --from npy writes a dataset"
  else
    fail "setup: dptrain convert --from npy failed:"
    cat "$TMP/convert.log"
  fi
  cp "$TMP/good.h5" "$TMP/trunc.h5"
  truncate -s $(($(stat -c %s "$TMP/good.h5") / 2)) "$TMP/trunc.h5"
  # Channels-last images, as NumPy/PIL/TensorFlow keep them: read as such, said so, transposed.
  "$PY" -c "import numpy as np, sys; np.save(sys.argv[1], np.random.default_rng(1).integers(
    0, 256, (8, 6, 5, 3), dtype=np.uint8)); np.save(sys.argv[2], np.arange(8) % 3)" \
    "$TMP/nhwc.npy" "$TMP/nhwc-labels.npy"
  if "$DPTRAIN" convert --from npy --images "$TMP/nhwc.npy" --labels "$TMP/nhwc-labels.npy" \
    --out "$TMP/nhwc.h5" >"$TMP/convert.log" 2>&1 &&
    grep -qF "images [8, 6, 5, 3] read as (N, H, W, C), written as [8, 3, 6, 5]" "$TMP/convert.log" &&
    "$PY" -c "import numpy as np, h5py, sys
with h5py.File(sys.argv[2]) as f:
    assert (f['images'][()] == np.load(sys.argv[1]).transpose(0, 3, 1, 2)).all()" \
      "$TMP/nhwc.npy" "$TMP/nhwc.h5"; then
    pass "convert --from npy: (N, H, W, C) images are read as channels-last and transposed"
  else
    fail "convert --from npy: (N, H, W, C) images:"
    cat "$TMP/convert.log"
  fi
else
  echo "note: no python3 with h5py and numpy (Debian: python3-h5py); dataset cases are skipped"
fi

# ---------------------------------------------------------------------------------------------
# Runners.
# data NAME CODE PATTERN FILE [more args...]: train on FILE (no test set).
data() {
  local name=$1 code=$2 pattern=$3 file=$4
  shift 4
  if ((HAVE_H5 == 0)); then
    skip "$name: needs python3 with h5py"
    return
  fi
  both "$name" "$code" "$pattern" train --config "$BASE" --set "data.train=$file" \
    --set data.test= "$@"
}

# ---------------------------------------------------------------------------------------------
echo "== configuration and command line (exit 2)"
both "unknown config key" 2 \
  "$TMP/unknown.toml:$UNKNOWN_LINE: unknown key 'train.learning_rate'" \
  train --config "$TMP/unknown.toml"
# Pre-MPI errors (config, command line) are printed by world rank 0 before MPI_Init.
# Their rank tag comes from the launcher's variables: "[rank 0/4 <host>]" under mpirun -np 4.
check "a config error under 4 ranks is tagged [rank 0/4 <host>]" \
  last_err_count "[rank 0/4 " 1
both "wrong type in the config file" 2 \
  "$TMP/wrongtype.toml:$WRONGTYPE_LINE: train.lr: expected a number, got string \"fast\"" \
  train --config "$TMP/wrongtype.toml"
both "wrong type via --set" 2 "--set train.epochs=abc: train.epochs: expected an integer, got 'abc'" \
  train --config "$BASE" --set train.epochs=abc
both "out-of-range value via --set" 2 "--set train.lr=-1: train.lr must be > 0, got -1" \
  train --config "$BASE" --set train.lr=-1
both "unknown key via --set" 2 "--set train.learning_rate=0.1: unknown key 'train.learning_rate'" \
  train --config "$BASE" --set train.learning_rate=0.1
both "missing config file" 2 "$TMP/nope.toml: cannot read config file: No such file or directory" \
  train --config "$TMP/nope.toml"
both "--set without '='" 2 "--set train.lr: expected key=value" \
  train --config "$BASE" --set train.lr
both "unknown subcommand" 2 "unknown command 'frobnicate' (commands: train, eval, convert" \
  frobnicate --config "$BASE"
both "missing --config" 2 "--config is required" train
both "out of memory under memory.limit (report + advice)" 4 \
  "hint: micro-batch" train --config "$BASE" --set memory.limit=2MiB
# The advice is concrete and right: it names the micro-batch that fits (the estimate of
# `dptrain plan`) and the train.accumulate that keeps the global batch; following it trains.
# The limit is 2 MiB under the job's measured peak (weights, gradients and momentum are 5 MiB of
# it, activations of 32 samples per rank most of the rest).
CASE="the job's peak memory without a limit [2 ranks]"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$BASE" --set train.global_batch=64 \
  --set "run_dir=$TMP/run-peak"
LIMIT=$(limit_under_peak 2)
CASE="out of memory under memory.limit = ${LIMIT}MiB: the advice names a train.accumulate that fits [2 ranks]"
expect_fail 4 "should fit (estimate of \`dptrain plan --config $BASE --ranks 2\`): set train.accumulate = " \
  -- "${MPI2[@]}" "$DPTRAIN" train --config "$BASE" --set train.global_batch=64 \
  --set "memory.limit=${LIMIT}MiB"
check "  ... the report names the layer being set up" grep -qF "(layer " "$TMP/last.err"
ACC=$(grep -o 'set train.accumulate = [0-9]*' "$TMP/last.err" | head -n 1 | grep -o '[0-9]*$')
CASE="  ... and following it (train.accumulate = ${ACC:-?}) trains within the same limit [2 ranks]"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$BASE" --set train.global_batch=64 \
  --set "memory.limit=${LIMIT}MiB" --set "train.accumulate=${ACC:-0}" --set "run_dir=$TMP/run-advice"
# dist.shard (docs/memory.md): when optimizer state is the largest item, the advice says to shard
# it, and following it trains within the same limit.
SHARD_OOM=(--set train.optimizer=adamw --set train.global_batch=2 --set memory.limit=8.5MiB)
CASE="out of memory with AdamW state the largest item: the advice names dist.shard [2 ranks]"
expect_fail 4 'or set dist.shard = "optimizer" (optimizer state is the largest item, 3.22 MiB per rank; sharded over 2 ranks 1.61 MiB)' \
  -- "${MPI2[@]}" "$DPTRAIN" train --config "$BASE" "${SHARD_OOM[@]}"
for shard in optimizer gradients; do
  CASE="  ... and following it (dist.shard = $shard) trains within the same limit [2 ranks]"
  expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$BASE" "${SHARD_OOM[@]}" \
    --set "dist.shard=$shard" --set "run_dir=$TMP/run-shard-$shard"
done
CASE="dist.shard with 1 rank: a warning, and it trains unsharded"
expect_ok -- "$DPTRAIN" train --config "$BASE" --set dist.shard=optimizer --set "run_dir=$TMP/run-shard1"
check "  ... the warning says there is nothing to shard" \
  grep -qF 'warning: dist.shard = "optimizer" with 1 rank: nothing to shard' "$TMP/last.err"
both "unknown model name" 2 \
  "model.name: unknown model 'resnet9000' (known: linear, mlp, ref_cnn, cifar_net, resnet8" \
  train --config "$BASE" --set model.name=resnet9000

echo "== global batch vs world size (exit 2) and vs dataset size (exit 3)"
CASE="global batch 64 not divisible by 3 ranks"
expect_fail 2 "train.global_batch = 64 is not divisible by the 3 ranks; use a multiple of 3" \
  -- "${MPI3[@]}" "$DPTRAIN" train --config "$BASE" --set train.global_batch=64
check "  ... and suggests the multiples of 3 around it (63 or 66)" last_err_count "63 or 66" 1
CASE="global batch 30 not divisible by 4 ranks"
expect_fail 2 "train.global_batch = 30 is not divisible by the 4 ranks; use a multiple of 4" \
  -- "${MPI4[@]}" "$DPTRAIN" train --config "$BASE" --set train.global_batch=30
check "  ... and suggests the multiples of 4 around it (28 or 32)" last_err_count "28 or 32" 1
# 4 ranks, 3 samples: more ranks than samples, and a global batch of 4 > the dataset.
data "more ranks than samples / global batch > dataset" 3 \
  "the dataset has 3 samples, fewer than one global batch (train.global_batch = 4)" \
  "$TMP/small.h5" --set train.global_batch=4

echo "== dataset files (exit 3)"
data "data.train: missing file" 3 "$TMP/missing.h5: no such file" "$TMP/missing.h5"
both "data.train: not an HDF5 file (random bytes)" 3 \
  "$TMP/random.h5: not an HDF5 file (no HDF5 signature)" \
  train --config "$BASE" --set "data.train=$TMP/random.h5" --set data.test=
data "data.train: truncated HDF5 file" 3 \
  "$TMP/trunc.h5: cannot open HDF5 file (truncated or corrupt?)" "$TMP/trunc.h5"
data "data.train: wrong dataset names (/x, /y)" 3 "$TMP/names.h5: dataset /images not found" \
  "$TMP/names.h5"
data "data.train: /images int64" 3 "$TMP/dtype.h5: /images has dtype int64, expected uint8 or float32" \
  "$TMP/dtype.h5"
data "data.train: /images 2-D" 3 \
  "$TMP/rank2.h5: /images has rank 2 (shape [256, 784]), expected 4 [N, C, H, W] or 3 [N, H, W]" \
  "$TMP/rank2.h5"
data "data.train: N of images != N of labels" 3 \
  "$TMP/nmismatch.h5: /images has 256 samples but /labels has 200" "$TMP/nmismatch.h5"
data "data.train: label 12 with model.classes 10" 3 \
  "$TMP/labelrange.h5: /labels: label 12 at index 17 is outside [0, 10) (model.classes)" \
  "$TMP/labelrange.h5"
data "data.train: NaN pixel in float32 images" 3 \
  "$TMP/nan.h5: /images: non-finite pixel nan in sample 5 at element 88 of [1, 28, 28]" \
  "$TMP/nan.h5"
data "data.train: NaN pixel, chunk cache, 1 loader thread" 3 \
  "$TMP/nan.h5: /images: non-finite pixel nan in sample 5" "$TMP/nan.h5" \
  --set data.cache=chunks --set data.workers=1
if ((HAVE_H5)); then
  both "data.test: label out of range" 3 "$TMP/labelrange.h5: /labels: label 12 at index 17" \
    train --config "$BASE" --set "data.train=$TMP/good.h5" --set "data.test=$TMP/labelrange.h5"
  both "data.test: samples of another shape than data.train" 3 \
    "data.test $TMP/rgb.h5 has samples of shape [3, 32, 32] but data.train $TMP/good.h5 has [1, 28, 28]" \
    train --config "$BASE" --set "data.train=$TMP/good.h5" --set "data.test=$TMP/rgb.h5"
fi

echo "== negative or zero sizes (exit 2)"
for kv in train.global_batch=0 train.global_batch=-64 train.accumulate=0 data.workers=-1 \
  memory.limit=0 checkpoint.keep=0; do
  both "$kv" 2 "--set $kv: ${kv%%=*}" train --config "$BASE" --set "$kv"
done
# In the file, with its line: a linear layer of 0 outputs.
{
  sed '/^\[model\]/,/^$/d' "$BASE"
  printf '\n[model]\nclasses = 10\nlayers = [\n  { type = "flatten" },\n'
  printf '  { type = "linear", out = 0 },\n]\n'
} >"$TMP/zero-layer.toml"
both "a linear layer with out = 0 in the config file" 2 "$TMP/zero-layer.toml:" \
  train --config "$TMP/zero-layer.toml"

echo "== files the user cannot read (run as user nobody: root reads anything)"
if setpriv --reuid=65534 --regid=65534 --clear-groups "$DPTRAIN" --version >/dev/null 2>&1; then
  # $TMP is private to root; nobody gets a world-writable directory inside it.
  chmod 711 "$TMP"
  NB=$TMP/nobody
  mkdir -p "$NB" && chmod 777 "$NB"
  cp "$BASE" "$NB/locked.toml" && chmod 000 "$NB/locked.toml"
  cp "$BASE" "$NB/base.toml" && chmod 644 "$NB/base.toml"
  AS=(setpriv --reuid=65534 --regid=65534 --clear-groups)  # `both` runs as nobody
  both "unreadable config file" 2 "$NB/locked.toml: cannot read config file: Permission denied" \
    train --config "$NB/locked.toml"
  if ((HAVE_H5)); then
    cp "$TMP/good.h5" "$NB/locked.h5" && chmod 000 "$NB/locked.h5"
    CASE="setup: a checkpoint to lock"
    expect_ok -- "$DPTRAIN" train --config "$BASE" --set "run_dir=$TMP/to-lock"
    cp "$TMP/to-lock/checkpoints/ckpt-00000002.h5" "$NB/locked-ckpt.h5"
    chmod 000 "$NB/locked-ckpt.h5"
    both "unreadable data.train" 3 "$NB/locked.h5: cannot read the file: Permission denied" \
      train --config "$NB/base.toml" --set "data.train=$NB/locked.h5" --set data.test= \
      --set "run_dir=$NB/run"
    both "unreadable checkpoint.init" 6 \
      "checkpoint $NB/locked-ckpt.h5: cannot read the file: Permission denied" \
      train --config "$NB/base.toml" --set "checkpoint.init=$NB/locked-ckpt.h5" \
      --set "run_dir=$NB/run-init"
  fi
  AS=()
else
  skip "unreadable files: cannot run $DPTRAIN as user nobody (setpriv)"
fi

# A FIFO (or /dev/stdin) where a file belongs: opening it for reading waited for a writer.
mkfifo "$TMP/fifo.h5"
both "a FIFO as data.train" 3 "$TMP/fifo.h5: cannot read the file: it is not a regular file" \
  train --config "$BASE" --set "data.train=$TMP/fifo.h5" --set data.test= --set "run_dir=$TMP/fifo-run"
both "a FIFO as checkpoint.resume" 6 \
  "checkpoint $TMP/fifo.h5: cannot read the file: it is not a regular file" \
  train --config "$BASE" --set "checkpoint.resume=$TMP/fifo.h5" --set "run_dir=$TMP/fifo-run"

echo "== run_dir not writable (exit 3)"
both "run_dir under a regular file" 3 \
  "run_dir '$TMP/a-file/run' cannot be created: Not a directory" \
  train --config "$BASE" --set "run_dir=$TMP/a-file/run"
both "run_dir in /proc" 3 "run_dir '/proc/x' cannot be created" \
  train --config "$BASE" --set run_dir=/proc/x

echo "== launcher variables that contradict MPI (exit 2)"
CASE="SLURM_LOCALID=3 in a single process [1 process]"
expect_fail 2 "SLURM_LOCALID=3 but MPI says this process is local rank 0 of 1" \
  -- env SLURM_LOCALID=3 "$DPTRAIN" train --config "$BASE"
# Under mpirun SLURM_LOCALID is ignored (DESIGN.md section 4: it is 0 on every rank when mpirun
# runs inside an allocation), so a stale one must not stop a 4-rank run.
CASE="SLURM_LOCALID=3 is ignored under mpirun [4 ranks]"
expect_ok -- env SLURM_LOCALID=3 "${MPI4[@]}" "$DPTRAIN" train --config "$BASE" \
  --set "run_dir=$TMP/run-slurm"
CASE="OMPI_COMM_WORLD_LOCAL_RANK=5 in a single process [1 process]"
expect_fail 2 "OMPI_COMM_WORLD_LOCAL_RANK=5 but MPI says this process is local rank 0 of 1" \
  -- env OMPI_COMM_WORLD_LOCAL_RANK=5 "$DPTRAIN" train --config "$BASE"
# A world rank left exported in a shell: the process is alone, so it prints its own errors.
# (Command-line errors are printed before MPI starts, by the rank the launcher's variables name.)
STALE=(env -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE -u PMIX_RANK -u PMIX_SIZE
  -u SLURM_PROCID -u SLURM_NTASKS OMPI_COMM_WORLD_RANK=1)
CASE="a stale OMPI_COMM_WORLD_RANK=1, unknown command [1 process]"
expect_fail 2 "unknown command 'frobnicate'" -- "${STALE[@]}" "$DPTRAIN" frobnicate
CASE="a stale OMPI_COMM_WORLD_RANK=1, train without --config [1 process]"
expect_fail 2 "--config is required" -- "${STALE[@]}" "$DPTRAIN" train
CASE="a stale OMPI_COMM_WORLD_RANK=1 inside a Slurm allocation (SLURM_PROCID=0 of 8) [1 process]"
expect_fail 2 "unknown command 'frobnicate'" \
  -- "${STALE[@]}" SLURM_PROCID=0 SLURM_NTASKS=8 "$DPTRAIN" frobnicate
# 4 ranks: a wrapper gives rank 2 a local rank that MPI contradicts; rank 0 reports rank 2's error.
cat >"$TMP/rank2-local7.sh" <<'EOF'
#!/bin/sh
[ "$OMPI_COMM_WORLD_RANK" = 2 ] && export OMPI_COMM_WORLD_LOCAL_RANK=7
exec "$@"
EOF
CASE="OMPI_COMM_WORLD_LOCAL_RANK=7 on rank 2 only [4 ranks]"
expect_fail 2 "[rank 2/4 $(hostname)] launcher/process_env.cc" \
  -- "${MPI4[@]}" sh "$TMP/rank2-local7.sh" "$DPTRAIN" train --config "$BASE"
check "  ... and the message names OMPI_COMM_WORLD_LOCAL_RANK=7 and local rank 2 of 4" \
  last_err_count "OMPI_COMM_WORLD_LOCAL_RANK=7 but MPI says this process is local rank 2 of 4" 1
CASE="SLURM_LOCALID=abc (not an integer) [1 process]"
expect_fail 2 "launcher environment: SLURM_LOCALID='abc' is not a non-negative integer" \
  -- env SLURM_LOCALID=abc "$DPTRAIN" train --config "$BASE"
CASE="SLURM_LOCALID=abc is not read under mpirun [4 ranks]"
expect_ok -- env SLURM_LOCALID=abc "${MPI4[@]}" "$DPTRAIN" train --config "$BASE" \
  --set "run_dir=$TMP/run-slurm-abc"

echo "== ranks that disagree (4 ranks)"
cat >"$TMP/rank2-extra.sh" <<'EOF'
#!/bin/sh
# Runs "$@" with $EXTRA_ON_RANK2 (split on spaces) appended on world rank 2 only.
# shellcheck disable=SC2086
[ "$OMPI_COMM_WORLD_RANK" = 2 ] && exec "$@" $EXTRA_ON_RANK2
exec "$@"
EOF
CASE="a different --set on rank 2 [4 ranks]"
expect_fail 2 "the ranks resolved different configurations" \
  -- env EXTRA_ON_RANK2="--set train.lr=0.2" "${MPI4[@]}" sh "$TMP/rank2-extra.sh" \
  "$DPTRAIN" train --config "$BASE"
# A config error on rank 2 only (a file missing on one host): rank 0 prints rank 2's message
# (agreed over MPI) and every rank exits 2 instead of rank 2 dying silently.
CASE="a bad --set on rank 2 only [4 ranks]"
expect_fail 2 "[rank 2/4 $(hostname)] --set train.lr=-1: train.lr must be > 0, got -1" \
  -- env EXTRA_ON_RANK2="--set train.lr=-1" "${MPI4[@]}" sh "$TMP/rank2-extra.sh" \
  "$DPTRAIN" train --config "$BASE"
check "  ... printed once, by rank 0" last_err_count "train.lr must be > 0" 1
# The same relative data.train path names a file of another size on rank 2 (files that differ
# between hosts): every rank detects it after an allreduce.
if ((HAVE_H5)); then
  for r in 0 1 2 3; do
    mkdir -p "$TMP/cwd$r"
    ln -sf ../good.h5 "$TMP/cwd$r/d.h5"
  done
  ln -sf ../half.h5 "$TMP/cwd2/d.h5"
  cat >"$TMP/cwd-per-rank.sh" <<EOF
#!/bin/sh
cd "$TMP/cwd\$OMPI_COMM_WORLD_RANK" && exec "\$@"
EOF
  CASE="rank 2 reads a dataset of another size [4 ranks]"
  run_limited "${MPI4[@]}" sh "$TMP/cwd-per-rank.sh" "$DPTRAIN" train --config "$BASE" \
    --set data.train=d.h5 --set data.test=
  if [[ $LAST_RC == 3 && -z $LAST_LEFT ]] && grep -qF "the ranks see different datasets (train samples 128..256" "$TMP/last.err"; then
    pass "$CASE (exit $LAST_RC, ${LAST_SECONDS}s)"
  else
    fail "$CASE: exit $LAST_RC (expected 3)${LAST_LEFT:+, left behind: $LAST_LEFT}"
    show_last "(see above)"
  fi
  # Every rank holds the reduced sizes and reaches the same verdict: rank 0 prints it once.
  check "  ... printed once" last_err_count "the ranks see different datasets" 1
fi

finish
