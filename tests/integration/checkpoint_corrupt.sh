#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Bad checkpoints and bad places to write them, each as 1 process and as 4 ranks: a truncated file, a flipped byte in
# a tensor, an edited /state attribute, a missing tensor, a checkpoint of another model, every checkpoint invalid, a
# checkpoint directory that cannot be created, a disk that fills up during a write. Each: exit 6
# within 30 s, one message naming the file (and the tensor), nothing overwritten. A uniform
# `module.` prefix is stripped with a notice; resume = auto skips an invalid newest file.
# shellcheck disable=SC2034  # CASE is read by expect_ok / expect_fail (lib.sh)
# shellcheck source=checkpoint_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/checkpoint_common.sh"
fail_fast_teardown  # every multi-rank case here ends with a rank exiting non-zero

SRC=$TMP/src
CASE="setup: 1 process, 8 steps, checkpoints at 4 and 8"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$SRC" --set train.max_steps=8 \
  --set checkpoint.every_steps=4
CASE="setup: an mlp checkpoint (another model)"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/mlp" \
  --set train.max_steps=2 --set model.name=mlp

# fresh NAME: a copy of the source run dir to damage.
fresh() {
  rm -rf "${TMP:?}/$1"
  cp -r "$SRC" "$TMP/$1"
  echo "$TMP/$1"
}

# refuses CASE CODE PATTERN DIR args...: 1 process, then 4 ranks, train in DIR with args; each
# exits CODE with PATTERN printed once, and every file of DIR is unchanged.
refuses() {
  local name=$1 code=$2 pattern=$3 dir=$4 before
  shift 4
  before=$(snapshot "$dir")
  both "$name" "$code" "$pattern" -- train --config "$CONFIG" --set "run_dir=$dir" \
    --set train.max_steps=12 "$@"
  check "$name: nothing in the run dir changed" test "$(snapshot "$dir")" = "$before"
}

echo "== truncated file"
D=$(fresh trunc)
f=$(ckpt "$D" 8)
head -c $(($(stat -c %s "$f") / 2)) "$f" >"$f.half" && mv "$f.half" "$f"
refuses "resume = PATH, truncated" 6 "checkpoint $f: cannot open (truncated or corrupt file?)" \
  "$D" --set "checkpoint.resume=$f"
both "eval of the truncated file" 6 "checkpoint $f: cannot open (truncated or corrupt file?)" \
  -- eval --config "$CONFIG" --checkpoint "$f"
CASE="resume = auto skips it and resumes from step 4"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$D" \
  --set train.max_steps=12
check "the skipped file is reported once, by name" \
  last_err_count "warning: skipping an invalid checkpoint: " 1
check "... naming it" grep -qF "checkpoint $f: cannot open" "$TMP/last.err"
check "resumed from step 4" grep -qF "resuming from $(ckpt "$D" 4): step 4" "$TMP/last.out"

echo "== a flipped byte in a tensor"
D=$(fresh flip)
f=$(ckpt "$D" 8)
ckpt_py flip "$f" params/fc1.weight 123456
refuses "resume = PATH, flipped byte" 6 \
  "checkpoint $f is corrupt (1 problem): /params/fc1.weight: checksum mismatch" \
  "$D" --set "checkpoint.resume=$f"
both "eval of the flipped file" 6 "/params/fc1.weight: checksum mismatch" \
  -- eval --config "$CONFIG" --checkpoint "$f"
CASE="inspect shows the bad tensor"
expect_ok -- "$DPTRAIN" inspect "$f"
check "inspect: fc1.weight CRC32 MISMATCH, verdict INVALID" \
  bash -c "grep -q 'fc1.weight .*CRC32 MISMATCH' '$TMP/last.out' && grep -q 'verdict: INVALID' '$TMP/last.out'"

echo "== an edited /state attribute"
D=$(fresh state)
f=$(ckpt "$D" 8)
ckpt_py set_state "$f" elapsed_s 99.5
refuses "resume = PATH, /state@elapsed_s edited" 6 \
  "checkpoint $f is corrupt (1 problem): /state: checksum mismatch" \
  "$D" --set "checkpoint.resume=$f"
ckpt_py set_state "$f" elapsed_s 99.5 fix
CASE="... accepted once /state@crc32 is recomputed as docs/checkpoints.md says"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$D" --set train.max_steps=10 \
  --set "checkpoint.resume=$f"
check "resumed from step 8" grep -qF "resuming from $f: step 8" "$TMP/last.out"

echo "== a missing tensor"
D=$(fresh missing)
f=$(ckpt "$D" 8)
ckpt_py delete "$f" params/fc2.bias
refuses "resume = PATH, /params/fc2.bias deleted" 6 \
  "checkpoint $f does not match the model: /params: 1 missing: fc2.bias [10]" \
  "$D" --set "checkpoint.resume=$f"

echo "== a checkpoint of another model"
D=$(fresh other)
f=$(ckpt "$TMP/mlp" 2)
refuses "resume = PATH, an mlp checkpoint into ref_cnn" 6 \
  "checkpoint $f does not match the model: /params: 4 missing: conv1.weight [32, 1, 3, 3], conv1.bias [32], conv2.weight [64, 32, 3, 3], conv2.bias [64]; 2 unexpected: fc3.bias [10], fc3.weight [10, 128]; 4 mis-shaped: fc1.weight is float32 [256, 784] in the file, float32 [128, 3136] in the model" \
  "$D" --set "checkpoint.resume=$f"
both "checkpoint.init from another model" 6 "checkpoint $f does not match the model" \
  -- train --config "$CONFIG" --set "run_dir=$TMP/init-other" --set "checkpoint.init=$f"
check "... and it wrote no checkpoint" test ! -e "$TMP/init-other/checkpoints/ckpt-00000000.h5"
both "eval of another model's checkpoint" 6 "does not match the model: /params: 4 missing: conv1.weight" \
  -- eval --config "$CONFIG" --checkpoint "$f"

echo "== every checkpoint invalid, resume = auto"
D=$(fresh allbad)
for s in 4 8; do ckpt_py flip "$(ckpt "$D" $s)" params/conv2.weight 1000; done
refuses "resume = auto, both checkpoints corrupt" 6 \
  "$D/checkpoints holds 2 checkpoint file(s) and none is valid" "$D"

echo "== a 'module.' prefix (a DDP-wrapped export) is stripped"
D=$(fresh prefix)
f=$(ckpt "$D" 8)
ckpt_py prefix "$f" module.
CASE="resume = PATH with module.-prefixed names"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$D" \
  --set "checkpoint.resume=$f" --set train.max_steps=12
check "notice: the prefix was stripped" \
  grep -qF "every name in /params starts with 'module.' (a DataParallel/DDP wrapper); the prefix was stripped" "$TMP/last.out"
check "the checkpoints it writes have no prefix" \
  bash -c "'$DPTRAIN' inspect '$(ckpt "$D" 12)' | grep -q '^  conv1.weight '"

echo "== the checkpoint directory cannot be created"
D=$TMP/nodir
mkdir -p "$D"
echo "a file, not a directory" >"$D/checkpoints"
refuses "run_dir/checkpoints is a regular file" 6 \
  "cannot create the checkpoint directory $D/checkpoints" "$D"

echo "== the disk fills up during a write"
FULL=$TMP/full
mkdir -p "$FULL"
if mount -t tmpfs -o size=5m dptrain-full "$FULL" 2>/dev/null; then
  trap 'umount "$FULL" 2>/dev/null; cleanup' EXIT
  # 5 MB: config, metrics and the step-2 checkpoint (3.4 MB) fit, the step-4 one does not.
  for ranks in 1 4; do
    rm -rf "${FULL:?}/run"
    if ((ranks == 1)); then launch=("$DPTRAIN"); else launch=("${MPI4[@]}" "$DPTRAIN"); fi
    CASE="$ranks rank(s), checkpoint every 2 steps on a 5 MB file system"
    expect_fail 6 "cannot write checkpoint $(ckpt "$FULL/run" 4): write to $FULL/run/checkpoints/.ckpt-00000004.h5.tmp: No space left on device (ENOSPC: the disk is full); the previous checkpoints are intact" -- \
      "${launch[@]}" train --config "$CONFIG" --set "run_dir=$FULL/run" \
      --set train.max_steps=12 --set checkpoint.every_steps=2
    check "  ... the step-2 checkpoint still verifies" ckpt_py valid "$(ckpt "$FULL/run" 2)"
    check "  ... no temporary file left" bash -c "! ls -A '$FULL/run/checkpoints' | grep -q tmp"
    check "  ... no step-4 checkpoint" test ! -e "$(ckpt "$FULL/run" 4)"
  done
  umount "$FULL"
else
  skip "ENOSPC: cannot mount a small tmpfs here (needs CAP_SYS_ADMIN); the unit test CheckpointTest.FullDiskFailsCleanlyAndKeepsThePreviousCheckpoint covers it with /dev/full"
fi

finish
