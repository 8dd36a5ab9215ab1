// SPDX-License-Identifier: Apache-2.0
// Replicas stay identical: every N steps the ranks compare a checksum of their parameters (a
// 64-bit hash of the bytes, so any difference at all shows). A difference stops the job with a
// message naming the step and which ranks hold which version (exit 70). Collective.
#pragma once

#include <cstdint>

#include "core/backend.h"
#include "runtime/comm/communicator.h"

namespace dptrain {

// FNV-1a over the tensor's bytes (copied to the host first on devices).
uint64_t TensorChecksum(Backend& be, const Tensor& t);

// All ranks call it with their parameters; throws InternalError (the same message on every
// rank) when the checksums differ.
void CheckReplicasIdentical(ControlPlane& comm, Backend& be, const Tensor& params, int64_t step);

}  // namespace dptrain
