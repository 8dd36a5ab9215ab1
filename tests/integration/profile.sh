#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# train.profile: at the end of a run rank 0 prints time per op kind and the slowest (graph node,
# op) pairs, measured from the second step on, and writes them into metrics.jsonl as a "profile"
# record; as one process and on 2 ranks. Without it, neither appears.
# shellcheck disable=SC2034  # CASE is read by expect_ok (lib.sh)
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUN=(train --config "$DPTRAIN_SRC/configs/resnet8.toml" --set data.train=synthetic
  --set data.test= --set data.synthetic_samples=64 --set train.global_batch=16
  --set train.max_steps=4 --set checkpoint.every_epochs=0 --set checkpoint.resume=never)

# profile_record RUN_DIR: "<steps> <rows> <has conv1's conv2d_fwd, with its GFLOP/s>" from
# metrics.jsonl.
profile_record() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
rows = [j for j in map(json.loads, open(sys.argv[1])) if j.get("kind") == "profile"]
if not rows:
    print("none")
    sys.exit()
p = rows[-1]
conv1 = any(o["node"] == "conv1" and o["op"] == "conv2d_fwd" and o["ms_per_step"] > 0
            and o["gflop_per_s"] > 0 for o in p["ops"])
print(p["steps"], len(p["ops"]), conv1)
PY
}

for launch in one two; do
  if [[ $launch == one ]]; then L=(); else L=("${MPI2[@]}"); fi
  CASE="train.profile = true, $launch"
  expect_ok -- "${L[@]}" "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/$launch" --set train.profile=true
  check "$launch: the table says what it measured" \
    grep -q '^profile (rank 0, 3 steps after the first; every op synchronised' "$TMP/last.out"
  check "$launch: per op kind: conv2d_fwd, 9 calls a step (resnet8's 9 convolutions), its GFLOP/s" \
    grep -Eq '^  conv2d_fwd +9\.0 +[0-9.]+ +[0-9.]+% +[0-9.]+$' "$TMP/last.out"
  check "$launch: the slowest (node, op) pairs name graph nodes" \
    grep -Eq '^  layer[0-9.]+conv[12] +conv2d_' "$TMP/last.out"
  rec=$(profile_record "$TMP/$launch")
  echo "  metrics.jsonl profile record: $rec"
  check "$launch: metrics.jsonl holds the profile record (3 steps, conv1's forward in it)" \
    test "$(echo "$rec" | awk '{print $1, $3}')" = "3 True"
done
# docs/design.md: every record has at least kind, step, epoch and time_s; the profile one too.
check "every metrics.jsonl record has kind, step, epoch and time_s" python3 -c "
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(not recs or any({'kind', 'step', 'epoch', 'time_s'} - r.keys() for r in recs))" \
  "$TMP/one/metrics.jsonl"

CASE="without train.profile"
expect_ok -- "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/off"
check "no table" test "$(grep -c '^profile' "$TMP/last.out")" = 0
check "no profile record" test "$(profile_record "$TMP/off")" = none

finish
