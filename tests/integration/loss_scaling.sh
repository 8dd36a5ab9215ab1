#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Dynamic loss scaling end to end on 2 ranks (enabled in fp32 by the test hook
# DPTRAIN_TEST_LOSS_SCALING=1, so that the step of the overflow is known; fp16.sh has real fp16
# overflows): an overflow injected into rank 1's gradients at step 6 (DPTRAIN_TEST_INF_GRAD=1:5,
# after 5 steps) makes EVERY rank skip that step and halve the scale; metrics.jsonl records the scale and the skipped steps; the scaler's state
# survives a checkpoint resume. Also the fp32 path without scaling: the same fault stops the run
# naming the step and the layer (exit 3, printed once). And real fp16 that diverges: once the
# scale is at its minimum a further overflow stops every rank (exit 3) instead of skipping
# every step to the end.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cat > "$TMP/ls.toml" <<'TOML'
seed = 3
[model]
name = "ref_cnn"
[data]
train = "synthetic"
synthetic_samples = 512
workers = 0
[train]
epochs = 0
max_steps = 12
global_batch = 32
log_every_steps = 1
[checkpoint]
every_steps = 8
every_epochs = 0
resume = "auto"
TOML

run=$TMP/ls-run
CASE="loss scaling: an overflow on rank 1 at step 6"
DPTRAIN_TEST_LOSS_SCALING=1 DPTRAIN_TEST_INF_GRAD=1:5 expect_ok -- "${MPI2[@]}" "$DPTRAIN_HOOKED" train \
  --config "$TMP/ls.toml" --set "run_dir=$run" --set train.max_steps=8
check "  ... the skip is announced once" \
  test "$(grep -c 'step skipped on every rank, scale 65536 -> 32768' "$TMP/last.out")" = 1
check "  ... metrics: scale 65536 before, 32768 after, 1 skipped step" python3 - "$run/metrics.jsonl" <<'PY'
import json, sys
steps = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "step"]
by = {j["step"]: j for j in steps}
assert by[5]["loss_scale"] == 65536 and by[5]["skipped_steps"] == 0, by[5]
assert by[6]["loss_scale"] == 32768 and by[6]["skipped_steps"] == 1, by[6]
assert by[8]["loss_scale"] == 32768 and by[8]["skipped_steps"] == 1, by[8]
PY
CASE="loss scaling: resume from step 8 keeps the scale and the skipped count"
DPTRAIN_TEST_LOSS_SCALING=1 expect_ok -- "${MPI2[@]}" "$DPTRAIN_HOOKED" train \
  --config "$TMP/ls.toml" --set "run_dir=$run"
check "  ... resumed, first new step has scale 32768 and 1 skipped" python3 - "$run/metrics.jsonl" <<'PY'
import json, sys
steps = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "step"]
after = [j for j in steps if j["step"] == 9]
assert after and after[-1]["loss_scale"] == 32768 and after[-1]["skipped_steps"] == 1, after
assert max(j["step"] for j in steps) == 12
PY

CASE="fp32 without loss scaling: a non-finite gradient on rank 1 stops every rank [2 ranks]"
DPTRAIN_TEST_INF_GRAD=1:5 expect_fail 3 "non-finite gradient at step 6 (first in" -- \
  "${MPI2[@]}" "$DPTRAIN_HOOKED" train --config "$TMP/ls.toml" --set "run_dir=$TMP/nf" \
  --set checkpoint.resume=never

CASE="fp16 that diverges: skips halve the scale to its minimum, then every rank stops [2 ranks]"
expect_fail 3 "with the loss scale already at its minimum (1); the run has diverged (16 steps skipped before it)" -- \
  "${MPI2[@]}" "$DPTRAIN" train --config "$TMP/ls.toml" --set "run_dir=$TMP/div" \
  --set checkpoint.resume=never --set train.precision=fp16 --set train.lr=1e6 \
  --set train.global_batch=8 --set train.max_steps=200
check "  ... the scale went down one halving per skip, 65536 -> 1, before the stop" \
  test "$(grep -c 'step skipped on every rank, scale' "$TMP/last.out")" = 16
check "  ... metrics.jsonl ends with the error record (exit 3)" python3 - "$TMP/div/metrics.jsonl" <<'PY'
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
assert last["kind"] == "error" and last["exit_code"] == 3, last
assert "already at its minimum" in last["message"], last
PY

CASE="replica divergence: a flipped parameter on rank 1 at step 3 stops the job [2 ranks]"
DPTRAIN_TEST_FLIP_PARAM=1:3 expect_fail 70 "the model replicas diverged at step 4" -- \
  "${MPI2[@]}" "$DPTRAIN_HOOKED" train --config "$TMP/ls.toml" --set "run_dir=$TMP/flip" \
  --set checkpoint.resume=never --set dist.check_replicas_every=2
finish
