// SPDX-License-Identifier: Apache-2.0
// The lock that keeps two runs out of one run_dir: rank 0 holds an exclusive flock on
// run_dir/.dptrain.lock while it trains, so a second run with the same run_dir stops at setup
// (exit 2, naming the holder) instead of overwriting the first one's checkpoints and metrics.
// The lock belongs to the open file: it ends when the holder closes it, exits or is killed, so
// a crashed run never leaves a stale lock behind (the file itself may stay; it is only a note).
#pragma once

#include <string>

namespace dptrain {

class RunDirLock {
 public:
  RunDirLock() = default;
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  ~RunDirLock();  // releases the lock; the file stays for the next run to reuse

  // Locks DIR/.dptrain.lock (DIR exists) and writes `note` (who holds it) into it. Another
  // holder, in this process or any other on a file system that shares locks: ConfigError
  // naming `dir` and that holder's note (also when other runs remove and make the file again
  // and again while this one locks it). A file system that cannot lock (some network mounts):
  // returns false with the reason in *why (and removes the file if it created it), and the run
  // goes on unprotected. Holding DIR's lock already: true; another directory's: an internal error.
  bool Acquire(const std::string& dir, const std::string& note, std::string* why);
  bool held() const { return fd_ >= 0; }

  // A setup that fails after Acquire leaves no file of its own behind (a run that cannot
  // checkpoint changes no file): removes the lock file if Acquire created it, and unlocks.
  void Abandon();

 private:
  int fd_ = -1;
  std::string path_;     // the held file
  std::string created_;  // the file's path when Acquire created it
};

}  // namespace dptrain
