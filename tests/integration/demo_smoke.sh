#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make demo`'s command line (mpirun -np 2 dptrain train --config configs/fmnist_cnn.toml, from
# the source tree, after sourcing scripts/mpi-env.sh) cut to 20 steps: exits 0, rank 0 prints the
# rank table, and metrics.jsonl has step lines with the documented keys.
# Skipped (exit 77) without the converted data (make data).
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_fmnist

cd "$DPTRAIN_SRC" || exit 1
extra=()
# The config names data/fmnist/*.h5 relative to the source tree; follow DPTRAIN_DATA elsewhere.
if [[ $(realpath "$DPTRAIN_DATA") != $(realpath "$DPTRAIN_SRC/data") ]]; then
  extra=(--set "data.train=$DPTRAIN_DATA/fmnist/train.h5"
    --set "data.test=$DPTRAIN_DATA/fmnist/test.h5")
fi
RUN=$TMP/run
start=$SECONDS
rc=0
timeout -k 10 300 "$MPIEXEC" -np 2 "$DPTRAIN" train --config configs/fmnist_cnn.toml \
  --set train.max_steps=20 --set "run_dir=$RUN" "${extra[@]}" \
  >"$TMP/demo.out" 2>"$TMP/demo.err" </dev/null || rc=$?
elapsed=$((SECONDS - start))
cat "$TMP/demo.out"
if [[ $rc == 0 ]]; then
  pass "the demo command exits 0 (${elapsed}s)"
else
  fail "the demo command exited $rc after ${elapsed}s"
  tail -n 30 "$TMP/demo.err"
fi

check "stderr reports no error" bash -c "! grep -qi error '$TMP/demo.err'"
check "rank 0 prints the rank table header" \
  grep -qE '^rank +host +local +device +threads$' "$TMP/demo.out"
check "the table has one row per rank (0/2 and 1/2)" \
  bash -c "grep -qE '^0 +[^ ]+ +0/2 +' '$TMP/demo.out' && grep -qE '^1 +[^ ]+ +1/2 +' '$TMP/demo.out'"
check "the table is printed once" test "$(grep -cE '^rank +host' "$TMP/demo.out")" = 1
check "the run stops after 20 steps" grep -q 'done: 20 steps' "$TMP/demo.out"
check "config.toml written" test -s "$RUN/config.toml"
# cuBLAS is loaded when a CUDA backend starts (core/cuda/cublas_loader.h): linked, libcublasLt's
# initialisers would cost every process ~0.4 s, CPU runs included.
check "the binary does not link cuBLAS" bash -c "! ldd '$DPTRAIN' | grep -q libcublas"
check "metrics.jsonl has step lines with kind, step, epoch, time_s, loss, lr, samples_per_s" \
  python3 - "$RUN/metrics.jsonl" <<'EOF'
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [j for j in lines if j.get("kind") == "step"]
assert steps, "no step line"
for j in steps:
    missing = {"kind", "step", "epoch", "time_s", "loss", "lr", "samples_per_s"} - j.keys()
    assert not missing, f"step line {j} lacks {sorted(missing)}"
    assert math.isfinite(j["loss"]) and j["lr"] > 0 and j["samples_per_s"] > 0, j
assert steps[-1]["step"] == 20, f"last step line is step {steps[-1]['step']}, expected 20"
print(f"{len(steps)} step lines; last: {steps[-1]}")
EOF
check "every metrics line has kind, step, epoch and time_s; a checkpoint line's step is its file's" \
  python3 - "$RUN/metrics.jsonl" <<'EOF'
import json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
for j in lines:
    missing = {"kind", "step", "epoch", "time_s"} - j.keys()
    assert not missing, f"{j['kind']} line {j} lacks {sorted(missing)}"
ckpts = [j for j in lines if j["kind"] == "checkpoint"]
assert ckpts, "no checkpoint line"
for j in ckpts:
    assert int(re.search(r"ckpt-(\d+)\.h5$", j["path"]).group(1)) == j["step"], j
print(f"{len(lines)} lines ({sorted({j['kind'] for j in lines})}); checkpoints: {ckpts}")
EOF

finish
