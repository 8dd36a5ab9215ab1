// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the fuzz targets (see fuzz_util.h).
#include "tests/fuzz/fuzz_util.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace dptrain::fuzz {
namespace {

std::string MakeTempDir() {
  std::string base;
  if (const char* t = std::getenv("TMPDIR"); t != nullptr && t[0] != '\0') {
    base = t;
  } else if (access("/dev/shm", W_OK) == 0) {
    base = "/dev/shm";  // tmpfs: the targets write a file per input
  } else {
    base = "/tmp";
  }
  std::string tmpl = base + "/dptrain-fuzz-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("dptrain fuzz: mkdtemp");
    std::abort();
  }
  return tmpl;
}

// Plain storage, never destroyed: the atexit handler runs after function-local statics die.
char g_dir[1024];

void RemoveTempDir() {
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
}

}  // namespace

std::string TempDir() {
  static const bool created = [] {
    const std::string d = MakeTempDir();
    if (d.size() >= sizeof(g_dir)) {
      std::fprintf(stderr, "dptrain fuzz: temporary directory name too long: %s\n", d.c_str());
      std::abort();
    }
    d.copy(g_dir, d.size());
    std::atexit(RemoveTempDir);
    return true;
  }();
  (void)created;
  return g_dir;
}

std::string TempPath(const std::string& name) { return TempDir() + "/" + name; }

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "dptrain fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

std::vector<std::string_view> Split(std::string_view data, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const size_t at = data.find(kSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(data.substr(0, at));
    data.remove_prefix(at + kSeparator.size());
  }
  parts.push_back(data);
  return parts;
}

}  // namespace dptrain::fuzz
