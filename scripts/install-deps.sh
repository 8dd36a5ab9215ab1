#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The one list of system packages dptrain needs (Debian 12 / Ubuntu 22.04+). Used by the Makefile,
# .ci/run and the Dockerfile. Idempotent: installs only what is missing, silent when nothing is.
#
#   scripts/install-deps.sh            build + test dependencies
#   scripts/install-deps.sh --runtime  only what the dptrain binary needs at run time
#   scripts/install-deps.sh --bench    also the PyTorch baseline used by bench/
set -euo pipefail

runtime=(openmpi-bin libopenmpi3 libhdf5-103-1 libdnnl2 libfmt9 zlib1g)
build=(build-essential cmake ninja-build pkg-config git ca-certificates
  openmpi-bin libopenmpi-dev libhdf5-dev libdnnl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  clang-format python3 python3-h5py python3-numpy dataset-fashion-mnist)
bench=(python3-torch)

want=()
case "${1:-}" in
  --runtime) want=("${runtime[@]}") ;;
  --bench) want=("${build[@]}" "${bench[@]}") ;;
  "") want=("${build[@]}") ;;
  *) echo "usage: $0 [--runtime|--bench]" >&2; exit 2 ;;
esac

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt/dpkg (unattended-upgrades, a parallel job) instead of failing on its lock.
apt_opts=(-o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)
echo "install-deps: installing ${missing[*]}"
$sudo apt-get "${apt_opts[@]}" update -qq
$sudo apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
