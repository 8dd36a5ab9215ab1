#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The refactoring guard (issue 64: fusion and layout decisions moved into graph passes, the
# backend seam narrowed): a fixed set of deterministic CPU runs must give bitwise the same
# losses, gradient norms, checkpoints, evaluation and plans before and after a change that is
# meant to be a move. The runs, one thread per rank, synthetic data:
#   ref_cnn_np1, ref_cnn_np2   ref_cnn, 6 SGD steps, 1 and 2 ranks
#   resnet8_fp32, resnet8_bf16 resnet8 (batch norm, residual adds), 4 steps, fp32 and bf16
#   resnet8_resume             resnet8_fp32's run resumed from its step-4 checkpoint to step 6
#   resnet8_adamw_sharded      2 ranks, AdamW, dist.shard = "gradients"
#   onnx_resnet18              torchvision resnet18 through model.onnx, 2 steps (needs torch)
#   onnx_mobilenet_v3_small    the same in bf16: squeeze-excitation (a broadcast product, which
#                              the layout pass keeps NCHW), hard swish, 16-bit hand-offs
#   eval                       `dptrain eval` of resnet8_fp32's checkpoint
#   plan_*                     `dptrain plan --json` of ref_cnn, resnet8 (2 ranks, sharded) and
#                              the ONNX models
# Each run's digest is the sha256 of what it wrote: every step's loss and gradient norm and
# every eval record from metrics.jsonl (as written: full double precision), every tensor's crc32
# in every checkpoint (`dptrain inspect`), eval's result line, the plan's JSON.
#
# Compared with (the first that applies):
#   MOVE_CHECK_BEFORE=DIR  another build tree (the commit before the change): both run here and
#                          every run's details are diffed;
#   tests/golden/move/CLASS.tsv, the digests recorded on a CPU of this class (vendor, the
#                          vector ISA oneDNN picks and the L1d and L2 sizes it blocks by:
#                          kernels differ between them), committed;
#   neither: skipped, naming the class; MOVE_CHECK_RECORD=1 writes the file to commit.
# The ONNX rows are compared only when model.onnx is the recorded one (its sha256 is part of
# the row's name: another torch exports other bytes).
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export OMP_NUM_THREADS=1
PY=${DPTRAIN_TORCH_PYTHON:-/usr/bin/python3}
ORACLE=$DPTRAIN_SRC/tests/integration/onnx_oracle.py

# The CPU's class: vendor, then the widest vector ISA with the extensions oneDNN dispatches on.
cpu_class() {
  local flags vendor isa=sse41
  vendor=$(awk -F': ' '/^vendor_id/ {print $2; exit}' /proc/cpuinfo)
  flags=" $(awk -F': ' '/^flags/ {print $2; exit}' /proc/cpuinfo) "
  [[ $flags == *" avx2 "* ]] && isa=avx2
  [[ $flags == *" avx512f "* ]] && isa=avx512
  [[ $flags == *" avx512_bf16 "* ]] && isa=avx512bf16
  [[ $flags == *" amx_tile "* && $flags == *" amx_bf16 "* ]] && isa=amx
  # oneDNN sizes its blocks by the caches: the L1 data and L2 sizes are part of the class.
  local l1 l2
  l1=$(getconf LEVEL1_DCACHE_SIZE 2>/dev/null || echo 0)
  l2=$(getconf LEVEL2_CACHE_SIZE 2>/dev/null || echo 0)
  echo "${vendor:-unknown}-$isa-L1d_$((${l1:-0} / 1024))K-L2_$((${l2:-0} / 1024))K"
}
CLASS=$(cpu_class)
GOLDEN=$DPTRAIN_SRC/tests/golden/move/$CLASS.tsv

# digest_run DIR: the details of a training run (metrics.jsonl and every checkpoint's tensors).
digest_run() {
  python3 - "$1/metrics.jsonl" <<'PY' || echo "metrics.jsonl unreadable"
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    k = j.get("kind")
    if k == "step":
        print("step", j["step"], repr(j["loss"]), repr(j.get("grad_norm")), j.get("loss_scale"))
    elif k == "eval":
        print("eval", j.get("step"), repr(j.get("test_loss")), repr(j.get("test_accuracy")))
PY
  local c
  for c in "$1"/checkpoints/ckpt-*.h5; do
    [[ -f $c ]] || continue
    echo "checkpoint $(basename "$c")"
    # Tensor lines (name, type, shape, crc32); /state holds the wall-clock time, left out.
    "$BIN/dptrain" inspect "$c" 2>&1 | grep -E '^  [^ /].* crc32 [0-9a-f]{8} ' || echo "  unreadable"
  done
}

# run_all BIN OUT: every run with BIN/dptrain; details in OUT/NAME.txt.
run_all() {
  BIN=$1
  local out=$2 rc
  mkdir -p "$out"
  printf '[model]\nname = "ref_cnn"\n[data]\ntrain = "synthetic"\n' >"$out/base.toml"
  local base=(--config "$out/base.toml" --set seed=5 --set data.workers=0
    --set train.epochs=0 --set train.log_every_steps=1 --set checkpoint.every_epochs=0
    --set checkpoint.keep=100 --set checkpoint.resume=never)
  # one NAME RANKS ARGS...: a training run into $out/runs/NAME.
  one() {
    local name=$1 np=$2 launch=()
    shift 2
    ((np > 1)) && launch=("${MPI2[@]}")
    rc=0
    timeout -k 5 120 "${launch[@]}" "$BIN/dptrain" train "${base[@]}" \
      --set "run_dir=$out/runs/$name" "$@" >"$out/$name.log" 2>&1 </dev/null || rc=$?
    { echo "exit $rc"; digest_run "$out/runs/$name"; } >"$out/$name.txt"
  }
  local ref=(--set model.name=ref_cnn --set data.synthetic_samples=512 --set data.test=synthetic
    --set train.global_batch=32 --set train.max_steps=6 --set checkpoint.every_steps=3
    --set train.eval_every_epochs=0)
  one ref_cnn_np1 1 "${ref[@]}"
  one ref_cnn_np2 2 "${ref[@]}"
  local r8=(--set model.name=resnet8 --set data.synthetic_samples=256 --set train.global_batch=32
    --set train.max_steps=4 --set checkpoint.every_steps=4)
  one resnet8_fp32 1 "${r8[@]}"
  one resnet8_bf16 1 "${r8[@]}" --set train.precision=bf16
  one resnet8_adamw_sharded 2 "${r8[@]}" --set train.optimizer=adamw --set train.lr=0.001 \
    --set dist.shard=gradients
  # The resume: resnet8_fp32's run dir, on from step 4 to 6.
  cp -a "$out/runs/resnet8_fp32" "$out/runs/resnet8_resume"
  one resnet8_resume 1 "${r8[@]}" --set train.max_steps=6 --set checkpoint.every_steps=2 \
    --set checkpoint.resume=auto
  rc=0
  timeout -k 5 60 "$BIN/dptrain" eval "${base[@]}" "${r8[@]}" --set data.test=synthetic \
    --checkpoint "$out/runs/resnet8_fp32/checkpoints/ckpt-00000004.h5" >"$out/eval.log" 2>&1 ||
    rc=$?
  { echo "exit $rc"; grep -E 'test_loss|^  [0-9]+ ' "$out/eval.log" | sed -e 's/ ([0-9.]*s)$//' -e 's|^eval [^ ]*/|eval |'; } \
    >"$out/eval.txt"
  # plan NAME ARGS...: `dptrain plan --json`.
  plan() {
    local name=$1
    shift
    rc=0
    timeout -k 5 60 "$BIN/dptrain" plan "${base[@]}" --json "$@" >"$out/$name.log" 2>&1 || rc=$?
    { echo "exit $rc"; cat "$out/$name.log"; } >"$out/$name.txt"
  }
  plan plan_ref_cnn "${ref[@]}" --ranks 1
  plan plan_resnet8_sharded "${r8[@]}" --ranks 2 --set dist.shard=gradients \
    --set train.optimizer=adamw
  local m onnx
  for m in "${!ONNX[@]}"; do
    onnx=(--set "model.onnx=${ONNX[$m]}" --set model.classes=10 --set data.synthetic_samples=64
      --set train.global_batch=16 --set train.max_steps=2 --set checkpoint.every_steps=2)
    [[ $m == resnet18 ]] || onnx+=(--set train.precision=bf16)
    one "onnx_${m}_${ONNX_SHA[$m]}" 1 "${onnx[@]}"
    plan "plan_onnx_${m}_${ONNX_SHA[$m]}" "${onnx[@]}" --ranks 1
  done
}

# digests OUT: "NAME<TAB>sha256" per run, sorted.
digests() {
  local f
  for f in "$1"/*.txt; do
    printf '%s\t%s\n' "$(basename "$f" .txt)" "$(sha256sum <"$f" | cut -c1-32)"
  done | sort
}

declare -A ONNX=() ONNX_SHA=()  # torchvision model -> its model.onnx, and that file's sha256
if "$PY" -c 'import torch, torchvision, onnx' 2>/dev/null; then
  for m in resnet18 mobilenet_v3_small; do
    mkdir -p "$TMP/onnx/$m"
    if "$PY" "$ORACLE" model "$m" "$TMP/onnx/$m" >"$TMP/onnx/$m.log" 2>&1; then
      ONNX[$m]=$TMP/onnx/$m/model.onnx
      ONNX_SHA[$m]=$(sha256sum <"${ONNX[$m]}" | cut -c1-12)
    else
      fail "exporting torchvision $m to ONNX"
      tail -n 20 "$TMP/onnx/$m.log"
    fi
  done
else
  echo "note: no python3 with torch, torchvision and onnx: the ONNX rows are not run"
fi

echo "CPU class $CLASS ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1))"
t0=$SECONDS
run_all "$(dirname "$DPTRAIN")" "$TMP/after"
echo "the runs: $((SECONDS - t0)) s"
digests "$TMP/after" >"$TMP/after.tsv"
for f in "$TMP"/after/*.txt; do
  check "$(basename "$f" .txt): ran (exit 0)" grep -qx 'exit 0' "$f"
done

if [[ -n ${MOVE_CHECK_BEFORE:-} ]]; then
  run_all "$MOVE_CHECK_BEFORE/launcher" "$TMP/before"
  for f in "$TMP"/after/*.txt; do
    name=$(basename "$f" .txt)
    if cmp -s "$f" "$TMP/before/$name.txt"; then
      pass "$name: bitwise the same as $MOVE_CHECK_BEFORE"
    else
      fail "$name: differs from $MOVE_CHECK_BEFORE"
      diff "$TMP/before/$name.txt" "$f" | head -n 10 | sed 's/^/  /'
    fi
  done
elif [[ ${MOVE_CHECK_RECORD:-0} == 1 ]]; then
  echo "recording: nothing compared"
elif [[ -f $GOLDEN ]]; then
  while IFS=$'\t' read -r name want; do
    [[ $name == \#* || -z $name ]] && continue
    got=$(awk -F'\t' -v n="$name" '$1 == n {print $2}' "$TMP/after.tsv")
    if [[ -z $got ]]; then
      case $name in
        *onnx_*) echo "note: $name not comparable (no torch, or another model.onnx)" ;;
        *) fail "$name: recorded in $GOLDEN but not run" ;;
      esac
      continue
    fi
    check "$name: bitwise the same as recorded ($want)" test "$got" = "$want"
    [[ $got == "$want" ]] || sed 's/^/  | /' "$TMP/after/$name.txt" | head -n 8
  done <"$GOLDEN"
  while IFS=$'\t' read -r name _; do
    grep -q "^$name"$'\t' "$GOLDEN" ||
      echo "note: $name is not in $GOLDEN (new, or another model.onnx)"
  done <"$TMP/after.tsv"
else
  skip "no digests recorded for CPU class $CLASS: run with MOVE_CHECK_RECORD=1 on a commit known good and commit tests/golden/move/$CLASS.tsv"
fi

if [[ ${MOVE_CHECK_RECORD:-0} == 1 ]] && ((FAILED == 0)); then
  mkdir -p "$(dirname "$GOLDEN")"
  {
    echo "# move_check.sh digests on $CLASS ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), commit $(git -C "$DPTRAIN_SRC" rev-parse --short HEAD 2>/dev/null)"
    cat "$TMP/after.tsv"
  } >"$GOLDEN"
  echo "recorded $GOLDEN"
fi
finish
