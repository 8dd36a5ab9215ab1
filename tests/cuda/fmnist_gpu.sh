#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# GPU end-to-end (label cuda): the reference CNN on Fashion-MNIST through `dptrain train` on one
# GPU and, with two or more GPUs, on two GPUs with NCCL (2 epochs each, test accuracy >= 0.87),
# the set-device policy, an error on one rank ending a 2-GPU run at once, and the binding
# errors: two ranks forced onto one GPU, and more ranks than GPUs, each stopping every rank with
# one message. Skipped (exit 77) without a GPU or without the converted data.
# shellcheck source-path=SCRIPTDIR source=../integration/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../integration/lib.sh"
require_fmnist
require_cuda
echo "dptrain info:"
sed 's/^/  | /' "$TMP/info.out"
check "dptrain info shows one binding line per GPU" \
  test "$(grep -c '^  local rank ' "$TMP/info.out")" = "$NGPU"

TRAIN=(train --config "$DPTRAIN_SRC/configs/fmnist_cnn.toml"
  --set "data.train=$DPTRAIN_DATA/fmnist/train.h5" --set "data.test=$DPTRAIN_DATA/fmnist/test.h5"
  --set dist.device=cuda --set checkpoint.every_epochs=0)

# accuracy RUN_DIR: the last eval's test accuracy.
accuracy() {
  python3 -c '
import json, sys
evals = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "eval"]
print(evals[-1]["test_accuracy"] if evals else -1)' "$1/metrics.jsonl" 2>/dev/null || echo -1
}

# train_and_check NAME LAUNCHER... : 2 epochs, exit 0, accuracy >= 0.87, the binding table.
train_and_check() {
  local name=$1 rc=0 start=$SECONDS acc
  shift
  timeout -k 10 900 "$@" "$DPTRAIN" "${TRAIN[@]}" --set "run_dir=$TMP/$name" \
    --set train.epochs=2 >"$TMP/$name.out" 2>"$TMP/$name.err" </dev/null || rc=$?
  tail -n 3 "$TMP/$name.out"
  if [[ $rc != 0 ]]; then
    fail "$name: training exited $rc after $((SECONDS - start))s"
    tail -n 30 "$TMP/$name.err"
    return
  fi
  pass "$name: training exits 0 ($((SECONDS - start))s)"
  acc=$(accuracy "$TMP/$name")
  check "$name: test_accuracy $acc >= 0.87" python3 -c "import sys; sys.exit(0 if $acc >= 0.87 else 1)"
  check "$name: rank 0 prints the binding table with GPU (or MIG) UUIDs" grep -Eq ' (GPU|MIG)-' "$TMP/$name.out"
}

train_and_check gpu1
if ((NGPU >= 2)); then
  train_and_check gpu2 "${MPI2[@]}"
  check "gpu2: the two ranks are on two different GPUs" \
    test "$(grep -Eo '(GPU|MIG)-[0-9a-f-]*' "$TMP/gpu2.out" | sort -u | wc -l)" -ge 2
  # Issue 13 #2: unwinding aborts the NCCL communicator instead of finalizing it (which waits
  # for the peers, blocked in the next collective, for dist.collective_timeout_s); expect_fail
  # calls anything over 30 s a hang.
  CASE="an error on one rank ends a 2-GPU NCCL run at once (collective timeout 300 s)"
  expect_fail 4 "out of memory (test hook) at step 4" -- env DPTRAIN_TEST_OOM=1:3 "${MPI2[@]}" \
    "$DPTRAIN_HOOKED" "${TRAIN[@]}" --set "run_dir=$TMP/onerank" --set train.max_steps=20 \
    --set train.eval_every_epochs=0 --set dist.collective_timeout_s=300
  CASE="set-device policy, 2 ranks, 20 steps"
  expect_ok -- "${MPI2[@]}" "$DPTRAIN" "${TRAIN[@]}" --set "run_dir=$TMP/setdev" \
    --set dist.device_binding=set-device --set train.max_steps=20 --set train.eval_every_epochs=0
else
  skip "2-GPU runs need 2 GPUs (found $NGPU)"
fi

CASE="two ranks forced onto one GPU stop with one message"
CUDA_VISIBLE_DEVICES=0 expect_fail 2 "are on the same GPU" -- "${MPI2[@]}" "$DPTRAIN" \
  "${TRAIN[@]}" --set "run_dir=$TMP/shared" --set train.max_steps=5

CASE="more ranks than GPUs stop with one message"
# One GPU is the one-GPU-per-task rule (every rank uses it), so the uniqueness check stops it.
want="but only $NGPU GPUs are available"
((NGPU == 1)) && want="are on the same GPU"
expect_fail 2 "$want" -- "$MPIEXEC" -np $((NGPU + 1)) --oversubscribe \
  "$DPTRAIN" "${TRAIN[@]}" --set "run_dir=$TMP/toomany" --set train.max_steps=5

finish
