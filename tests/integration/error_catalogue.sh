#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The rest of docs/errors.md, row by row (errors.sh has the inputs issue 8 lists; the checkpoint
# and launcher scripts have theirs): each error a user can cause from the command line or the
# config file, as 1 process and as 4 ranks, checking the message (printed once), the exit code
# and that every rank is gone within 30 s. `dptrain convert` and `dptrain inspect` are
# single-process tools: their rows run as 1 process.
# shellcheck disable=SC2034  # CASE and AS are read by lib.sh
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
fail_fast_teardown  # every multi-rank case here ends with a rank exiting non-zero

# ---------------------------------------------------------------------------------------------
# A small valid run on synthetic data; each case changes one thing.
BASE=$TMP/base.toml
write_base_config "$BASE"

# one NAME CODE PATTERN dptrain-args...: a single-process tool.
one() {
  local name=$1 code=$2 pattern=$3
  shift 3
  CASE="$name [1 process]"
  expect_fail "$code" "$pattern" -- "$DPTRAIN" "$@"
}
# toml NAME: writes $TMP/NAME.toml from stdin (appended to nothing) and prints its path.
toml() {
  cat >"$TMP/$1.toml"
  echo "$TMP/$1.toml"
}
# layers NAME LAYERS...: BASE with [model] replaced by model.layers = [LAYERS] (one per line).
layers() {
  local name=$1 l
  shift
  {
    sed '/^\[model\]/,/^$/d' "$BASE"
    printf '\n[model]\nclasses = 10\nlayers = [\n'
    for l in "$@"; do printf '  %s,\n' "$l"; done
    printf ']\n'
  } >"$TMP/$name.toml"
  echo "$TMP/$name.toml"
}
# without SECTION_KEY: BASE without the line `KEY = ...`.
without() { grep -v "^$1 = " "$BASE"; }

# ---------------------------------------------------------------------------------------------
echo "== command line (exit 2)"
both "eval without --checkpoint" 2 "--checkpoint is required" eval --config "$BASE"
both "--requeue-exit-code out of range" 2 "--requeue-exit-code: Value 300 not in range 0 to 255" \
  train --config "$BASE" --requeue-exit-code 300
both "an unknown option" 2 "The following argument was not expected: --bogus" \
  train --config "$BASE" --bogus
one "convert without --from" 2 "--from is required" convert --out "$TMP/x.h5"
one "convert --from idx without --labels" 2 "convert --from idx needs --images and --labels" \
  convert --from idx --images "$TMP/a" --out "$TMP/x.h5"
one "convert --from npy without --labels" 2 "convert --from npy needs --images and --labels" \
  convert --from npy --images "$TMP/a" --out "$TMP/x.h5"
one "convert --layout with --from idx" 2 "--layout is an option of convert --from npy, not --from idx" \
  convert --from idx --images "$TMP/a" --labels "$TMP/a" --layout nhwc --out "$TMP/x.h5"
one "convert --layout hwc" 2 "convert --layout: unknown layout 'hwc' (auto, nchw, nhwc)" \
  convert --from npy --images "$TMP/a" --labels "$TMP/a" --layout hwc --out "$TMP/x.h5"
one "convert --from cifar10 without --input" 2 "convert --from cifar10 needs --input DIR" \
  convert --from cifar10 --out "$TMP/x.h5"
one "convert --from csv" 2 "convert --from: unknown format 'csv' (idx, cifar10, npy, imagefolder)" \
  convert --from csv --out "$TMP/x.h5"
mkdir -p "$TMP/cifar"
one "convert --split val" 2 "--split val: expected train or test" \
  convert --from cifar10 --input "$TMP/cifar" --split val --out "$TMP/x.h5"

echo "== the config file (exit 2)"
F=$(printf '[data]\ntrain = data/x.h5\n' | toml syntax)
both "TOML syntax error" 2 "$F:2:9: TOML syntax error" train --config "$F"
check "  ... with the hint about quoting" grep -qF 'hint: strings are quoted in the file' "$TMP/last.err"
F=$( (cat "$BASE"; printf '\n[trian]\nlr = 1\n') | toml table)
both "a misspelled table" 2 "unknown table '[trian]' (did you mean '[train]'?)" train --config "$F"
F=$( (echo "train = 3"; sed '/^\[train\]/,/^$/d' "$BASE") | toml scalar)
both "a table name used as a key" 2 "$F:1: 'train' must be a table ([train]), got integer 3" \
  train --config "$F"
both "--set model.layers" 2 "model.layers cannot be set with --set" \
  train --config "$BASE" --set 'model.layers=[]'
F=$(sed '/^name = "ref_cnn"$/d' "$BASE" | toml nomodel)
both "no model" 2 "no model: set model.name (a zoo model, e.g. \"ref_cnn\"), model.layers" \
  train --config "$F"
F=$(sed 's/^name = "ref_cnn"$/name = "ref_cnn"\nlayers = [{ type = "relu" }]/' "$BASE" | toml twomodels)
both "model.name and model.layers" 2 "model.name and model.layers are both set" train --config "$F"
F=$(without train | toml notrain)
both "no data.train" 2 "data.train is required" train --config "$F"
both "data.mean without data.std" 2 "data.mean has 1 entries but data.std has 0" \
  train --config "$BASE" --set 'data.mean=[0.5]'
both "data.std of 0" 2 "data.std[0] must be > 0, got 0.0" \
  train --config "$BASE" --set 'data.mean=[0.5]' --set 'data.std=[0.0]'
both "nothing to train" 2 "train.epochs and train.max_steps are both 0" \
  train --config "$BASE" --set train.epochs=0 --set train.max_steps=0
both "global batch not divisible by accumulate" 2 \
  "train.global_batch (32) must be divisible by train.accumulate (3)" \
  train --config "$BASE" --set train.accumulate=3
both "nesterov without momentum" 2 "train.nesterov = true needs train.momentum > 0" \
  train --config "$BASE" --set train.nesterov=true --set train.momentum=0
both "checkpoint.resume empty" 2 \
  "checkpoint.resume must be \"auto\", \"never\" or a checkpoint path, got \"\"" \
  train --config "$BASE" --set checkpoint.resume=
both "memory.limit not a size" 2 "memory.limit: \"lots\" is not a positive size" \
  train --config "$BASE" --set memory.limit=lots
both "memory.limit under one byte (0 would mean no limit)" 2 \
  "memory.limit: \"0.5\" is less than one byte" train --config "$BASE" --set memory.limit=0.5
one "plan --ranks 0" 2 "--ranks: Value 0 not in range 1 to 1048576" plan --config "$BASE" --ranks 0
CASE="plan: a memory.limit that not even one sample fits says so"
expect_ok -- "$DPTRAIN" plan --config "$BASE" --set memory.limit=512B
check "  ... no 'micro-batch <= 0' advice" grep -q "not even one sample fits: the parameters" \
  "$TMP/last.out"
CASE="plan: a memory.limit that part of the batch fits advises an accumulate that divides it"
expect_ok -- "$DPTRAIN" plan --config "$BASE" --set memory.limit=9MiB
check "  ... micro-batch x train.accumulate = the per-rank batch (32)" python3 - "$TMP/last.out" <<'PY'
import re, sys
m = re.search(r"micro-batch (\d+) fits \(up to (\d+)\): set train.accumulate = (\d+)",
              open(sys.argv[1]).read())
assert m, "no advice line"
fit, most, acc = map(int, m.groups())
assert fit * acc == 32 and fit <= most and 32 % fit == 0, m.group(0)
PY
CASE="plan --json: the text's verdict and advice, and its per-dist.shard rows (2 ranks)"
expect_ok -- "$DPTRAIN" plan --config "$BASE" --set memory.limit=9MiB --ranks 2 --json
cp "$TMP/last.out" "$TMP/plan.json"
expect_ok -- "$DPTRAIN" plan --config "$BASE" --set memory.limit=9MiB --ranks 2
check "  ... fits false, the same micro-batch and accumulate, three shard rows" \
  python3 - "$TMP/plan.json" "$TMP/last.out" <<'PY'
import json, re, sys
j = json.load(open(sys.argv[1]))
m = re.search(r"micro-batch (\d+) fits \(up to \d+\): set train.accumulate = (\d+)",
              open(sys.argv[2]).read())
assert m, "no advice line in the text"
assert j["fits"] is False, j["fits"]
assert (j["advice"]["micro_batch"], j["advice"]["accumulate"]) == tuple(map(int, m.groups())), j["advice"]
assert [r["shard"] for r in j["per_shard"]] == ["none", "optimizer", "gradients"], j["per_shard"]
assert j["ranks"] == 2 and j["per_rank_batch"] * 2 == j["global_batch"], j
PY
both "dist.shard unknown value" 2 \
  'dist.shard must be one of "none", "optimizer", "gradients", got "zero3"' \
  train --config "$BASE" --set dist.shard=zero3
both "dist.backend nccl on the CPU" 2 "dist.backend = \"nccl\" needs GPUs" \
  train --config "$BASE" --set dist.backend=nccl --set dist.device=cpu
both "dist.gpus with an empty entry" 2 "dist.gpus: empty entry in \"1,,2\"" \
  train --config "$BASE" --set dist.gpus=1,,2
both "train --gpus is dist.gpus" 2 "dist.gpus: empty entry in \"1,,2\"" \
  train --config "$BASE" --gpus 1,,2
both "eval --gpus is dist.gpus" 2 "dist.gpus: empty entry in \"1,,2\"" \
  eval --config "$BASE" --checkpoint "$TMP/none.h5" --gpus 1,,2

echo "== model.layers (exit 2)"
F=$(layers typo '{ type = "flatten" }' '{ type = "linaer", out = 10 }')
both "a misspelled layer type" 2 "model.layers[1].type: unknown layer type \"linaer\" (did you mean \"linear\"?)" \
  train --config "$F"
F=$(layers notype '{ type = "flatten" }' '{ out = 10 }')
both "a layer without type" 2 "model.layers[1]: missing key 'type'" train --config "$F"
F=$(layers noout '{ type = "flatten" }' '{ type = "linear" }')
both "linear without out" 2 "model.layers[1].out is required for a linear layer" \
  train --config "$F"
F=$(layers kernel '{ type = "flatten" }' '{ type = "linear", out = 10, kernel = 3 }')
both "kernel on a linear layer" 2 "model.layers[1].kernel does not apply to a linear layer" \
  train --config "$F"
F=$(layers size '{ type = "flatten" }' '{ type = "linear", out = 10, size = 3 }')
both "an unknown layer key" 2 "unknown key 'model.layers[1].size'" train --config "$F"
F=$(layers string '"relu"')
both "a layer given as a string" 2 \
  "model.layers[0]: expected a table like {type = \"relu\"}, got string \"relu\"" \
  train --config "$F"
F=$(layers dotname '{ type = "flatten", name = "a.b" }' '{ type = "linear", out = 10 }')
both "a layer name with a dot" 2 "model.layers[0].name must be non-empty and contain no '.'" \
  train --config "$F"
F=$(layers dupname '{ type = "flatten", name = "x" }' '{ type = "linear", out = 10, name = "x" }')
both "two layers named x" 2 "model.layers[1].name \"x\" is already used by model.layers[0]" \
  train --config "$F"
F=$(layers poolpad '{ type = "maxpool", kernel = 2, pad = 2 }' '{ type = "flatten" }' \
  '{ type = "linear", out = 10 }')
both "pool padding above kernel / 2" 2 "model.layers[0].pad must be <= kernel / 2 (1), got 2" \
  train --config "$F"
F=$(layers dropout '{ type = "dropout", p = 1.0 }' '{ type = "flatten" }' \
  '{ type = "linear", out = 10 }')
both "dropout p = 1" 2 "model.layers[0].p must be in [0, 1), got 1.0" train --config "$F"
F=$( (sed '/^\[model\]/,/^$/d' "$BASE"; printf '\n[model]\nclasses = 10\nlayers = []\n') |
  toml nolayers)
both "model.layers empty" 2 "model.layers is empty" train --config "$F"
F=$(layers outshape '{ type = "flatten" }' '{ type = "linear", out = 12 }')
both "model output does not match model.classes" 2 \
  "] does not match model.classes = 10" train --config "$F"
F=$(layers noflatten '{ type = "linear", out = 10 }')
both "linear on images without flatten" 2 "hint: put a flatten layer before it" \
  train --config "$F"
F=$(layers conv1d '{ type = "flatten" }' '{ type = "conv2d", out = 4, kernel = 3 }' \
  '{ type = "flatten" }' '{ type = "linear", out = 10 }')
both "conv2d after flatten" 2 "conv2d '1' needs (N, C, H, W) input, got [" \
  train --config "$F"
F=$(layers bigkernel '{ type = "conv2d", out = 4, kernel = 40 }' '{ type = "flatten" }' \
  '{ type = "linear", out = 10 }')
both "a kernel larger than the image" 2 "kernel 40 with pad 0 does not fit input [" \
  train --config "$F"

echo "== data settings against the data (exit 2)"
both "data.mean with 2 values for 1 channel" 2 "data.mean has 2 values; give 1 or one per channel (1)" \
  train --config "$BASE" --set 'data.mean=[0.5, 0.5]' --set 'data.std=[0.5, 0.5]'
both "crop-flip on feature vectors" 2 "data.augment = \"crop-flip\" needs (C, H, W) images" \
  train --config "$BASE" --set model.name=linear --set data.augment=crop-flip
both "eval without data.test" 2 "dptrain eval needs a test set: data.test is empty" \
  eval --config "$BASE" --set data.test= --checkpoint "$TMP/none.h5"
CASE="train.accumulate does not divide the per-rank batch [4 ranks]"
expect_fail 2 "train.accumulate = 12 does not divide the per-rank batch 6 (train.global_batch 24 / 4 ranks)" \
  -- "${MPI4[@]}" "$DPTRAIN" train --config "$BASE" --set train.global_batch=24 \
  --set train.accumulate=12

both "train.epochs past a 64-bit step count" 2 "is more steps than a 64-bit count holds" \
  train --config "$BASE" --set train.epochs=9223372036854775807
# A milestone past the run's end is never reached: 1e30 epochs overflowed llround to a negative
# step, and the rate decayed from step 1.
CASE="train.milestones beyond any step: lr stays"
expect_ok -- "$DPTRAIN" train --config "$BASE" --set train.schedule=multistep \
  --set 'train.milestones=[1e30]' --set "run_dir=$TMP/milestones"
check "  ... every step at the base rate 0.01" python3 -c "
import json, sys
lrs = [j['lr'] for j in map(json.loads, open('$TMP/milestones/metrics.jsonl')) if j['kind'] == 'step']
sys.exit(0 if lrs and all(lr == 0.01 for lr in lrs) else f'lr: {lrs}')"

echo "== launcher environment (exit 2)"
CASE="a local size that MPI contradicts [1 process]"
expect_fail 2 "the launcher says 4 ranks on this host but MPI counts 1" \
  -- env OMPI_COMM_WORLD_LOCAL_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=0 "$DPTRAIN" train --config "$BASE"

echo "== dataset contents (exit 3)"
if find_h5py_python; then
  "$PY" - "$TMP" <<'EOF'
import sys, h5py, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(0)
img = rng.integers(0, 256, (64, 1, 28, 28), dtype=np.uint8)
lab = rng.integers(0, 10, 64).astype(np.int64)
def make(name, attrs={}, **datasets):
    with h5py.File(f"{d}/{name}", "w") as f:
        for k, v in datasets.items():
            f[k] = v
        for k, v in attrs.items():
            f.attrs[k] = v
np.save(f"{d}/images.npy", img)
np.save(f"{d}/labels.npy", lab)
make("empty.h5", images=img[:0], labels=lab[:0])
make("flabels.h5", images=img, labels=lab.astype(np.float32))
make("labels2d.h5", images=img, labels=lab.reshape(-1, 1))
make("classes2.h5", images=img, labels=lab, attrs={"classes": np.array([10, 10])})
make("classes0.h5", images=img, labels=lab, attrs={"classes": np.int64(0)})
make("mean2.h5", images=img, labels=lab, attrs={"mean": np.array([0.5, 0.5], np.float32),
                                               "std": np.array([0.5, 0.5], np.float32)})
make("std0.h5", images=img, labels=lab, attrs={"mean": np.array([0.5], np.float32),
                                              "std": np.array([0.0], np.float32)})
EOF
  mkdir -p "$TMP/dir.h5"
  for c in "dir.h5|is a directory, expected an HDF5 file" \
    "empty.h5|/images has no samples (N = 0)" \
    "flabels.h5|/labels has dtype float32, expected an integer type" \
    "labels2d.h5|/labels has rank 2 (shape [64, 1]), expected 1 [N]" \
    "classes2.h5|/labels: attribute classes must be one integer, got int64 with 2 values" \
    "classes0.h5|/labels: attribute classes = 0 is not a positive integer" \
    "mean2.h5|/images: attribute mean must be 1 or C = 1 numbers, got 2 of float32" \
    "std0.h5|/images: attribute std has value 0"; do
    f=${c%%|*}
    both "data.train: $f" 3 "$TMP/$f: ${c#*|}" train --config "$BASE" \
      --set "data.train=$TMP/$f" --set data.test= --set train.global_batch=16
  done
  one "convert into a directory that cannot be written" 3 "/proc/x.h5.tmp: cannot create HDF5 file" \
    convert --from npy --images "$TMP/images.npy" --labels "$TMP/labels.npy" --out /proc/x.h5
else
  skip "dataset contents: needs python3 with h5py"
fi

echo "== a run_dir another run is using (exit 2)"
# The first run holds run_dir/.dptrain.lock while it trains; a second run in the same run_dir
# stops before touching a file, on 1 process and on 4 ranks, and the first trains on.
"$DPTRAIN" train --config "$BASE" --set "run_dir=$TMP/shared" --set train.epochs=0 \
  --set train.max_steps=1000000 >"$TMP/first.out" 2>&1 </dev/null &
first=$!
for _ in $(seq 300); do
  grep -q "^dptrain: 1 ranks" "$TMP/first.out" && break
  sleep 0.1
done
both "a second run in the same run_dir" 2 \
  "run_dir '$TMP/shared' is in use by another dptrain run (pid $first on " \
  train --config "$BASE" --set "run_dir=$TMP/shared"
check "  ... the first run is still training" kill -0 "$first"
kill -TERM "$first" 2>/dev/null
wait "$first" 2>/dev/null
check "  ... and its metrics have one start record" \
  test "$(grep -c '"kind":"start"' "$TMP/shared/metrics.jsonl")" = 1

echo "== run_dir that cannot be written (exit 6 / 3; as user nobody: root writes anything)"
if setpriv --reuid=65534 --regid=65534 --clear-groups "$DPTRAIN" --version >/dev/null 2>&1; then
  chmod 711 "$TMP"
  # Owned by root, mode 755: nobody can neither create run_dir/checkpoints nor write config.toml
  # (ro); with a writable checkpoints/ made for it (ro2), config.toml is what fails.
  mkdir -p "$TMP/ro" "$TMP/ro2/checkpoints" && chmod 755 "$TMP/ro" "$TMP/ro2"
  chmod 777 "$TMP/ro2/checkpoints"
  cp "$BASE" "$TMP/ro.toml" && chmod 644 "$TMP/ro.toml"
  AS=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  both "run_dir/checkpoints cannot be created" 6 \
    "cannot create the checkpoint directory $TMP/ro/checkpoints: Permission denied" \
    train --config "$TMP/ro.toml" --set "run_dir=$TMP/ro"
  both "run_dir/config.toml cannot be written" 3 "cannot write $TMP/ro2/config.toml" \
    train --config "$TMP/ro.toml" --set "run_dir=$TMP/ro2"
  AS=()
else
  skip "run_dir not writable: cannot run $DPTRAIN as user nobody (setpriv)"
fi
finish
