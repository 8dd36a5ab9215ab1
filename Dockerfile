# SPDX-License-Identifier: Apache-2.0
# dptrain image: a build stage (compilers, headers, CUDA toolkit + cuDNN + NCCL when the base has
# them) and a slim runtime stage (the dptrain binary, Open MPI's mpirun and the shared libraries).
# Both stages install their packages with scripts/install-deps.sh, the project's one list.
#
#   docker build -t dptrain .                     # CUDA 13 + cuDNN 9 (needs the NVIDIA images;
#                                                 # BuildKit: Docker 23+, or DOCKER_BUILDKIT=1)
#   docker run --rm --gpus all --ipc=host -v $PWD/data:/data:ro -v $PWD/runs:/runs \
#     --entrypoint mpirun dptrain -np 4 dptrain train --config /opt/dptrain/configs/fmnist_cnn.toml \
#     --set data.train=/data/fmnist/train.h5 --set data.test=/data/fmnist/test.h5 --set run_dir=/runs/fmnist
#   docker run --rm --gpus all dptrain info       # the entrypoint is dptrain itself
#
# CPU-only image from any Debian 12 / Ubuntu 22.04+ base (both stages on the same base):
#   docker build --build-arg BASE_IMAGE=debian:bookworm --build-arg RUNTIME_IMAGE=debian:bookworm -t dptrain:cpu .
# The CUDA backend is built exactly when the build stage has nvcc, cuDNN and NCCL
# (cmake/Cuda.cmake), so a Debian base gives a CPU-only binary; docs/launching.md has the GPU
# flags (--gpus, --ipc=host / --shm-size) and the Open MPI settings below explained.

# Build stage base: a CUDA *devel* image (nvcc, headers; NVIDIA's devel images carry NCCL too).
ARG BASE_IMAGE=nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04
# Runtime stage base: the *runtime* image of the same CUDA/cuDNN release and distribution
# (libcudart, cuBLAS, cuDNN, NCCL; no compiler). Set it together with BASE_IMAGE.
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS build
ARG JOBS=
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
# Packages first (a layer that survives source edits), then the sources.
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh --build --ccache && rm -rf /var/lib/apt/lists/*
COPY . .
# The compiler cache is a BuildKit cache mount (Docker 23+ builds with BuildKit; on 20.10 set
# DOCKER_BUILDKIT=1): a rebuild after a source change recompiles only what changed, and the
# cache never enters the image.
RUN --mount=type=cache,target=/root/.cache/ccache,id=dptrain-ccache \
    cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DDPTRAIN_BUILD_TESTS=OFF -DDPTRAIN_BUILD_BENCH=OFF \
 && cmake --build /build --target dptrain -j "${JOBS:-$(nproc)}" \
 && install -D -m 0755 /build/launcher/dptrain /opt/dptrain/bin/dptrain \
 && /opt/dptrain/bin/dptrain --version

# ---------------------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN bash /tmp/install-deps.sh --runtime && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh
COPY --from=build /opt/dptrain/bin/dptrain /usr/local/bin/dptrain
# Every shared library the binary needs is installed (the driver's libcuda and libnvidia-ml come
# from the host at run time through the NVIDIA container toolkit), cuBLAS and libvips included:
# the CUDA backend and `convert --from imagefolder` load them with dlopen, so ldd does not list
# them and `dptrain info` says whether they load.
RUN if ldd /usr/local/bin/dptrain | grep 'not found' | grep -v -e libcuda.so -e libnvidia-ml; then \
      echo "dptrain: shared libraries missing from scripts/install-deps.sh --runtime" >&2; exit 1; \
    fi \
 && if dptrain info | grep 'cuBLAS.*not loadable'; then \
      echo "dptrain: the runtime image has no cuBLAS for the CUDA backend" >&2; exit 1; \
    fi \
 && if dptrain info | grep 'libvips.*not loadable'; then \
      echo "dptrain: the runtime image has no libvips for convert --from imagefolder" >&2; exit 1; \
    fi \
 && dptrain --version
COPY configs /opt/dptrain/configs
COPY scripts/mpi-env.sh /opt/dptrain/mpi-env.sh

# Open MPI inside a container:
# - containers usually run as root, and mpirun refuses root without these two;
# - Docker's default seccomp profile (no CAP_SYS_PTRACE) blocks the cross-memory-attach
#   single copy of the shared-memory BTL (vader): every rank would print
#   "Read -1, expected ..., errno = 1" and fall back anyway, so choose the fallback up front;
# - pml ob1 with the self, shared-memory and TCP BTLs: no probing of InfiniBand/UCX hardware
#   that the container does not have (each probe prints a warning). On an InfiniBand cluster
#   override with -e OMPI_MCA_pml=ucx -e OMPI_MCA_btl=^vader,tcp,openib (and pass the devices).
ENV OMPI_ALLOW_RUN_AS_ROOT=1 \
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_btl_vader_single_copy_mechanism=none \
    OMPI_MCA_pml=ob1 \
    OMPI_MCA_btl=self,vader,tcp
# The NVIDIA container toolkit reads these (`--gpus all` sets NVIDIA_VISIBLE_DEVICES itself).
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /work
ENTRYPOINT ["dptrain"]
CMD ["--help"]
