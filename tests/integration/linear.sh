#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The first data-parallel example end to end: configs/linear.toml (Linear(10 -> 1) on synthetic
# regression data) recovers its teacher (final eval test_loss < 1e-4) as one process and as
# 2 ranks, and writes the resolved config.toml and metrics.jsonl to run_dir. `dptrain eval` of
# the final checkpoint scores it as the run's own final evaluation did (the regression targets
# of generated data come from the teacher there too, not from the all-zero labels).
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# check_run RUN_DIR LABEL: the run's outputs and its final eval.
check_run() {
  local dir=$1 label=$2 loss
  check "$label: config.toml written" test -s "$dir/config.toml"
  check "$label: config.toml is the resolved config (model.name = \"linear\")" \
    grep -q '^name = "linear"' "$dir/config.toml"
  check "$label: metrics.jsonl written" test -s "$dir/metrics.jsonl"
  if loss=$(python3 - "$dir/metrics.jsonl" <<'EOF'
import json, sys
evals = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "eval"]
if not evals:
    sys.exit("no eval line in metrics.jsonl")
print(evals[-1]["test_loss"])
EOF
  ); then
    echo "$label: final eval test_loss $loss"
    check "$label: final eval test_loss $loss < 1e-4" \
      python3 -c "import sys; sys.exit(0 if float('$loss') < 1e-4 else 1)"
  else
    fail "$label: cannot read the final eval from $dir/metrics.jsonl"
  fi
}

CASE="linear.toml, 1 process"
expect_ok -- "$DPTRAIN" train --config "$DPTRAIN_SRC/configs/linear.toml" --set "run_dir=$TMP/run1"
check_run "$TMP/run1" "1 process"

CASE="linear.toml, 2 ranks"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$DPTRAIN_SRC/configs/linear.toml" \
  --set "run_dir=$TMP/run2"
check_run "$TMP/run2" "2 ranks"

CASE="dptrain eval of the 2-rank run's final checkpoint"
ckpt=$(ls "$TMP"/run2/checkpoints/ckpt-*.h5 | tail -n 1)
expect_ok -- "${MPI2[@]}" "$DPTRAIN" eval --config "$DPTRAIN_SRC/configs/linear.toml" \
  --set "run_dir=$TMP/run2" --checkpoint "$ckpt"
eval_loss=$(sed -n 's/^eval .*test_loss \([0-9.eE+-]*\) over.*/\1/p' "$TMP/last.out")
train_loss=$(python3 -c "import json,sys; print([j for j in map(json.loads, open(sys.argv[1])) if j.get('kind') == 'eval'][-1]['test_loss'])" "$TMP/run2/metrics.jsonl")
echo "eval test_loss $eval_loss, training's final eval $train_loss"
check "eval test_loss $eval_loss matches the training run's final eval $train_loss" \
  python3 -c "import sys; a, b = float('$eval_loss'), float('$train_loss'); sys.exit(0 if abs(a - b) <= 1e-6 + 1e-4 * b else 1)"

finish
