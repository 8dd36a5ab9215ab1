// SPDX-License-Identifier: Apache-2.0
// The dptrain command line as a function: parses argv, runs the subcommand and returns the
// process's exit code (DESIGN.md section 8). launcher/main.cc calls it with no hooks; the
// test-only binary tests/testing/dptrain_hooked_main.cc calls it with the hooks tests inject.
#pragma once

#include <string>

#include "runtime/train_hooks.h"

namespace dptrain {

// Collective under a launcher: every rank calls it with the same argv. May call MPI_Abort (a
// failure on some ranks only) and never returns then.
int RunCommandLine(int argc, char** argv, const TrainHooks& hooks);

// How every subcommand reports an error on stderr: "dptrain: error: <what>", flushed.
void PrintError(const std::string& what);

}  // namespace dptrain
