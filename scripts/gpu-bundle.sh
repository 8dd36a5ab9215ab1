#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs what scripts/gpu-check.sh runs on a GPU machine into one file, built here: nothing
# compiles there, and the GPU machines lent to this project have no Open MPI, oneDNN, HDF5 or
# dataset of their own and no network. Their image has CUDA, cuDNN, cuBLAS and NCCL (PyTorch's),
# which the bundle leaves out and gpu-check.sh finds there.
#
#   bash scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, .gpu-bundle)
#   bash scripts/gpu-bundle.sh --list [BUILD_DIR]        the files it would pack; no archive
#
# OUT_DIR/dptrain-gpu.tar.xz holds:
#   bin/      dptrain, dptrain_hooked, the GPU test binaries and device_step_bench (stripped)
#   lib/      every shared library they and Open MPI load, except the C library and the GPU
#             libraries the machine brings (libcuda, cuDNN, cuBLAS, NCCL); gpu-check.sh puts it
#             first on LD_LIBRARY_PATH for everything but python3
#   ompi/     Open MPI's launcher, plugins and help texts, relocated (OPAL_PREFIX)
#   pmix/     PMIx's plugins and help texts (PMIX_PREFIX)
#   data/     Fashion-MNIST, converted (data/fmnist/*.h5; left out, with a note, when absent)
#   MANIFEST  the commit, the build's configuration, the date and the file list
# The device tool carries at most 64 MiB with the working tree; the archive is about 55 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
list_only=0
if [[ ${1:-} == --list ]]; then
  list_only=1
  shift
fi
build=${1:-build}
out=${2:-.gpu-bundle}

die() {
  echo "gpu-bundle: $*" >&2
  exit 1
}

bins=(launcher/dptrain tests/dptrain_hooked tests/conformance_tests tests/cuda/cuda_tests
  tests/cuda/cuda_mpi_nccl tests/cuda/cuda_mpi_equivalence bench/device_step_bench)
for b in "${bins[@]}"; do
  [[ -x $build/$b ]] || die "$build/$b is missing: build with the CUDA backend first (make build)"
done
# The CUDA backend must be in the binary: its kernels' fat binary section says so.
readelf -S -W "$build/launcher/dptrain" | grep -q '\.nv_fatbin' ||
  die "$build/launcher/dptrain has no CUDA kernels: configure with -DDPTRAIN_WITH_CUDA=ON"

ompi_lib=$(dirname "$(ldd "$build/launcher/dptrain" | awk '/libmpi\.so/ {print $3}')")
[[ -n $ompi_lib && -d $ompi_lib ]] || die "cannot find the libmpi that dptrain links"
orterun=$(command -v orterun || true)
[[ -n $orterun ]] || die "Open MPI's orterun is not installed (scripts/install-deps.sh --build)"
plugins=$ompi_lib/openmpi/lib/openmpi3
[[ -d $plugins ]] || die "Open MPI's plugins are not in $plugins (Debian's layout expected)"
pmix_dir=$ompi_lib/pmix2
ompi_share=/usr/share/openmpi

# Open MPI plugins for fabrics a single GPU machine does not have (and whose libraries would
# double the archive); Open MPI skips a plugin it cannot find.
plugin_files=()
while IFS= read -r f; do
  plugin_files+=("$f")
done < <(find "$plugins" -maxdepth 1 -name '*.so' |
  grep -v -E 'ucx|ofi|psm|openib|verbs|usnic|java|cuda|hcoll|fca|mxm|portals|ime|lustre|gpfs' |
  sort)
pmix_plugins=()
while IFS= read -r f; do
  pmix_plugins+=("$f")
done < <(find "$pmix_dir/lib/pmix" -maxdepth 1 -name '*.so' 2>/dev/null | sort)

# The shared libraries every packed executable and plugin loads, as ldd resolves them here,
# without the C library's own (the machine's glibc is as new or newer) and without the GPU
# stack that the machine brings (its driver's libcuda and NVML, PyTorch's cuDNN, cuBLAS and
# NCCL: cuDNN's sub-libraries must match the one that loads them).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|'
skip+='libutil\.so|libanl\.so|libcuda\.so|libnvidia-|libcudnn|libcublas|libnccl)'
libs=()
while IFS= read -r l; do
  libs+=("$l")
done < <(for f in "${bins[@]/#/$build/}" "$orterun" "${plugin_files[@]}" "${pmix_plugins[@]}"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | awk -v skip="$skip" '$1 !~ skip && !seen[$1]++ {print $2}' | sort)
missing=$(for f in "${bins[@]/#/$build/}"; do ldd "$f"; done | grep 'not found' | sort -u || true)
[[ -z $missing ]] || die "libraries not found here: $missing"

data=()
for f in data/fmnist/train.h5 data/fmnist/test.h5; do
  [[ -f $f ]] && data+=("$f")
done

if ((list_only)); then
  printf 'bin  %s\n' "${bins[@]}"
  printf 'lib  %s\n' "${libs[@]}"
  printf 'ompi %s\n' "$orterun" "${plugin_files[@]}" "$ompi_share"
  printf 'pmix %s\n' "${pmix_plugins[@]}" "$pmix_dir/share"
  printf 'data %s\n' "${data[@]}"
  exit 0
fi

stage=$(mktemp -d /tmp/dptrain-gpu-bundle.XXXXXX)
trap 'rm -rf "$stage"' EXIT
b=$stage/dptrain-gpu
mkdir -p "$b/bin" "$b/lib" "$b/ompi/bin" "$b/ompi/share/openmpi" "$b/pmix/lib/pmix" "$b/pmix/share"
for f in "${bins[@]}"; do
  cp "$build/$f" "$b/bin/"
  strip --strip-unneeded "$b/bin/$(basename "$f")"
done
cp -L "${libs[@]}" "$b/lib/"
# Open MPI under OPAL_PREFIX=<bundle>/ompi finds its plugins and help texts where Debian's
# configuration puts them relative to the prefix (libdir ${prefix}/lib/<triplet>/openmpi/lib).
rel=${plugins#/usr}
rel=${rel#/}
mkdir -p "$b/ompi/$rel"
cp "$orterun" "$b/ompi/bin/orterun"
ln -s orterun "$b/ompi/bin/mpirun"
cp "${plugin_files[@]}" "$b/ompi/$rel/"
cp -r "$ompi_share/." "$b/ompi/share/openmpi/"
((${#pmix_plugins[@]})) && cp "${pmix_plugins[@]}" "$b/pmix/lib/pmix/"
cp -r "$pmix_dir/share/." "$b/pmix/share/"
if ((${#data[@]})); then
  mkdir -p "$b/data/fmnist"
  cp "${data[@]}" "$b/data/fmnist/"
else
  echo "gpu-bundle: note: data/fmnist is not converted (make data): the Fashion-MNIST runs" \
    "will be skipped on the GPU machine"
fi
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null ||
    echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
  echo "nvcc $( (/usr/local/cuda/bin/nvcc --version 2>/dev/null || echo unknown) | tail -1)"
  echo "archs $(grep -o 'code=\[[a-z_0-9,]*\]' "$build/build.ninja" 2>/dev/null | sort -u |
    tr '\n' ' ')"
  echo "ompi_libdir ${rel}"
  (cd "$b" && find . -type f | sort | sed 's/^/file /')
} >"$b/MANIFEST"
mkdir -p "$out"
tar -C "$stage" -cf - dptrain-gpu | xz -T0 -6 >"$out/dptrain-gpu.tar.xz.part"
mv "$out/dptrain-gpu.tar.xz.part" "$out/dptrain-gpu.tar.xz"
cp "$b/MANIFEST" "$out/MANIFEST"
size=$(stat -c %s "$out/dptrain-gpu.tar.xz")
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "gpu-bundle: $out/dptrain-gpu.tar.xz: $((size / 1048576)) MiB; with the working tree" \
  "$(((size + tree) / 1048576)) MiB of the 64 MiB a device call carries"
if ((size + tree > 64 * 1048576)); then
  die "too large for the device tool's 64 MiB"
fi
