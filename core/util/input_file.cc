// SPDX-License-Identifier: Apache-2.0
#include "core/util/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dptrain {
namespace {

std::string NotRegular(std::string_view what) {
  return "cannot read the file: it is not a regular file (a FIFO, socket or device); give " +
         std::string(what);
}

}  // namespace

std::string InputFileProblem(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "no such file";
    return std::string("cannot read the file: ") + std::strerror(errno);
  }
  if (S_ISDIR(st.st_mode)) return "is a directory, expected " + std::string(what);
  if (!S_ISREG(st.st_mode)) {
    return NotRegular(what);
  }
  // O_NONBLOCK: should the path have become a FIFO since the stat, the open returns at once
  // and the fstat below sees it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return std::string("cannot read the file: ") + std::strerror(errno);
  struct stat opened {};
  const bool regular = ::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode);
  ::close(fd);
  if (!regular) {
    return NotRegular(what);
  }
  return "";
}

}  // namespace dptrain
