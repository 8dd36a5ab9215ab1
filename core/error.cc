// SPDX-License-Identifier: Apache-2.0
// Process identity for rank-tagged error messages.
#include "core/error.h"

#include <cstring>
#include <mutex>

namespace dptrain {
namespace {
std::mutex g_mu;
ProcessContext g_ctx;
}  // namespace

const ProcessContext& GetProcessContext() { return g_ctx; }

void SetProcessContext(ProcessContext ctx) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_ctx = std::move(ctx);
}

std::string RankTag() {
  std::string tag = "[rank " + std::to_string(g_ctx.rank) + "/" + std::to_string(g_ctx.world);
  if (!g_ctx.host.empty()) tag += " " + g_ctx.host;
  return tag + "] ";
}

namespace detail {
const char* StripSourcePrefix(const char* file) {
  // Everything up to and including the source root; DPTRAIN_SOURCE_DIR is set by CMake.
#ifdef DPTRAIN_SOURCE_DIR
  const size_t n = std::strlen(DPTRAIN_SOURCE_DIR);
  if (std::strncmp(file, DPTRAIN_SOURCE_DIR, n) == 0) {
    file += n;
    while (*file == '/') ++file;
  }
#endif
  // A build that compiles sources by relative path (ccache's base_dir, a build folder beside the
  // sources) has "../core/x.cc": the same name for the reader.
  while (std::strncmp(file, "../", 3) == 0) file += 3;
  return file;
}
}  // namespace detail
}  // namespace dptrain
