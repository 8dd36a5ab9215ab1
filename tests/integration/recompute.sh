#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# memory.recompute: resnet8 trained with activation recompute says so on the start line, holds a
# lower peak, and gives the same bits as the run without it (every step's loss and gradient norm,
# the evaluation, the final checkpoint's parameters): on 1 process in fp32, on 2 ranks in bf16
# with 2 micro-steps a step, and on 2 ranks with sharded gradients. Under a memory.limit the run
# without it does not fit (exit 4, the hint names memory.recompute) and the run with it trains.
# `dptrain plan` shows the recomputed activations' row and a smaller total. The numbers per layer
# are the unit tests' (RecomputeTest).
# shellcheck disable=SC2034  # CASE is read by expect_ok (lib.sh)
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUN=(train --config "$DPTRAIN_SRC/configs/resnet8.toml" --set data.train=synthetic
  --set data.test=synthetic --set data.synthetic_samples=128 --set train.global_batch=32
  --set train.epochs=1 --set train.max_steps=4 --set train.log_every_steps=1
  --set data.augment=none --set checkpoint.every_epochs=1 --set checkpoint.resume=never)

# summary RUN_DIR: every step's loss and gradient norm and every evaluation's loss (full
# precision), then the largest peak_mem_bytes, one line.
summary() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
rows = list(map(json.loads, open(sys.argv[1])))
steps = [f'{r["loss"]!r} {r["grad_norm"]!r}' for r in rows if r.get("kind") == "step"]
evals = [repr(r["test_loss"]) for r in rows if r.get("kind") == "eval"]
peak = max(r["peak_mem_bytes"]["max"] for r in rows if "peak_mem_bytes" in r)
print(len(steps), len(evals), " ".join(steps + evals), int(peak))
PY
}

# same_bits A B: the two summaries' numbers are equal (not only close), 4 steps and an evaluation.
same_bits() {
  python3 -c "import sys; a, b = (s.split() for s in sys.argv[1:3]); \
sys.exit(not (a[:2] == b[:2] == ['4', '1'] and a[2:-1] == b[2:-1]))" "$1" "$2"
}
# lower_peak A B: run B's peak is below 80% of run A's.
lower_peak() {
  python3 -c "import sys; a, b = (int(s.split()[-1]) for s in sys.argv[1:3]); \
print(f'peak {a / 2**20:.1f} -> {b / 2**20:.1f} MiB'); sys.exit(not b < 0.8 * a)" "$1" "$2"
}
# same_params A B: the newest checkpoints of the two run directories hold equal parameters.
same_params() {
  "$PY" - "$1" "$2" <<'PY'
import glob, sys
import h5py, numpy as np
def params(d):
    f = h5py.File(sorted(glob.glob(d + "/checkpoints/*.h5"))[-1], "r")
    out = {}
    f["params"].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
a, b = params(sys.argv[1]), params(sys.argv[2])
print(f"{len(a)} parameter tensors")
sys.exit(not (a.keys() == b.keys() and len(a) > 0 and all(np.array_equal(a[k], b[k]) for k in a)))
PY
}

CASE="fp32, 1 process, memory.recompute = false"
expect_ok -- "$DPTRAIN" "${RUN[@]}" --set dist.threads=2 --set "run_dir=$TMP/off"
check "the start line does not say recompute" bash -c "! grep -q 'recompute (' '$TMP/last.out'"
off=$(summary "$TMP/off")

CASE="fp32, 1 process, memory.recompute = true"
expect_ok -- "$DPTRAIN" "${RUN[@]}" --set dist.threads=2 --set memory.recompute=true \
  --set "run_dir=$TMP/on"
check "the start line says recompute (N segments)" \
  grep -Eq ', recompute \([0-9]+ segments\)$' "$TMP/last.out"
on=$(summary "$TMP/on")
check "the same losses, gradient norms and evaluation to the bit" same_bits "$off" "$on"

# A model with nothing to cut (one linear layer): asked for, recompute says it does nothing.
CASE="the linear model, memory.recompute = true"
expect_ok -- "$DPTRAIN" train --config "$DPTRAIN_SRC/configs/linear.toml" --set train.max_steps=2 \
  --set data.synthetic_samples=128 --set checkpoint.resume=never --set memory.recompute=true \
  --set "run_dir=$TMP/linear"
check "the start line says recompute: none" \
  grep -q ', recompute: none (no cut of this model holds less)$' "$TMP/last.out"
check "a peak below 80% of the run without it" lower_peak "$off" "$on"
if find_h5py_python; then
  check "the final checkpoints hold the same parameters" same_params "$TMP/off" "$TMP/on"
else
  skip "the final checkpoints hold the same parameters (no python3 with h5py)"
fi

# A budget half way between the two peaks: the run that does not fit is told about
# memory.recompute, and with it the same run trains.
limit=$(( ($(awk '{ print $NF }' <<<"$off") + $(awk '{ print $NF }' <<<"$on")) / 2 ))
CASE="memory.limit = $limit bytes without memory.recompute: out of memory, the hint names it"
expect_fail 4 "or set memory.recompute = true" -- "$DPTRAIN" "${RUN[@]}" --set dist.threads=2 \
  --set "memory.limit=$limit" --set "run_dir=$TMP/oom"
CASE="memory.limit = $limit bytes with memory.recompute = true: trains"
expect_ok -- "$DPTRAIN" "${RUN[@]}" --set dist.threads=2 --set "memory.limit=$limit" \
  --set memory.recompute=true --set "run_dir=$TMP/fits"
check "the same bits as the run without a limit" same_bits "$off" "$(summary "$TMP/fits")"

# on_off WHAT DIR ARGS...: 2 ranks trained with ARGS, memory.recompute off and on, give the same
# bits.
on_off() {
  local what=$1 dir=$2
  shift 2
  CASE="$what, memory.recompute = false"
  expect_ok -- "${MPI2[@]}" "$DPTRAIN" "${RUN[@]}" "$@" --set "run_dir=$TMP/${dir}_off"
  CASE="$what, memory.recompute = true"
  expect_ok -- "${MPI2[@]}" "$DPTRAIN" "${RUN[@]}" "$@" --set memory.recompute=true \
    --set "run_dir=$TMP/${dir}_on"
  check "the same losses, gradient norms and evaluation to the bit" same_bits \
    "$(summary "$TMP/${dir}_off")" "$(summary "$TMP/${dir}_on")"
}
on_off "bf16, 2 ranks x 2 micro-steps" bf16 --set train.precision=bf16 --set train.accumulate=2 \
  --set dist.threads=1
# Sharded gradients: a group's gradients are bound before its first node's backward, with the
# recompute running in between.
on_off "fp32, 2 ranks, dist.shard = gradients" shard --set dist.shard=gradients \
  --set dist.threads=1

CASE="dptrain plan with memory.recompute = true"
plan_total() {
  "$DPTRAIN" plan --config "$DPTRAIN_SRC/configs/resnet8.toml" --set data.train=synthetic \
    --set data.test= "$@" | awk '$1 == "total" { print $2 }'
}
expect_ok -- "$DPTRAIN" plan --config "$DPTRAIN_SRC/configs/resnet8.toml" \
  --set data.train=synthetic --set data.test= --set memory.recompute=true
check "the plan shows the recomputed activations' row" \
  grep -Eq '^activations \([0-9]+ segments\) +recomputed' "$TMP/last.out"
check "and a smaller total than without it" python3 -c \
  "import sys; a, b = map(float, sys.argv[1:3]); print(a, '->', b, 'MiB'); sys.exit(not b < a)" \
  "$(plan_total)" "$(plan_total --set memory.recompute=true)"

# With it off, the plan says what it would take, and where the config does not fit a budget that
# the recomputed run fits, names it in the advice.
PLAN=(plan --config "$DPTRAIN_SRC/configs/resnet8.toml" --set data.train=synthetic --set data.test=)
CASE="dptrain plan without memory.recompute"
expect_ok -- "$DPTRAIN" "${PLAN[@]}"
check "says what memory.recompute = true would need" \
  grep -Eq '^memory.recompute = true would need [0-9]+ MiB' "$TMP/last.out"
mid=$(python3 -c "import sys; print(int((float(sys.argv[1]) + float(sys.argv[2])) / 2))" \
  "$(plan_total)" "$(plan_total --set memory.recompute=true)")
CASE="dptrain plan under memory.limit = ${mid}MiB, between the two totals"
expect_ok -- "$DPTRAIN" "${PLAN[@]}" --set "memory.limit=${mid}MiB"
check "does not fit, and the advice names memory.recompute, which fits" \
  grep -Eq '^does NOT fit: .*, or memory.recompute = true \([0-9]+ MiB: fits\)$' "$TMP/last.out"
CASE="dptrain plan --json"
expect_ok -- "$DPTRAIN" "${PLAN[@]}" --json
check "recompute_total_bytes below total_bytes" python3 -c \
  "import json, sys; j = json.load(open(sys.argv[1])); sys.exit(not 0 < j['recompute_total_bytes'] < j['total_bytes'])" \
  "$TMP/last.out"

finish
