#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# PyTorch at its best, for the benchmarks that measure it (bench/run.sh, bench/shard.sh); sourced,
# with $py (Debian's python3 with torch) set. bench/README.md says why each setting matters.
#   pt_env, pt_unset     what `env` gets for every PyTorch process
#   pytorch_best_setup   picks the faster OPENBLAS_* environment, prints the BLAS, and exits 1
#                        when Linear would run on the reference BLAS
#   pytorch_run MODEL RANKS THREADS BATCH PRECISION WARMUP STEPS   samples/s of one process
#                        (PyTorch's DDP over gloo for RANKS > 1); $pt_format, $run_id

# PyTorch at its best (bench/README.md says why each matters): OpenBLAS on one thread per
# process, and glibc malloc told to keep freed memory (else every step page-faults its buffers
# back in). dptrain runs with the defaults (these tunables do not change its throughput).
pt_env=(OPENBLAS_NUM_THREADS=1
  GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296)
py=${py:-/usr/bin/python3}
pt_format=${pt_format:-channels_last}
run_id=${run_id:-0}

pytorch_best_setup() {
  # OPENBLAS_* settings found in the environment (a CI image may force OPENBLAS_CORETYPE=Haswell
  # for old numpy builds: half the GEMM rate of the AVX-512 kernel) are kept only if GEMM is not
  # slower with them: the baseline is PyTorch at its best here.
  pt_unset=()
  for var in $(compgen -e | grep '^OPENBLAS_' | grep -v '^OPENBLAS_NUM_THREADS$' || true); do
    pt_unset+=(-u "$var")
  done
  blas=$(env "${pt_env[@]}" "$py" bench/pytorch_baseline.py --blas)
  gemm=$(awk '$1 == "gemm_gflops_1thread" {print $2}' <<<"$blas")
  if [ ${#pt_unset[@]} -gt 0 ]; then
    found=$(compgen -e | grep '^OPENBLAS_' | grep -v '^OPENBLAS_NUM_THREADS$' |
      while read -r var; do printf '%s=%s ' "$var" "${!var}"; done)
    blas_unset=$(env "${pt_unset[@]}" "${pt_env[@]}" "$py" bench/pytorch_baseline.py --blas)
    gemm_unset=$(awk '$1 == "gemm_gflops_1thread" {print $2}' <<<"$blas_unset")
    kernel() { awk '$1 == "blas_core" {print $2}' <<<"$1"; }
    echo "PyTorch's BLAS GEMM (torch.mm, 1024^3) on 1 thread: $gemm GFLOP/s with this environment's" \
      "${found% } (kernel $(kernel "$blas")), $gemm_unset GFLOP/s without (kernel" \
      "$(kernel "$blas_unset"))"
    if awk -v a="$gemm_unset" -v b="$gemm" 'BEGIN{exit !(a > b)}'; then
      echo "  so the baseline runs without them"
      blas=$blas_unset
    else
      echo "  so the baseline keeps them"
      pt_unset=()
    fi
  else
    echo "PyTorch's BLAS GEMM (torch.mm, 1024^3) on 1 thread: $gemm GFLOP/s"
  fi
  echo "PyTorch $("$py" -c 'import torch; print(torch.__version__)'): Linear runs on" \
    "$(sed -n 's/^blas //p' <<<"$blas")"
  echo "  (the convolutions run on oneDNN in both frameworks; dptrain links no BLAS)"
  multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
  alt=$(update-alternatives --query "libblas.so.3-$multiarch" 2>/dev/null | sed -n 's/^Value: //p')
  echo "  update-alternatives libblas.so.3-$multiarch -> ${alt:-(not managed)}"
  if grep -q '^blas reference' <<<"$blas"; then
    echo "bench: PyTorch would run Linear on the reference BLAS (about 15x slower than OpenBLAS):" \
      "the baseline would be handicapped. Run scripts/install-deps.sh --bench" \
      "(or update-alternatives --auto libblas.so.3-$multiarch)." >&2
    exit 1
  fi
}

pytorch_run() {  # model ranks threads batch precision warmup_steps steps
  run_id=$((run_id + 1))
  env "${pt_unset[@]}" "${pt_env[@]}" "$py" bench/pytorch_baseline.py --model "$1" --ranks "$2" \
    --threads "$3" --batch "$4" --precision "$5" --warmup "$6" --steps "$7" \
    --memory-format "$pt_format" --port $((29500 + run_id % 400)) |
    awk '{print $NF}'
}
