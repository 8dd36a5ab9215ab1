// SPDX-License-Identifier: Apache-2.0
// Typed, rank-tagged errors. Library code throws; only launcher/main.cc decides a process's fate
// and turns the error class into the exit code of DESIGN.md section 8.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace dptrain {

// Exit codes (DESIGN.md section 8). Documented for users in docs/errors.md.
enum ExitCode : int {
  kExitOk = 0,
  kExitUsage = 2,       // command line or config error
  kExitData = 3,        // dataset error, non-finite values in training
  kExitOom = 4,         // out of memory
  kExitComm = 5,        // communication failure or collective timeout
  kExitCheckpoint = 6,  // checkpoint cannot be written or read
  kExitInternal = 70,   // a bug, a backend failure, diverged replicas
};

// Who this process is; set once by the launcher, read by every error message.
struct ProcessContext {
  int rank = 0;
  int world = 1;
  std::string host;
};
const ProcessContext& GetProcessContext();
void SetProcessContext(ProcessContext ctx);
// "[rank 2/4 host-a] "
std::string RankTag();

// Base of every dptrain error. what() is the full, user-facing message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg, int exit_code = kExitInternal)
      : std::runtime_error(msg), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

#define DPT_DEFINE_ERROR(Name, Base, code)                                                \
  class Name : public Base {                                                              \
   public:                                                                                \
    explicit Name(const std::string& msg, int exit_code = code) : Base(msg, exit_code) {} \
  }

DPT_DEFINE_ERROR(ConfigError, Error, kExitUsage);       // bad config key/value, bad command line
DPT_DEFINE_ERROR(UnsupportedError, Error, kExitUsage);  // an op/feature a backend cannot do
DPT_DEFINE_ERROR(IoError, Error, kExitData);            // files: missing, unreadable, malformed
DPT_DEFINE_ERROR(DataError, IoError, kExitData);        // dataset content (schema, labels, NaN)
DPT_DEFINE_ERROR(CheckpointError, IoError, kExitCheckpoint);
DPT_DEFINE_ERROR(OutOfMemory, Error, kExitOom);
DPT_DEFINE_ERROR(CommError, Error, kExitComm);
DPT_DEFINE_ERROR(MpiError, CommError, kExitComm);
DPT_DEFINE_ERROR(NcclError, CommError, kExitComm);
DPT_DEFINE_ERROR(BackendError, Error, kExitInternal);
DPT_DEFINE_ERROR(DnnlError, BackendError, kExitInternal);
DPT_DEFINE_ERROR(CudaError, BackendError, kExitInternal);
DPT_DEFINE_ERROR(CudnnError, BackendError, kExitInternal);
// cuDNN's NOT_SUPPORTED or BAD_PARAM families: this call is not for these operands (a layout, a
// fused call, a shape), as opposed to a failure while running.
DPT_DEFINE_ERROR(CudnnRefusal, CudnnError, kExitInternal);
DPT_DEFINE_ERROR(CublasError, BackendError, kExitInternal);
DPT_DEFINE_ERROR(InternalError, Error, kExitInternal);
#undef DPT_DEFINE_ERROR

namespace detail {

// Collects a message with operator<<; Raise() & stream throws it. The `&` trick lets
// `DPT_THROW(ConfigError) << "a" << b;` build the whole message before throwing.
template <class E>
class ErrorStream {
 public:
  ErrorStream(const char* file, int line, const char* what) {
    os_ << RankTag() << StripPrefix(file) << ':' << line << ": ";
    if (what[0] != '\0') os_ << what << ": ";
  }
  template <class T>
  ErrorStream& operator<<(const T& v) {
    os_ << v;
    return *this;
  }
  std::string str() const { return os_.str(); }

 private:
  static const char* StripPrefix(const char* file);
  std::ostringstream os_;
};

// Paths are printed relative to the repository root ("core/error.h").
const char* StripSourcePrefix(const char* file);
template <class E>
const char* ErrorStream<E>::StripPrefix(const char* file) {
  return StripSourcePrefix(file);
}

struct Raise {
  template <class E>
  [[noreturn]] friend void operator&(Raise, const ErrorStream<E>& s) {
    throw E(s.str());
  }
};

}  // namespace detail
}  // namespace dptrain

// Throws `Type` with a message: DPT_THROW(ConfigError) << "train.lr must be > 0";
#define DPT_THROW(Type) \
  ::dptrain::detail::Raise() & ::dptrain::detail::ErrorStream<Type>(__FILE__, __LINE__, "")

// Throws `Type` unless cond holds: DPT_CHECK_AS(DataError, n > 0) << "empty dataset " << path;
// For errors users meet: the message is what they read, so the expression is not printed.
#define DPT_CHECK_AS(Type, cond) \
  if (cond) {                    \
  } else                         \
    ::dptrain::detail::Raise() & ::dptrain::detail::ErrorStream<Type>(__FILE__, __LINE__, "")

// Internal invariant: a failure is a bug (exit 70); the failing expression is printed.
#define DPT_CHECK(cond)                                                                    \
  if (cond) {                                                                              \
  } else                                                                                   \
    ::dptrain::detail::Raise() & ::dptrain::detail::ErrorStream<::dptrain::InternalError>( \
                                     __FILE__, __LINE__, "check failed: " #cond)

#ifdef NDEBUG
#define DPT_DCHECK(cond) \
  while (false) DPT_CHECK(cond)
#else
#define DPT_DCHECK(cond) DPT_CHECK(cond)
#endif
