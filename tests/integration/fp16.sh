#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# train.precision = "fp16" for real, on 2 ranks on Fashion-MNIST: the CPU backend computes fp16
# as the CUDA backend does (operands and results rounded to fp16, f32 accumulation), so with the
# initial loss scale of 2^16 some gradients overflow fp16 within the first steps. Each overflow
# must make every rank skip that step together and halve the scale (announced once), metrics
# and checkpoints record the scale and the skipped steps, and the run still learns; a resume
# continues with the saved scale.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_fmnist

cat >"$TMP/fp16.toml" <<EOF2
seed = 3
run_dir = "$TMP/run"
[model]
name = "ref_cnn"
[data]
train = "$DPTRAIN_DATA/fmnist/train.h5"
mean = [0.2860]
std = [0.3530]
workers = 1
[train]
epochs = 0
max_steps = 40
global_batch = 32
lr = 0.05
log_every_steps = 1
precision = "fp16"
[checkpoint]
every_steps = 20
every_epochs = 0
resume = "auto"
EOF2

CASE="fp16, 2 ranks, 40 steps from a loss scale of 65536"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$TMP/fp16.toml"
SKIPS=$(grep -c 'step skipped on every rank, scale' "$TMP/last.out")
check "  ... at least one fp16 overflow skipped on every rank (announced $SKIPS times)" \
  test "$SKIPS" -ge 1
check "  ... every announcement names a distinct step (printed once, by rank 0)" \
  test "$(grep -o 'non-finite gradients at step [0-9]*' "$TMP/last.out" | sort -u | wc -l)" = "$SKIPS"
check "  ... metrics: scale halved once per skip, skipped_steps counted, loss went down" \
  python3 - "$TMP/run/metrics.jsonl" "$SKIPS" <<'PY'
import json, sys
steps = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "step"]
skips = int(sys.argv[2])
last = steps[-1]
assert last["step"] == 40, last
assert last["skipped_steps"] == skips, (last, skips)
assert last["loss_scale"] == 65536 / 2 ** skips, (last, skips)
first = sum(j["loss"] for j in steps[:5]) / 5
final = sum(j["loss"] for j in steps[-5:]) / 5
assert final < first - 0.5, (first, final)
PY
if find_h5py_python; then
  check "  ... the step-20 checkpoint holds the scale of step 20" \
    "$PY" - "$TMP/run/checkpoints/ckpt-00000020.h5" "$TMP/run/metrics.jsonl" <<'PY'
import json, sys, h5py
by = {j["step"]: j for j in map(json.loads, open(sys.argv[2])) if j.get("kind") == "step"}
with h5py.File(sys.argv[1], "r") as f:
    st = f["state"].attrs
    assert st["loss_scale"] == by[20]["loss_scale"], (st["loss_scale"], by[20])
    assert st["skipped_steps"] == by[20]["skipped_steps"], (st["skipped_steps"], by[20])
PY
else
  skip "checkpoint contents: needs python3 with h5py"
fi

CASE="fp16: resume from step 40 for 10 more steps keeps the scale"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$TMP/fp16.toml" --set train.max_steps=50
check "  ... step 41 starts from the saved scale and skipped count" \
  python3 - "$TMP/run/metrics.jsonl" <<'PY'
import json, sys
steps = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "step"]
by = {}
for j in steps:
    by.setdefault(j["step"], j)
s40, s41 = by[40], by[41]
if s41["skipped_steps"] == s40["skipped_steps"]:  # step 41 did not overflow
    assert s41["loss_scale"] == s40["loss_scale"], (s40, s41)
assert max(j["step"] for j in steps) == 50
PY
finish
