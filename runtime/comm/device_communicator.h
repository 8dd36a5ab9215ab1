// SPDX-License-Identifier: Apache-2.0
// The communicator for a backend's device memory: NCCL for the CUDA backend, none for the CPU
// backend (there MPI on host memory carries the gradients too). The only place in runtime/ that
// knows whether NCCL was built (like core/backend_registry.cc for the backends).
#pragma once

#include <memory>

#include "core/backend.h"
#include "runtime/comm/communicator.h"

namespace dptrain {

// A communicator for `backend`'s device memory over the ranks of `control`: NCCL for "cuda"
// (runtime/comm/nccl_communicator.h), collectives bounded by `timeout_s`. nullptr for "cpu":
// there `control` (MPI on host memory) is the device communicator. Collective over `control`,
// which must outlive the result.
std::unique_ptr<Communicator> CreateDeviceCommunicator(Backend& backend, MpiCommunicator& control,
                                                       double timeout_s);

// Aborts every device communicator of this process (main's error path, before MPI_Abort, so
// peers are not left spinning in NCCL kernels). Never throws.
void AbortDeviceCommunicators() noexcept;

}  // namespace dptrain
