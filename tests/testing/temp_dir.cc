// SPDX-License-Identifier: Apache-2.0
// TempDir: mkdtemp under $TMPDIR (or /tmp), recursive removal on destruction.
#include "tests/testing/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace dptrain::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl =
      std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/dptrain-test.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  DPT_CHECK(mkdtemp(buf.data()) != nullptr) << "mkdtemp " << tmpl;
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace dptrain::testing
