#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The reference CNN on Fashion-MNIST with 2 ranks and configs/fmnist_cnn.toml's own settings
# (5 epochs, global batch 128, cosine schedule) reaches test accuracy >= 0.90 at the last eval.
# About 2 minutes on 2 CPU cores. Skipped (exit 77) without the converted data (make data).
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_fmnist

RUN=$TMP/run
start=$SECONDS
rc=0
timeout -k 10 800 "${MPI2[@]}" "$DPTRAIN" train --config "$DPTRAIN_SRC/configs/fmnist_cnn.toml" \
  --set "data.train=$DPTRAIN_DATA/fmnist/train.h5" --set "data.test=$DPTRAIN_DATA/fmnist/test.h5" \
  --set "run_dir=$RUN" --set checkpoint.every_epochs=0 \
  >"$TMP/train.out" 2>"$TMP/train.err" </dev/null || rc=$?
elapsed=$((SECONDS - start))
tail -n 4 "$TMP/train.out"
if [[ $rc == 0 ]]; then
  pass "2-rank training exits 0 (${elapsed}s)"
else
  fail "2-rank training exited $rc after ${elapsed}s$([[ $rc == 124 ]] && echo ' (timed out)')"
  tail -n 30 "$TMP/train.err"
fi

if summary=$(python3 - "$RUN/metrics.jsonl" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
evals = [j for j in lines if j.get("kind") == "eval"]
if not evals:
    sys.exit("no eval line in metrics.jsonl")
e = evals[-1]
print(e["test_accuracy"], e["epoch"], e["step"], f'{e["test_loss"]:.4f}')
EOF
); then
  read -r acc epoch step loss <<<"$summary"
  echo "fmnist: 2 ranks, last eval (epoch $epoch, step $step): test_accuracy $acc," \
    "test_loss $loss; training took ${elapsed}s"
  check "the last eval is after epoch 5 (got epoch $epoch)" test "$epoch" = 5
  check "test_accuracy $acc >= 0.90" python3 -c "import sys; sys.exit(0 if $acc >= 0.90 else 1)"
else
  fail "cannot read the last eval from $RUN/metrics.jsonl"
fi

finish
