// SPDX-License-Identifier: Apache-2.0
#include "core/util/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace dptrain {

std::string InputFileProblem(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "no such file";
    return std::string("cannot read the file: ") + std::strerror(errno);
  }
  if (S_ISDIR(st.st_mode)) return "is a directory, expected " + std::string(what);
  if (!S_ISREG(st.st_mode)) {
    return "cannot read the file: it is not a regular file (a FIFO, socket or device); give " +
           std::string(what);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return std::string("cannot read the file: ") + std::strerror(errno);
  ::close(fd);
  return "";
}

}  // namespace dptrain
