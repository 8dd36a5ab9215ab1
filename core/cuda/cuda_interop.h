// SPDX-License-Identifier: Apache-2.0
// What CUDA-compiled code outside core/ (the NCCL communicator in runtime/comm/) may know of a
// CUDA backend: its device ordinal and its compute stream. Includes the CUDA runtime header, so
// only CUDA-built sources include it. The backend class itself (cuda_backend_impl.h) is for
// core/cuda/ alone; this header is the public way in.
#pragma once

#include <cuda_runtime_api.h>

#include "core/backend.h"

namespace dptrain::cuda {

// True when `backend` is the CUDA backend (the others below require it).
bool IsCudaBackend(const Backend& backend);

// The CUDA device ordinal the backend runs on (0 under the remap binding).
int OrdinalOf(const Backend& backend);

// The backend's one compute stream: every op of the backend is queued on it, in call order.
// Valid for the backend's lifetime. Work on another stream that reads or writes backend tensors
// must be ordered against it with events (and mark the tensors' blocks with RecordStream).
cudaStream_t ComputeStreamOf(const Backend& backend);

}  // namespace dptrain::cuda
