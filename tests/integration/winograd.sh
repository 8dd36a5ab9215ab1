#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# train.winograd: resnet8 trained with its 32- and 64-channel 3x3 convolutions by Winograd on the
# CPU says so on the start line, stays within fp32 rounding of the direct run, gives the same bits
# twice (deterministic for a thread count), and runs on 2 ranks. Where it cannot act (no AVX-512,
# simulated with DNNL_MAX_CPU_ISA=AVX2; not fp32) it warns and the run is the direct one; so
# where its buffers do not fit in memory.limit (and `dptrain plan` says so). The
# op-level accuracy is conformance's ConvWinogradTest; the speed is bench/run.sh's fp32w rows.
# shellcheck disable=SC2034  # CASE is read by expect_ok (lib.sh)
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

RUN=(train --config "$DPTRAIN_SRC/configs/resnet8.toml" --set data.train=synthetic
  --set data.test= --set data.synthetic_samples=64 --set train.global_batch=16
  --set train.max_steps=4 --set train.log_every_steps=1 --set dist.threads=2
  --set checkpoint.every_epochs=0 --set checkpoint.resume=never)

# losses RUN_DIR: the step losses and gradient norms of metrics.jsonl, one line, full precision
# (the loss, a float32 mean, can round to the same value for both algorithms; the norm shows
# the difference).
losses() {
  python3 - "$1/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "step"]
print(" ".join(f'{r["loss"]!r} {r["grad_norm"]!r}' for r in rows))
PY
}

CASE="direct (train.winograd = false)"
expect_ok -- "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/direct"
check "the start line does not say winograd" bash -c "! grep -q ', winograd$' '$TMP/last.out'"
direct=$(losses "$TMP/direct")
# within1e4 A B: the two lists of numbers agree to 1e-4 relative, 8 numbers each.
within1e4() {
  python3 -c "import sys; a, b = (list(map(float, s.split())) for s in sys.argv[1:3]); \
sys.exit(not (len(a) == len(b) == 8 and all(abs(x - y) <= 1e-4 * abs(y) for x, y in zip(a, b))))" \
    "$1" "$2"
}

# oneDNN's Winograd kernels need AVX-512.
if grep -qw avx512f /proc/cpuinfo; then
  CASE="train.winograd = true"
  expect_ok -- "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/wino" --set train.winograd=true
  check "the start line ends in ', winograd'" grep -q '^dptrain: .*steps, winograd$' "$TMP/last.out"
  check "no warning" bash -c "! grep -q 'train.winograd' '$TMP/last.err'"
  CASE="train.winograd = true, again"
  expect_ok -- "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/wino2" --set train.winograd=true
  wino=$(losses "$TMP/wino") wino2=$(losses "$TMP/wino2")
  echo "  losses: direct $direct"
  echo "          winograd $wino"
  check "4 steps logged" test "$(wc -w <<<"$wino")" = 8
  check "the same bits twice (deterministic for a thread count)" test "$wino" = "$wino2"
  check "losses and gradient norms within fp32 rounding of the direct run (relative 1e-4)" \
    within1e4 "$wino" "$direct"
  check "not the direct run's bits (the Winograd kernels ran)" test "$wino" != "$direct"
  # memory.limit half way between the two runs' measured peaks: the direct convolutions fit,
  # Winograd's buffers do not. They give way before anything else: the same micro-batch, the
  # direct run's bits, warned.
  peak() {
    python3 -c "import json, sys; print(int(max(r['peak_mem_bytes']['max'] for r in \
map(json.loads, open(sys.argv[1])) if r.get('kind') == 'step')))" "$1/metrics.jsonl"
  }
  p_direct=$(peak "$TMP/direct") p_wino=$(peak "$TMP/wino")
  limit=$(((p_direct + p_wino) / 2))
  echo "  peak memory: direct $p_direct, winograd $p_wino bytes; limit $limit"
  check "Winograd's buffers take memory (at least 1 MiB more at the peak)" \
    test "$p_wino" -gt $((p_direct + 1048576))
  CASE="train.winograd = true under memory.limit = ${limit}B (the direct run fits, Winograd not)"
  expect_ok -- "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/wino_lim" --set train.winograd=true \
    --set "memory.limit=${limit}B"
  check "warned: its buffers do not fit, at the configured micro-batch 16" grep -q \
    '^dptrain: warning: train.winograd changes nothing: its buffers do not fit in memory.limit (.*) at micro-batch 16; convolutions run direct$' \
    "$TMP/last.err"
  check "the start line does not say winograd, nor a smaller micro-batch" \
    bash -c "! grep -q ', winograd$\|micro-steps' '$TMP/last.out'"
  check "the direct run's bits" test "$(losses "$TMP/wino_lim")" = "$direct"

  # Mid-run (memory.auto_microbatch; the test hook throws on rank 0 before step 3's first
  # micro-step): the same order, Winograd first, the micro-batch kept.
  CASE="train.winograd = true, out of memory on rank 0 at step 3, memory.auto_microbatch = true"
  expect_ok -- env DPTRAIN_TEST_OOM=0:2 "$DPTRAIN_HOOKED" "${RUN[@]}" \
    --set "run_dir=$TMP/wino_midrun" --set train.winograd=true --set memory.auto_microbatch=true
  check "warned once: Winograd gives way at micro-batch 16, step 3" test "$(grep -c \
    '^dptrain: warning: train.winograd gives way: micro-batch 16 ran out of memory on rank 0 at step 3; convolutions run direct from here (same micro-batch, the step runs again)$' \
    "$TMP/last.err")" = 1
  check "the micro-batch is kept" bash -c "! grep -q 'memory.auto_microbatch:' '$TMP/last.out'"
  mid=$(losses "$TMP/wino_midrun")
  check "steps 1 and 2 are the Winograd run's bits" \
    test "$(cut -d' ' -f1-4 <<<"$mid")" = "$(cut -d' ' -f1-4 <<<"$wino")"
  check "all 4 steps within fp32 rounding of the direct run" within1e4 "$mid" "$direct"

  CASE="train.winograd = true under a limit not even the direct run fits (memory.limit=12MiB)"
  expect_fail 4 "hint: micro-batch 16 per rank does not fit even with train.winograd given up (convolutions direct); micro-batch" -- \
    "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/wino_oom" --set train.winograd=true \
    --set memory.limit=12MiB
  # A model with no convolution Winograd applies to (cifar_net: 3 -> 64 channels) has nothing to
  # give up: the usual report at once.
  CASE="train.winograd = true, cifar_net (no Winograd convolution), memory.limit=1MiB"
  expect_fail 4 "hint: micro-batch 16 per rank does not fit," -- \
    "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/cifar_oom" --set train.winograd=true \
    --set model.name=cifar_net --set memory.limit=1MiB
  check "nothing said about Winograd" bash -c "! grep -q -i 'winograd' '$TMP/last.err'"

  # dptrain plan counts them and says the same, by its own estimate: a limit half way between
  # its totals with and without them.
  PLAN=(plan --config "$DPTRAIN_SRC/configs/resnet8.toml" --set train.global_batch=16 --ranks 1)
  total() {
    "$DPTRAIN" "${PLAN[@]}" --json "$@" |
      python3 -c "import json, sys; print(json.load(sys.stdin)['total_bytes'])"
  }
  t_direct=$(total) t_wino=$(total --set train.winograd=true)
  CASE="dptrain plan --json with train.winograd = true"
  expect_ok -- "$DPTRAIN" "${PLAN[@]}" --json --set train.winograd=true
  check "winograd_direct_total_bytes is the direct plan's total" test "$(python3 -c \
    "import json, sys; print(json.load(open(sys.argv[1]))['winograd_direct_total_bytes'])" \
    "$TMP/last.out")" = "$t_direct"
  CASE="dptrain plan with train.winograd = true"
  expect_ok -- "$DPTRAIN" "${PLAN[@]}" --set train.winograd=true
  check "it prints what Winograd's buffers take" grep -q \
    "^train.winograd: its buffers take $(((t_wino - t_direct) >> 20)) MiB of the total (direct convolutions: $((t_direct >> 20)) MiB)$" \
    "$TMP/last.out"
  CASE="dptrain plan with train.winograd = true under a limit only the direct plan fits"
  expect_ok -- "$DPTRAIN" "${PLAN[@]}" --set train.winograd=true \
    --set "memory.limit=$(((t_direct + t_wino) / 2))B"
  check "it says training gives them up" grep -q \
    '; they do not fit, so training gives them up and runs direct$' "$TMP/last.out"
  check "and nothing else" bash -c "! grep -q 'does NOT fit' '$TMP/last.out'"
  check "its budget line gives the largest micro-batch both ways" grep -q \
    "^budget .*: the largest micro-batch that fits is [0-9]* with train.winograd's buffers, [0-9]* with direct convolutions (training gives Winograd up first)$" \
    "$TMP/last.out"
  max_mb() {  # key, then plan arguments
    local key=$1
    shift
    "$DPTRAIN" "${PLAN[@]}" --json --set "memory.limit=$(((t_direct + t_wino) / 2))B" "$@" |
      python3 -c "import json, sys; print(json.load(sys.stdin)[sys.argv[1]])" "$key"
  }
  CASE="dptrain plan --json with train.winograd = true under that limit"
  check "winograd_direct_max_micro_batch is the direct plan's max_micro_batch" test \
    "$(max_mb winograd_direct_max_micro_batch --set train.winograd=true)" = "$(max_mb max_micro_batch)"
  check "which is more than Winograd's own" test \
    "$(max_mb winograd_direct_max_micro_batch --set train.winograd=true)" -gt \
    "$(max_mb max_micro_batch --set train.winograd=true)"

  CASE="train.winograd = true, 2 ranks"
  expect_ok -- "${MPI2[@]}" "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/wino_mpi" \
    --set train.winograd=true --set dist.threads=1
  check "2 ranks: the start line ends in ', winograd'" \
    grep -q '^dptrain: 2 ranks .*steps, winograd$' "$TMP/last.out"
else
  skip "no AVX-512: oneDNN has no Winograd kernel on this CPU (the warning below is tested)"
fi

# Where it cannot act it says so, once, and the run is the direct one. DNNL_MAX_CPU_ISA=AVX2
# caps oneDNN as a CPU without AVX-512 would.
CASE="train.winograd = true on a CPU without AVX-512 (DNNL_MAX_CPU_ISA=AVX2)"
expect_ok -- env DNNL_MAX_CPU_ISA=AVX2 "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/avx2w" \
  --set train.winograd=true
check "warned: no Winograd kernel for this CPU" grep -q \
  '^dptrain: warning: train.winograd changes nothing: oneDNN has no Winograd kernel for this CPU (it needs AVX-512); convolutions run direct$' \
  "$TMP/last.err"
check "the start line does not say winograd" bash -c "! grep -q ', winograd$' '$TMP/last.out'"
CASE="direct on the same capped CPU"
expect_ok -- env DNNL_MAX_CPU_ISA=AVX2 "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/avx2d"
check "the direct run's bits" test "$(losses "$TMP/avx2w")" = "$(losses "$TMP/avx2d")"
CASE="train.winograd = true with fp16"
expect_ok -- "$DPTRAIN" "${RUN[@]}" --set "run_dir=$TMP/fp16w" --set train.winograd=true \
  --set train.precision=fp16
check "warned: fp32 only" grep -q \
  '^dptrain: warning: train.winograd changes nothing: it applies to fp32 convolutions only, and train.precision is fp16; convolutions run direct$' \
  "$TMP/last.err"
finish
