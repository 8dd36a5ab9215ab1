// SPDX-License-Identifier: Apache-2.0
// The communicator for a backend's device memory: NCCL for the CUDA backend, none for the CPU
// backend (there MPI on host memory carries the gradients too). The only place in runtime/ that
// knows whether NCCL was built (like core/backend_registry.cc for the backends).
#pragma once

#include <exception>
#include <functional>
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
// peers are not left spinning in NCCL kernels). Never throws, never waits for peers, and returns
// within kDeviceAbortDeadlineS even when ncclCommAbort does not (it can block in network
// teardown): a warning, and the job ends without it.
void AbortDeviceCommunicators() noexcept;
inline constexpr double kDeviceAbortDeadlineS = 10.0;

// Owns the device communicator on the launcher's stack and decides how it ends:
//  - destroyed normally (the run finished on every rank): the communicator's own destructor
//    ends it gracefully (NCCL: ncclCommFinalize, which completes only once every rank is
//    quiescent, then ncclCommDestroy);
//  - destroyed by stack unwinding (an exception on its way to RunTrainOrEval's catch, usually on
//    one rank only): `abort` runs first (by default AbortDeviceCommunicators: ncclCommAbort,
//    which waits for no peer), then the communicator is destroyed. A graceful end here would wait
//    up to dist.collective_timeout_s for peers that are blocked in the next collective, and the
//    error would be printed only after that wait.
// "Unwinding" is std::uncaught_exceptions() above its value at construction, so a guard that is
// itself created and destroyed inside another object's destructor during unwinding still ends
// gracefully. `abort` must not throw. Not copyable or movable.
class DeviceCommunicatorGuard {
 public:
  using AbortFn = std::function<void()>;
  explicit DeviceCommunicatorGuard(std::unique_ptr<Communicator> comm,
                                   AbortFn abort = AbortDeviceCommunicators)
      : comm_(std::move(comm)), abort_(std::move(abort)) {}
  ~DeviceCommunicatorGuard() {
    if (comm_ != nullptr && std::uncaught_exceptions() > uncaught_at_start_ && abort_) abort_();
    comm_.reset();
  }
  DeviceCommunicatorGuard(const DeviceCommunicatorGuard&) = delete;
  DeviceCommunicatorGuard& operator=(const DeviceCommunicatorGuard&) = delete;

  Communicator* get() const { return comm_.get(); }

 private:
  std::unique_ptr<Communicator> comm_;
  AbortFn abort_;
  int uncaught_at_start_ = std::uncaught_exceptions();
};

}  // namespace dptrain
