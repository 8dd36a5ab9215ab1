// SPDX-License-Identifier: Apache-2.0
#include "core/util/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace dptrain {
namespace {

std::string NotRegular(std::string_view what) {
  return "cannot read the file: it is not a regular file (a FIFO, socket or device); give " +
         std::string(what);
}

// InputFileProblem's checks; on success *fd is the open, checked descriptor (the caller closes
// it) and *size the file's size.
std::string OpenChecked(const std::string& path, std::string_view what, int* fd, off_t* size) {
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
  // and the fstat below sees it. (On a regular file it changes nothing.)
  *fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (*fd < 0) return std::string("cannot read the file: ") + std::strerror(errno);
  struct stat opened {};
  if (::fstat(*fd, &opened) != 0 || !S_ISREG(opened.st_mode)) {
    ::close(*fd);
    *fd = -1;
    return NotRegular(what);
  }
  // Reads block as usual from here (O_NONBLOCK could make a network or FUSE file system's read
  // answer EAGAIN).
  const int flags = ::fcntl(*fd, F_GETFL);
  if (flags >= 0) ::fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK);
  *size = opened.st_size;
  return "";
}

// Closes the descriptor however the reader leaves (a failed allocation throws).
struct FdCloser {
  int fd = -1;
  FdCloser() = default;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
};

}  // namespace

std::string InputFileProblem(const std::string& path, std::string_view what) {
  FdCloser file;
  off_t size = 0;
  return OpenChecked(path, what, &file.fd, &size);
}

int OpenInputFile(const std::string& path, std::string_view what, std::string* why) {
  int fd = -1;
  off_t size = 0;
  *why = OpenChecked(path, what, &fd, &size);
  return fd;
}

std::string ReadInputFile(const std::string& path, std::string_view what,
                          std::vector<uint8_t>* bytes, size_t max_bytes) {
  FdCloser file;
  off_t size = 0;
  std::string why = OpenChecked(path, what, &file.fd, &size);
  if (!why.empty()) return why;
  const int fd = file.fd;
  const auto too_large = [&](uint64_t n) {
    return "is " + std::to_string(n) + " bytes, more than the " + std::to_string(max_bytes) +
           " bytes " + std::string(what) + " can be";
  };
  if (static_cast<uint64_t>(size) > max_bytes) return too_large(static_cast<uint64_t>(size));
  bytes->resize(static_cast<size_t>(size));
  size_t got = 0;
  // The size fstat saw into place, then on to the end (a file that grew meanwhile is read whole).
  uint8_t more[65536];
  for (;;) {
    const bool in_place = got < bytes->size();
    uint8_t* dst = in_place ? bytes->data() + got : more;
    const ssize_t n = ::read(fd, dst, in_place ? bytes->size() - got : sizeof more);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      why = std::string("cannot read the file: ") + std::strerror(errno);
      break;
    }
    if (n == 0) break;
    if (!in_place) bytes->insert(bytes->end(), more, more + n);
    got += static_cast<size_t>(n);
    if (got > max_bytes) {  // grew past it while being read
      why = too_large(got);
      break;
    }
  }
  bytes->resize(got);
  return why;
}

}  // namespace dptrain
