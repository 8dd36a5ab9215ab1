#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# memory.auto_microbatch holds for the whole run (issue 13): the reference CNN on 2 ranks with a
# global batch of 1024 under memory.limit = 48MiB settles on a micro-batch, trains all its steps,
# evaluates and checkpoints without running out of memory (exit 0), and its losses equal those
# of the same micro-batch and accumulation run with a budget large enough (within 1e-5): the
# search changes no maths.
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

finish
