#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The loader alone against PyTorch doing the same job (bench/README.md, "The loader alone"):
# build/bench/loader_bench and bench/pytorch_loader_baseline.py on one thread each, $BENCH_REPEAT
# processes each (5), alternating; prints every run, each side's best and median, and the ratio
# of the bests. PyTorch runs at its best (bench/pytorch_env.sh: OpenBLAS on one thread, malloc
# keeping its memory).
#   bash bench/loader.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
repeat=${BENCH_REPEAT:-5}
# shellcheck source=pytorch_env.sh
. bench/pytorch_env.sh
pytorch_best_setup
declare -A dpt pt
for ((i = 0; i < repeat; i++)); do
  while read -r job rate; do dpt[$job]+="$rate "; done < <(
    "$build/bench/loader_bench" --threads 1 --seconds 3 |
      awk '/random-resized-crop/ {print "random-resized-crop", $(NF-3)} /centre crop/ {print "centre-crop", $(NF-3)}')
  while read -r job _ rate; do pt[$job]+="$rate "; done < <(
    env "${pt_unset[@]}" "${pt_env[@]}" "$py" bench/pytorch_loader_baseline.py --seconds 3)
done
stats() { tr ' ' '\n' <<<"$1" | grep . | sort -n | awk '{v[NR] = $1} END {printf "%d %d", v[NR], v[int((NR + 1) / 2)]}'; }
echo "loader alone, 1 thread, samples/s (best / median of $repeat processes each):"
for job in random-resized-crop centre-crop; do
  read -r db dm <<<"$(stats "${dpt[$job]}")"
  read -r pb pm <<<"$(stats "${pt[$job]}")"
  echo "  $job: dptrain ${dpt[$job]}| PyTorch ${pt[$job]}"
  awk -v j="$job" -v db="$db" -v dm="$dm" -v pb="$pb" -v pm="$pm" \
    'BEGIN { printf "  %-20s dptrain %6d (median %6d)  PyTorch %6d (median %6d)  ratio %.2fx\n", j, db, dm, pb, pm, db / pb }'
done
