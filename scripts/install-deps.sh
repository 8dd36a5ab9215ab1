#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The one list of system packages dptrain needs (Debian 12 / Ubuntu 22.04+). Used by the Makefile,
# .ci/run and the Dockerfile. Idempotent: installs only what is missing, silent when nothing is.
#
#   scripts/install-deps.sh                  build + test dependencies (what `make test` compiles)
#   scripts/install-deps.sh --build          only what compiling dptrain needs (tests and
#                                            benchmarks off: the Dockerfile's build stage)
#   scripts/install-deps.sh --runtime        only what the dptrain binary needs at run time
#   scripts/install-deps.sh --ccache         ccache (with --build: the Dockerfile's build stage, whose
#                                            compiler cache is a BuildKit cache mount)
#   scripts/install-deps.sh --report         rsvg-convert, for `dptrain report --format png` (PNG
#                                            charts; the HTML page needs nothing)
#   scripts/install-deps.sh --bench          also the PyTorch baseline used by bench/, with
#                                            OpenBLAS as the system BLAS (see bench/README.md)
#   scripts/install-deps.sh --cluster-tests  also what the cluster tests run: a real Slurm
#                                            (slurmctld, slurmd, munge), a Docker engine,
#                                            debootstrap for its base image, network namespaces
# Several groups may be given at once (`--runtime --cluster-tests`).
#
# An entry "a|b" is the first of those names the package index knows: runtime libraries are
# renamed between releases (Debian 12 libopenmpi3, Ubuntu 24.04 libopenmpi3t64).
set -euo pipefail

# The shared libraries the dptrain binary links (`ldd`; the Dockerfile checks none is missing),
# and libvips, which `convert --from imagefolder` loads with dlopen (`dptrain info` shows it).
runtime=(openmpi-bin "libopenmpi3t64|libopenmpi3" "libhdf5-103-1t64|libhdf5-103-1"
  "libdnnl3|libdnnl2" "libfmt10|libfmt9" "libtomlplusplus3t64|libtomlplusplus3"
  "libonnx1t64|libonnx1" "libprotobuf32t64|libprotobuf32" zlib1g libgomp1 libstdc++6
  "libturbojpeg0|libturbojpeg" "libpng16-16t64|libpng16-16" "libvips42t64|libvips42"
  ca-certificates)
build=(build-essential cmake ninja-build pkg-config git ca-certificates
  openmpi-bin libopenmpi-dev libhdf5-dev libdnnl-dev zlib1g-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libfmt-dev libonnx-dev
  libprotobuf-dev libturbojpeg0-dev libpng-dev libvips-dev)
# chromium: tests/integration/report.sh opens `dptrain report`'s page in headless Chromium.
# python3-torch/-torchvision/-onnx: the PyTorch oracle (ONNX import parity, checkpoint interop).
# libopenblas0-pthread: that oracle's float64 step runs its convolutions on the system BLAS; on
# the reference BLAS a fresh machine has, resnet50's alone took 2m16s (38 s on OpenBLAS) and
# tests/integration/onnx_import.sh ran past its 300 s limit.
# python3-pil: the PIL oracle of convert --from imagefolder (tests/integration/imagefolder_*).
# ccache: the five builds of `make test`/sanitize/lint/fuzz and CI share compiled objects
# (cmake/Ccache.cmake); not in --build, so the Dockerfile's one-off build does without it.
tests=(ccache libgtest-dev libgmock-dev libbenchmark-dev
  clang-format python3 python3-h5py python3-numpy dataset-fashion-mnist
  python3-torch python3-torchvision python3-onnx libopenblas0-pthread python3-pil
  clang libclang-rt-dev libomp-dev clang-tidy cppcheck chromium)
report=(librsvg2-bin)
# Debian's torch runs Linear on the system BLAS: without OpenBLAS that is the reference BLAS,
# about 15x slower, and the baseline would be handicapped (bench/run.sh refuses to run on it).
bench=(python3-torch python3-torchvision libopenblas0-pthread)
# tests/integration/{slurm,two_hosts,docker}.sh (iproute2: ip netns; util-linux: unshare;
# procps: ps/pgrep; zstd: the cached base image).
cluster_tests=(slurmctld slurmd slurm-client munge docker.io debootstrap
  iproute2 util-linux procps zstd)

want=()
bench_blas=0
[ $# -eq 0 ] && set -- --default
for arg in "$@"; do
  [ "$arg" = --bench ] && bench_blas=1
  case "$arg" in
    --default) want+=("${build[@]}" "${tests[@]}" "${report[@]}") ;;
    --report) want+=("${report[@]}") ;;
    --ccache) want+=(ccache) ;;
    --build) want+=("${build[@]}") ;;
    --runtime) want+=("${runtime[@]}") ;;
    --bench) want+=("${build[@]}" "${tests[@]}" "${bench[@]}") ;;
    --cluster-tests) want+=("${cluster_tests[@]}") ;;
    *) echo "usage: $0 [--build|--runtime|--report|--ccache|--bench|--cluster-tests]..." >&2; exit 2 ;;
  esac
done

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
known() {
  local c
  c=$(apt-cache policy "$1" 2>/dev/null | sed -n 's/^ *Candidate: *//p')
  [ -n "$c" ] && [ "$c" != "(none)" ]
}

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt/dpkg (unattended-upgrades, a parallel job) instead of failing on its lock.
apt_opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
updated=0
update() {
  [ $updated = 1 ] && return 0
  $sudo apt-get "${apt_opts[@]}" update -qq
  updated=1
}

missing=()
for entry in "${want[@]}"; do
  IFS='|' read -r -a alts <<<"$entry"
  pick=""
  for p in "${alts[@]}"; do
    if installed "$p"; then pick=installed; break; fi
  done
  [ "$pick" = installed ] && continue
  if [ ${#alts[@]} -gt 1 ]; then
    # Alternatives: ask the package index (after one update) which name this release has.
    update
    for p in "${alts[@]}"; do
      if known "$p"; then pick=$p; break; fi
    done
    [ -n "$pick" ] || { echo "install-deps: none of ${alts[*]} is in the package index" >&2; exit 1; }
  else
    pick=${alts[0]}
  fi
  case " ${missing[*]-} " in *" $pick "*) ;; *) missing+=("$pick") ;; esac
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  update
  $sudo apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# OpenBLAS installed is not OpenBLAS used: libblas.so.3 is an alternative that an administrator may
# have pinned to another BLAS. Say so (bench/run.sh also checks what torch really loads).
if [ $bench_blas = 1 ]; then
  multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
  blas=$(update-alternatives --query "libblas.so.3-$multiarch" 2>/dev/null | sed -n 's/^Value: //p')
  case "$blas" in
    *openblas*) ;;
    *) echo "install-deps: libblas.so.3 is ${blas:-unset}, not OpenBLAS; PyTorch's Linear will" \
      "be slow. Fix: ${sudo:+$sudo }update-alternatives --auto libblas.so.3-$multiarch" >&2 ;;
  esac
fi
