#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Resuming through the command line (Fashion-MNIST, train.deterministic): a run resumed from its
# step-8 checkpoint ends bitwise equal to the uninterrupted run on the same world size and to a
# relative 1e-5 when a 4-rank checkpoint is resumed on 2 and on 1 rank; metrics.jsonl is
# appended; `keep`; resume = never / PATH / auto on a finished run; another global batch is
# refused (exit 6); checkpoint.init; `dptrain eval` (1 and 2 ranks agree) and `dptrain inspect`.
# shellcheck disable=SC2034  # CASE is read by expect_ok / expect_fail (lib.sh)
# shellcheck source=checkpoint_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/checkpoint_common.sh"

echo "== uninterrupted reference runs"
A=$TMP/a
CASE="2 ranks, 16 steps, checkpoint every 4 (keep 10)"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$A" \
  --set checkpoint.every_steps=4 --set checkpoint.keep=10
check "checkpoints at 4, 8, 12, 16" test -f "$(ckpt "$A" 4)" -a -f "$(ckpt "$A" 8)" \
  -a -f "$(ckpt "$A" 12)" -a -f "$(ckpt "$A" 16)"
check "no temporary file left" bash -c "! ls -A '$A/checkpoints' | grep -q tmp"
check "the final checkpoint verifies (h5py + zlib.crc32)" ckpt_py valid "$(ckpt "$A" 16)"
C=$TMP/c
CASE="4 ranks, 16 steps, checkpoint every 8"
expect_ok -- "${MPI4[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$C" \
  --set checkpoint.every_steps=8

echo "== keep"
K=$TMP/k
CASE="1 process, 16 steps, checkpoint every 2, keep 3"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$K" \
  --set checkpoint.every_steps=2 --set checkpoint.keep=3
check "keep = 3: exactly ckpt 12, 14, 16 remain" \
  test "$(find "$K/checkpoints" -type f -printf '%f\n' | sort | tr '\n' ' ')" = "ckpt-00000012.h5 ckpt-00000014.h5 ckpt-00000016.h5 "

echo "== resume on the same world size: bitwise"
B=$TMP/b
mkdir -p "$B/checkpoints"
cp "$(ckpt "$A" 8)" "$B/checkpoints/"
head -n 3 "$A/metrics.jsonl" >"$B/metrics.jsonl"
CASE="2 ranks resume from step 8 (resume = auto)"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$B"
check "it says where it resumed" grep -qF "resuming from $(ckpt "$B" 8): step 8, epoch 0 + 8/937 steps, saved by 2 ranks" "$TMP/last.out"
check "final parameters and optimizer state bitwise equal to the uninterrupted run" \
  ckpt_py same "$(ckpt "$B" 16)" "$(ckpt "$A" 16)"
check "metrics.jsonl appended (3 earlier lines kept, new steps after them)" \
  bash -c "[[ \$(head -n 3 '$B/metrics.jsonl') == \"\$(head -n 3 '$A/metrics.jsonl')\" ]] && \
           grep -q '\"step\":12' '$B/metrics.jsonl' && [[ \$(wc -l <'$B/metrics.jsonl') -gt 5 ]]"
CASE="resume = auto on a finished run"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$B"
check "nothing left to train" grep -qF "nothing left to train" "$TMP/last.out"
check "the finished checkpoint is unchanged" ckpt_py same "$(ckpt "$B" 16)" "$(ckpt "$A" 16)"

echo "== resume a 4-rank checkpoint on 2 and on 1 rank: relative 1e-5"
CASE="2 ranks resume the 4-rank checkpoint (resume = PATH)"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/d2" \
  --set "checkpoint.resume=$(ckpt "$C" 8)"
check "it notes the new world size" grep -qF "saved by 4 ranks (now 2: same global batch 64, 32 per rank)" "$TMP/last.out"
check "2 ranks vs 4 ranks uninterrupted: relative <= 1e-5" \
  ckpt_py close "$(ckpt "$TMP/d2" 16)" "$(ckpt "$C" 16)" 1e-5
CASE="1 process resumes the 4-rank checkpoint"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/d1" \
  --set "checkpoint.resume=$(ckpt "$C" 8)"
check "1 rank vs 4 ranks uninterrupted: relative <= 1e-5" \
  ckpt_py close "$(ckpt "$TMP/d1" 16)" "$(ckpt "$C" 16)" 1e-5

echo "== what cannot resume, and resume = never"
before=$(snapshot "$A")
CASE="another global batch: exit 6 naming both"
expect_fail 6 "train.global_batch is 64 in the checkpoint, 128 in this run" -- \
  "${MPI2[@]}" "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$A" \
  --set train.global_batch=128 --set train.max_steps=20
check "nothing in the run dir changed" test "$(snapshot "$A")" = "$before"
CASE="resume = never starts over"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/never" \
  --set "checkpoint.resume=never" --set train.max_steps=4
check "no resume line" bash -c "! grep -q resuming '$TMP/last.out'"

echo "== checkpoint.init, eval, inspect"
CASE="checkpoint.init loads the parameters only"
expect_ok -- "$DPTRAIN" train --config "$CONFIG" --set "run_dir=$TMP/init" \
  --set "checkpoint.init=$(ckpt "$A" 16)" --set train.max_steps=2
check "it says so" grep -qF "parameters initialised from $(ckpt "$A" 16)" "$TMP/last.out"
check "it starts at step 0" grep -qF "step 2/2" "$TMP/last.out"
CASE="eval on 1 process"
expect_ok -- "$DPTRAIN" eval --config "$CONFIG" --checkpoint "$(ckpt "$A" 16)"
e1=$(grep -o 'test_loss [0-9.]* test_accuracy [0-9.]* over [0-9]* samples' "$TMP/last.out")
CASE="eval on 2 ranks"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" eval --config "$CONFIG" --checkpoint "$(ckpt "$A" 16)"
e2=$(grep -o 'test_loss [0-9.]* test_accuracy [0-9.]* over [0-9]* samples' "$TMP/last.out")
echo "  1 rank:  $e1"
echo "  2 ranks: $e2"
check "eval prints test_loss and test_accuracy over the 10000 test samples" \
  bash -c "[[ '$e1' == *'over 10000 samples' ]]"
check "1 and 2 ranks agree (exact-once split; loss to 1e-5)" "$PY" -c "
a, b = '$e1'.split(), '$e2'.split()
assert a[3] == b[3] and a[5] == b[5], (a, b)
assert abs(float(a[1]) - float(b[1])) <= 1e-5, (a, b)"
CASE="inspect a checkpoint"
expect_ok -- "$DPTRAIN" inspect "$(ckpt "$A" 16)"
for s in "step 16  epoch 0" "world_size_at_save 2  global_batch 64" \
  "conv1.weight  float32 [32, 1, 3, 3]" "fc1.weight    float32 [128, 3136]" \
  "fc2.bias/momentum_buffer" "verdict: valid" 'name = "ref_cnn"'; do
  check "inspect shows '$s'" grep -qF -- "$s" "$TMP/last.out"
done

finish
