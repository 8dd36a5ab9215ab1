#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Two dptrain builds against each other (not a test): the rows of bench/run.sh's dptrain side
# (model, ranks x threads, batch, precision), each measured BENCH_REPEAT times per build, the
# builds interleaved run by run so that both see the same machine; the best of each side and the
# ratio B / A per row. For a change meant to cost nothing (issue 64's moves: within 3% on every
# row). Exit 1 when a row's ratio is below AB_MIN (default 0.97).
#
#   bash bench/ab.sh A_BUILD B_BUILD       (build trees, or folders holding launcher/dptrain)
#   BENCH_REPEAT=N      runs per row and build (default 5)
#   BENCH_MODELS="..."  models (default: ref_cnn resnet8 resnet18_cifar)
#   AB_BATCHES="..."    batches (default: 64 256; resnet18_cifar 64 only)
#   AB_LAYOUTS="1x2 2x1"  ranks x threads (default both)
#   AB_PRECS="..."      precisions (default: fp32 bf16, the ResNets also fp32w)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# = 2 ] || { echo "usage: bash bench/ab.sh A_BUILD B_BUILD" >&2; exit 2; }
bin_a=$1/launcher/dptrain bin_b=$2/launcher/dptrain
for b in "$bin_a" "$bin_b"; do
  [ -x "$b" ] || { echo "bench: $b missing" >&2; exit 1; }
done
py=/usr/bin/python3
# shellcheck source=scripts/mpi-env.sh
. scripts/mpi-env.sh
fmnist=${DPTRAIN_DATA:-data}/fmnist/train.h5
[ -f "$fmnist" ] || { echo "bench: $fmnist missing (run make data)"; exit 1; }
work=$(mktemp -d /tmp/dptrain-ab.XXXXXX)
trap 'rm -rf "$work"' EXIT
scale=1
# shellcheck source=bench/dptrain_run.sh
. bench/dptrain_run.sh

repeat=${BENCH_REPEAT:-5}
read -r -a models <<<"${BENCH_MODELS:-ref_cnn resnet8 resnet18_cifar}"
read -r -a layouts <<<"${AB_LAYOUTS:-1x2 2x1}"
min=${AB_MIN:-0.97}
best() { printf '%s\n' "$@" | sort -n | tail -n 1; }

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -n1); A = $bin_a, B = $bin_b;" \
  "best of $repeat runs each, interleaved"
fmt='%-14s %-4s %5s %-5s %9s %9s %7s %s\n'
# shellcheck disable=SC2059
printf "$fmt" model ly batch prec A_best B_best B/A verdict
worst=""
failed=0
for model in "${models[@]}"; do
  read -r -a batches <<<"${AB_BATCHES:-64 256}"
  [ "$model" = resnet18_cifar ] && batches=(64)
  for batch in "${batches[@]}"; do
    set_steps "$model" "$batch"
    for layout in "${layouts[@]}"; do
      ranks=${layout%x*} threads=${layout#*x}
      precs=(fp32 bf16)
      [ "$model" != ref_cnn ] && precs=(fp32 fp32w bf16)
      [ -n "${AB_PRECS:-}" ] && read -r -a precs <<<"$AB_PRECS"
      for prec in "${precs[@]}"; do
        a=() b=()
        for ((r = 0; r < repeat; r++)); do
          dptrain=$bin_a
          a+=("$(dptrain_run "$model" "$ranks" "$threads" "$batch" "$prec" "$warm" "$steps")")
          dptrain=$bin_b
          b+=("$(dptrain_run "$model" "$ranks" "$threads" "$batch" "$prec" "$warm" "$steps")")
        done
        ba=$(best "${a[@]}") bb=$(best "${b[@]}")
        ratio=$(awk -v x="$bb" -v y="$ba" 'BEGIN { printf "%.3f", x / y }')
        v=ok
        if awk -v r="$ratio" -v m="$min" 'BEGIN { exit !(r < m) }'; then
          v="BELOW $min"
          failed=1
        fi
        # shellcheck disable=SC2059
        printf "$fmt" "$model" "$layout" "$batch" "$prec" "$ba" "$bb" "$ratio" "$v"
        if [ -z "$worst" ] || awk -v r="$ratio" -v w="$worst" 'BEGIN { exit !(r < w) }'; then
          worst=$ratio
        fi
      done
    done
  done
done
echo "worst B/A: $worst (every row >= $min: $([ $failed = 0 ] && echo yes || echo no))"
exit $failed
