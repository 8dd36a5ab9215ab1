// SPDX-License-Identifier: Apache-2.0
// `dptrain plan --config FILE [--ranks N] [--json]`: the memory one rank needs, per layer and in
// total, at the configured micro-batch and precision, and the largest micro-batch that fits
// memory.limit (or the device). Builds the model on the configured device without data.
#pragma once

#include <string>

#include "launcher/config.h"

namespace dptrain {

// Prints the plan (a table, or JSON) to stdout; returns the exit code. `ranks` <= 0: take the
// world size from the launcher's environment (1 when run alone).
int RunPlanCommand(const TrainConfig& cfg, int ranks, bool json);

}  // namespace dptrain
