// SPDX-License-Identifier: Apache-2.0
// Which backends this build has, and the process-wide instance of each. The only place (with
// tests/testing/backends.cc) that knows whether CUDA was compiled in.
#pragma once

#include <string>
#include <vector>

#include "runtime/backend.h"

namespace dptrain {

// Names of the backends compiled into this binary, CPU first: {"cpu"} or {"cpu", "cuda"}.
std::vector<std::string> BuiltBackends();
// Whether `name` can be used on this machine now; if not, `why` says why (no device, not built).
bool BackendAvailable(const std::string& name, std::string* why);
// The process-wide backend (created on first use, lives until exit). Throws UnsupportedError
// naming the reason when it is not available.
Backend& GetBackend(const std::string& name);

}  // namespace dptrain
