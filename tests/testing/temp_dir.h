// SPDX-License-Identifier: Apache-2.0
// A temporary directory for a test, removed with everything in it when the object dies.
#pragma once

#include <string>

namespace dptrain::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace dptrain::testing
