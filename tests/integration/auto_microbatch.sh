#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# memory.auto_microbatch holds for the whole run (issue 13): the reference CNN on 2 ranks with a
# global batch of 1024 under memory.limit = 48MiB settles on a micro-batch, trains all its steps,
# evaluates and checkpoints without running out of memory (exit 0), and its losses equal those
# of the same micro-batch and accumulation run with a budget large enough (within 1e-5): the
# search changes no maths. And an out-of-memory in the middle of the run (injected on one rank
# by the test binary) makes every rank halve the micro-batch together and run that step again:
# no step lost, the losses within 1e-5 of a run that never ran out.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_fmnist

cfg=("$DPTRAIN_SRC/configs/fmnist_cnn.toml")
common=(--set "data.train=$DPTRAIN_DATA/fmnist/train.h5" --set "data.test=$DPTRAIN_DATA/fmnist/test.h5"
  --set train.global_batch=1024 --set train.max_steps=20 --set train.log_every_steps=1
  --set checkpoint.resume=never)

CASE="auto_microbatch under memory.limit = 48MiB: 20 steps, evaluation and checkpoint, exit 0"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "${cfg[@]}" "${common[@]}" \
  --set memory.limit=48MiB --set memory.auto_microbatch=true --set "run_dir=$TMP/auto"
micro=$(sed -n 's/.*training with micro-batch \([0-9]*\) x \([0-9]*\) micro-steps.*/\1 \2/p' \
  "$TMP/last.out" | tail -n 1)
echo "settled on micro-batch x micro-steps: ${micro:-?}"
check "the search settled on a micro-batch" test -n "$micro"

if [[ -n $micro ]]; then
  read -r m acc <<<"$micro"
  CASE="the same micro-batch ($m x $acc) with no memory limit"
  expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "${cfg[@]}" "${common[@]}" \
    --set "train.accumulate=$acc" --set "run_dir=$TMP/full"
  check "every logged loss and the final evaluation agree within 1e-5" \
    python3 - "$TMP/auto/metrics.jsonl" "$TMP/full/metrics.jsonl" <<'PY'
import json, sys
def series(path):
    rows = [json.loads(l) for l in open(path)]
    return ([(j["step"], j["loss"]) for j in rows if j["kind"] == "step"],
            [(j["step"], j["test_loss"]) for j in rows if j["kind"] == "eval"])
(a_steps, a_eval), (b_steps, b_eval) = series(sys.argv[1]), series(sys.argv[2])
ok = len(a_steps) == len(b_steps) == 20 and len(a_eval) == len(b_eval) >= 1
worst = 0.0
for (sa, la), (sb, lb) in zip(a_steps + a_eval, b_steps + b_eval):
    ok = ok and sa == sb
    worst = max(worst, abs(la - lb) / max(abs(lb), 1e-12))
print(f"worst relative loss difference {worst:.3g} over {len(a_steps)} steps and {len(a_eval)} evaluations")
sys.exit(0 if ok and worst <= 1e-5 else 1)
PY
fi

# compare_losses A B: every logged loss and evaluation of run A within 1e-5 of run B's.
compare_losses() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def series(path):
    rows = [json.loads(l) for l in open(path)]
    return [(j["kind"], j["step"], j.get("loss", j.get("test_loss"))) for j in rows
            if j["kind"] in ("step", "eval")]
a, b = series(sys.argv[1]), series(sys.argv[2])
ok = len(a) == len(b) > 0 and all(x[:2] == y[:2] for x, y in zip(a, b))
worst = max((abs(x[2] - y[2]) / max(abs(y[2]), 1e-12) for x, y in zip(a, b)), default=1)
print(f"worst relative loss difference {worst:.3g} over {len(a)} records")
sys.exit(0 if ok and worst <= 1e-5 else 1)
PY
}

mlp=(--config "$DPTRAIN_SRC/configs/mlp_layers.toml"
  --set "data.train=$DPTRAIN_DATA/fmnist/train.h5" --set "data.test=$DPTRAIN_DATA/fmnist/test.h5"
  --set train.epochs=0 --set train.max_steps=8 --set train.log_every_steps=1
  --set train.eval_every_epochs=0 --set checkpoint.resume=never --set memory.auto_microbatch=true)
CASE="an out-of-memory on rank 1 at step 4 (after 3): every rank halves the micro-batch and goes on"
expect_ok -- env DPTRAIN_TEST_OOM=1:3 "${MPI2[@]}" "$DPTRAIN_HOOKED" train "${mlp[@]}" \
  --set "run_dir=$TMP/oom"
check "the halving is announced once, naming rank 1 and step 4" \
  test "$(grep -c 'micro-batch 64 ran out of memory on rank 1 at step 4' "$TMP/last.out")" = 1
check "all 8 steps were logged" \
  test "$(grep -c '"kind":"step"' "$TMP/oom/metrics.jsonl")" = 8
CASE="the same run with no out-of-memory"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train "${mlp[@]}" --set "run_dir=$TMP/nooom"
check "no evaluation: train.eval_every_epochs = 0 means never, not even at the end" \
  bash -c "! grep -q '\"kind\":\"eval\"' '$TMP/nooom/metrics.jsonl'"
check "its losses agree with the run that halved mid-run within 1e-5" \
  compare_losses "$TMP/oom/metrics.jsonl" "$TMP/nooom/metrics.jsonl"

CASE="the same out-of-memory without memory.auto_microbatch: exit 4 on every rank, no hang"
expect_fail 4 "out of memory (test hook) at step 4" -- env DPTRAIN_TEST_OOM=1:3 "${MPI2[@]}" \
  "$DPTRAIN_HOOKED" train "${mlp[@]}" --set memory.auto_microbatch=false --set "run_dir=$TMP/off"

finish
