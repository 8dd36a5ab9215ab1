// SPDX-License-Identifier: Apache-2.0
// The NCCL Communicator: collectives on device buffers of the CUDA backend (built into
// dptrain_cuda; reach it through CreateDeviceCommunicator in runtime/comm/device_communicator.h).
// No CUDA or NCCL header is included here.
//
// Contract, beyond communicator.h:
//  - Tensors are CUDA tensors of the backend passed at creation; dtypes f32, bf16, f16 and i32
//    for reductions (kAvg only for floating point), any dtype for Broadcast / AllGather (bytes).
//  - Stream semantics: a collective starts after everything already queued on the backend's
//    compute stream (an event on the compute stream, waited for by a dedicated high-priority
//    communication stream), so AllReduceAsync right after backward wrote a gradient bucket
//    reduces the final values while later backward kernels keep running.
//  - CommHandle::Test() asks whether the collective finished (cudaEventQuery) without blocking.
//    Wait() makes the compute stream wait for it (later ops see the result) and blocks the host
//    until it finished, polling ncclCommGetAsyncError: an asynchronous NCCL error or more than
//    `timeout_s` seconds aborts the communicator (ncclCommAbort) and throws NcclError / CommError
//    (exit code 5) instead of hanging. Blocking calls (AllReduce, Broadcast, AllGather) wait the
//    same way before returning.
//  - The communicator is non-blocking (NCCL config blocking = 0), so its creation and the first
//    collectives (which connect peers) are bounded by the same timeout.
//  - It carries tensors only: agreements between ranks stay on the MPI control plane it was
//    created over, which it also uses for its own bootstrap and for Split.
#pragma once

#include <memory>

#include "core/backend.h"
#include "runtime/comm/communicator.h"

namespace dptrain {

// Collective over `control` (every rank calls it): first checks that every rank has its CUDA
// device (one clear error naming the ranks that do not, instead of a hang inside NCCL), then rank
// 0 creates the ncclUniqueId, broadcasts it over `control`, and all ranks initialise NCCL.
// `backend` must be the CUDA backend; `control` must outlive the communicator.
std::unique_ptr<Communicator> CreateNcclCommunicator(Backend& backend, MpiCommunicator& control,
                                                     double timeout_s);

// ncclCommAbort on every live NCCL communicator of this process: main's error path, before
// MPI_Abort, so a failing rank never leaves NCCL kernels of its peers spinning. Never throws.
void AbortNcclCommunicators() noexcept;

}  // namespace dptrain
