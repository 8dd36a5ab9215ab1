// SPDX-License-Identifier: Apache-2.0
// CreateDeviceCommunicator: NCCL when this build has the CUDA backend (DPTRAIN_HAS_CUDA comes
// from dptrain_backends), nothing for host memory.
#include "runtime/comm/device_communicator.h"

#include <cstdio>

#include "core/error.h"
#include "runtime/comm/deadline_monitor.h"
#if DPTRAIN_HAS_CUDA
#include "runtime/comm/nccl_communicator.h"
#endif

namespace dptrain {

std::unique_ptr<Communicator> CreateDeviceCommunicator(Backend& backend, MpiCommunicator& control,
                                                       double timeout_s) {
#if DPTRAIN_HAS_CUDA
  if (backend.device() == Device::kCuda) {
    return CreateNcclCommunicator(backend, control, timeout_s);
  }
#else
  (void)control;
  (void)timeout_s;
#endif
  DPT_CHECK(backend.device() == Device::kCpu)
      << "no device communicator for backend '" << backend.name() << "'";
  return nullptr;
}

void AbortDeviceCommunicators() noexcept {
#if DPTRAIN_HAS_CUDA
  // ncclCommAbort can block in network teardown; MPI_Abort comes next and must not wait for it.
  if (!CallWithDeadline([] { AbortNcclCommunicators(); }, kDeviceAbortDeadlineS)) {
    std::fprintf(stderr,
                 "dptrain: warning: ncclCommAbort did not return within %.0f s; ending the job "
                 "without it\n",
                 kDeviceAbortDeadlineS);
  }
#endif
}

}  // namespace dptrain
