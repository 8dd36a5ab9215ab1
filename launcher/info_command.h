// SPDX-License-Identifier: Apache-2.0
// `dptrain info [--gpus LIST] [--device-binding POLICY]`: version, cores, the GPUs NVML sees, the
// device each local rank would be bound to, the backends built and the library versions.
#pragma once

#include "runtime/run_config.h"

namespace dptrain {

// Prints to stdout; never starts MPI or creates a CUDA context. Returns the exit code.
int RunInfoCommand(const DistConfig& dist);

}  // namespace dptrain
