// SPDX-License-Identifier: Apache-2.0
// Agreement across ranks: AgreedError (an error every rank holds) and RunAgreed, which turns an
// error on any rank into the same AgreedError on every rank, so no rank is left waiting in a
// collective its peers will never reach.
#pragma once

#include <exception>
#include <string>

#include "core/error.h"
#include "runtime/comm/communicator.h"

namespace dptrain {

// An error that every rank has agreed on: all ranks throw it, only rank 0 should print it, and
// the process can exit with its code without MPI_Abort.
class AgreedError : public Error {
 public:
  AgreedError(const std::string& msg, int code) : Error(msg, code) {}
};

namespace detail {
// Collective: when `failed` on any rank, every rank throws AgreedError with the message and exit
// code of the lowest failing rank; otherwise returns.
void AgreeOnFailure(ControlPlane& comm, const std::string& msg, int code, bool failed);
}  // namespace detail

// Runs fn on every rank; if it throws on any rank, every rank throws AgreedError carrying the
// message and exit code of the lowest failing rank. fn must not call collectives.
template <class F>
void RunAgreed(ControlPlane& comm, F&& fn) {
  std::string msg;
  int code = 0;
  bool failed = false;
  try {
    fn();
  } catch (const Error& e) {
    msg = e.what();
    code = e.exit_code();
    failed = true;
  } catch (const std::exception& e) {
    msg = e.what();
    code = kExitInternal;
    failed = true;
  }
  detail::AgreeOnFailure(comm, msg, code, failed);
}

}  // namespace dptrain
