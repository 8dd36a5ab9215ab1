// SPDX-License-Identifier: Apache-2.0
// The run_dir lock: open (or create) the lock file, flock it without waiting, leave a note.
#include "runtime/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace dptrain {
namespace {

constexpr int kAttempts = 100;

}  // namespace

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);
}

bool RunDirLock::Acquire(const std::string& dir, const std::string& note, std::string* why) {
  const std::string path = dir + "/.dptrain.lock";
  if (fd_ >= 0) {
    DPT_CHECK(path == path_) << "RunDirLock already holds " << path_ << ", asked for " << path;
    return true;
  }
  // Create it, or open the one an earlier run left: only a file this call created is removed
  // by Abandon. A run abandoning its setup removes its file while holding it, so the file this
  // call opened may be gone by the time it is opened or locked: then start again on the new one
  // (a lock on a removed file keeps out nobody). Each retry means another run removed a file.
  // Another run that keeps making and removing it holds it as good as: never trained unprotected.
  const auto removed_again = [&](int attempt) {
    DPT_CHECK_AS(ConfigError, attempt < kAttempts)
        << "run_dir '" << dir << "' is in use by another dptrain run (its lock file was removed "
        << "and made again " << kAttempts << " times while this run locked it)"
        << "; give this run its own run_dir, or wait for that one to end";
  };
  int fd = -1;
  bool created = false;
  for (int attempt = 0;; ++attempt) {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    created = fd >= 0;
    if (fd < 0 && errno == EEXIST) {
      fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0 && errno == ENOENT) {  // removed in between
        removed_again(attempt);
        continue;
      }
    }
    if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;  // the file stays: the holder has it open
      if (fd >= 0 && err == EWOULDBLOCK) {
        char holder[256];
        const ssize_t n = ::pread(fd, holder, sizeof holder, 0);
        ::close(fd);
        std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
        while (!who.empty() && who.back() == '\n') who.pop_back();
        DPT_THROW(ConfigError) << "run_dir '" << dir << "' is in use by another dptrain run"
                               << (who.empty() ? "" : " (" + who + ")")
                               << "; give this run its own run_dir, or wait for that one to end";
      }
      if (fd >= 0) ::close(fd);
      if (created) ::unlink(path.c_str());  // no lock on this file system: leave nothing behind
      if (why != nullptr) *why = path + ": " + std::strerror(err);
      return false;
    }
    struct stat locked {};
    struct stat named {};
    if (::fstat(fd, &locked) == 0 && ::stat(path.c_str(), &named) == 0 &&
        locked.st_dev == named.st_dev && locked.st_ino == named.st_ino) {
      break;  // locked, and still the file the path names
    }
    ::close(fd);  // removed (or replaced) before the lock: never this call's to remove
    removed_again(attempt);
  }
  fd_ = fd;
  path_ = path;
  if (created) created_ = path;
  const std::string line = note + "\n";
  const bool noted = ::ftruncate(fd, 0) == 0 &&
                     ::pwrite(fd, line.data(), line.size(), 0) == static_cast<ssize_t>(line.size());
  (void)noted;  // without the note the lock holds; only the message naming the holder is poorer
  return true;
}

void RunDirLock::Abandon() {
  if (fd_ < 0) return;
  if (!created_.empty()) ::unlink(created_.c_str());  // still locked: no other run holds it
  ::close(fd_);
  fd_ = -1;
  path_.clear();
  created_.clear();
}

}  // namespace dptrain
