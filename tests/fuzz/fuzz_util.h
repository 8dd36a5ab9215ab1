// SPDX-License-Identifier: Apache-2.0
// Shared helpers for the libFuzzer targets: a private temporary directory (removed at exit),
// writing the fuzz input to files in it, and splitting one input into several files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dptrain::fuzz {

// A directory private to this process, created on first use (in $TMPDIR, else /dev/shm when
// writable, else /tmp) and removed with its contents at normal exit.
std::string TempDir();

// TempDir() + "/" + name.
std::string TempPath(const std::string& name);

// Writes `bytes` to `path`, replacing it. Aborts on failure (a harness problem, not a finding).
void WriteFile(const std::string& path, std::string_view bytes);

// Splits `data` at each occurrence of kSeparator into at most `max_parts` parts (the last part
// keeps any further separators). Seeds for multi-file targets join their files with it.
inline constexpr std::string_view kSeparator = "\n--dptrain-fuzz-next-file--\n";
std::vector<std::string_view> Split(std::string_view data, size_t max_parts);

}  // namespace dptrain::fuzz
