// SPDX-License-Identifier: Apache-2.0
// NCCL communicator on the CUDA backend's device buffers. The communicator is created
// non-blocking (ncclConfig_t::blocking = 0): every NCCL call returns at once, possibly with
// ncclInProgress, and we poll ncclCommGetAsyncError until it settles, so initialisation, peer
// connection and every collective are bounded by dist.collective_timeout_s and end in
// ncclCommAbort plus a typed error instead of a hang. Collectives run on their own
// high-priority stream, ordered after the compute stream by an event, so gradient buckets are
// reduced while backward continues on the compute stream. Over 400 lines on purpose: one class
// whose bootstrap, polling, timeout and abort paths must be read together to see that no path
// can hang or finalize a communicator a peer still needs.
#include "runtime/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_interop.h"
#include "core/error.h"
#include "core/memory/caching_allocator.h"
#include "runtime/comm/deadline_monitor.h"

namespace dptrain {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF16:
      return ncclFloat16;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kU8:
      return ncclUint8;
  }
  DPT_THROW(UnsupportedError) << "nccl: no reduction for dtype " << DTypeName(t);
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

void CheckDeviceTensor(const Tensor& t, const char* what) {
  DPT_CHECK(t.defined() && t.device() == Device::kCuda)
      << "nccl " << what << ": needs a CUDA tensor (host data goes over the MPI communicator)";
}

class NcclCommunicator;

// What a communicator shares with the deadline monitor's thread, which may abort it while the
// main thread is anywhere (issue 63): every use of `comm` holds `mu` (on a non-blocking
// communicator NCCL calls return at once, so the lock is short), and an abort takes `comm` out
// under `mu` before it calls ncclCommAbort, so no call can use the freed communicator.
struct NcclState {
  std::mutex mu;
  ncclComm_t comm = nullptr;
  std::atomic<bool> aborted{false};
  std::string expired;  // under mu: what the monitor aborted at its deadline ("" otherwise)
};

// ncclCommAbort, once; `expired` (may be null): the collective whose deadline passed.
void AbortState(NcclState& st, const std::string* expired) noexcept {
  ncclComm_t c = nullptr;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (expired != nullptr && st.expired.empty() && st.comm != nullptr) st.expired = *expired;
    c = st.comm;
    st.comm = nullptr;
    if (c != nullptr) st.aborted = true;
  }
  if (c != nullptr) ncclCommAbort(c);
}

// Live communicators, for AbortNcclCommunicators() on main's error path.
std::mutex g_live_mu;
std::set<NcclCommunicator*>& Live() {
  static std::set<NcclCommunicator*> live;
  return live;
}

// Tensors a collective may still write after its handle gave up waiting (the communicator was
// aborted): kept alive until exit rather than returned to the allocator.
std::mutex g_orphans_mu;
std::vector<Tensor>& Orphans() {
  static std::vector<Tensor> orphans;
  return orphans;
}

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `control`. `owned` (may be null) is the control communicator when this
  // communicator owns it (Split).
  NcclCommunicator(Backend& be, MpiCommunicator& control, std::unique_ptr<MpiCommunicator> owned,
                   double timeout_s);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  void AllReduce(Tensor* t, ReduceOp op) override { AllReduceAsync(t, op)->Wait(); }
  std::unique_ptr<CommHandle> AllReduceAsync(Tensor* t, ReduceOp op) override;
  void Broadcast(Tensor* t, int root) override;
  void AllGather(const Tensor& in, Tensor* out) override;
  std::unique_ptr<CommHandle> ReduceScatterAsync(Tensor* t, ReduceOp op) override;
  std::unique_ptr<CommHandle> AllGatherAsync(Tensor* t) override;
  std::unique_ptr<Communicator> Split(int color) override;

  // ---- for handles ----
  // The compute stream waits for `done`; the host blocks until it completed or `deadline`
  // passed (the collective's own, from when it was queued: waiting for N handles in turn takes
  // at most the timeout after the last was queued, not N timeouts).
  void WaitDone(cudaEvent_t done, const std::string& what, Clock::time_point deadline);
  // Whether `done` completed; throws on an asynchronous NCCL error.
  bool Query(cudaEvent_t done, const std::string& what);
  // Waits for `done` without throwing; on error or timeout aborts the communicator and returns
  // false.
  bool DrainNoThrow(cudaEvent_t done) noexcept;
  void Abort() noexcept { AbortState(*st_, nullptr); }
  const std::shared_ptr<NcclState>& state() const { return st_; }
  double timeout_s() const { return timeout_s_; }

 private:
  // A call's result: ncclInProgress is polled until settled; errors abort and throw.
  void Check(ncclResult_t r, const char* what);
  void WaitIdle(const char* what);
  [[noreturn]] void Fail(ncclResult_t r, const std::string& what);
  [[noreturn]] void TimedOut(const std::string& what, double waited);
  void CheckUsable() const;
  // Runs call(comm) under the state's lock; throws CommError when the communicator is aborted.
  template <class F>
  ncclResult_t Call(F call);
  [[noreturn]] void ThrowAborted() const;  // st_->mu held
  // The communication stream waits for the work queued so far on the compute stream.
  void AfterCompute();
  // A new event recorded on the communication stream after the collective just queued.
  cudaEvent_t RecordDone();
  // ReduceScatterAsync / AllGatherAsync: checks `t` (f32, size_ equal chunks), orders the
  // communication stream after the compute stream, and calls launch(base, chunk rank_, chunk
  // length) to queue the collective; the handle waits for it.
  template <class Launch>
  std::unique_ptr<CommHandle> InPlaceChunks(Tensor* t, const char* name, Launch launch);

  Backend& be_;
  MpiCommunicator& control_;  // bootstrap (device check, unique id) and Split
  std::unique_ptr<MpiCommunicator> owned_;
  double timeout_s_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<NcclState> st_ = std::make_shared<NcclState>();
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  // Exceptions in flight when this communicator was made: more at destruction means stack
  // unwinding (see the destructor).
  int uncaught_at_start_ = std::uncaught_exceptions();
};

// A collective in flight. Its deadline (dist.collective_timeout_s from when it was queued) is
// watched by the process's DeadlineMonitor, which aborts the communicator when it passes, so a
// dead peer ends in an error even while the main thread is blocked in a CUDA call that waits for
// the device (cudaFree, cudaDeviceSynchronize): NCCL's kernels exit on ncclCommAbort.
class NcclHandle final : public CommHandle {
 public:
  NcclHandle(NcclCommunicator* comm, cudaEvent_t done, Tensor keep, std::string what)
      : comm_(comm),
        done_(done),
        keep_(std::move(keep)),
        what_(std::move(what)),
        deadline_(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(comm->timeout_s()))) {
    if (done_ == nullptr) return;
    // The state, shared: the communicator may be gone when the deadline passes.
    watch_ = DeadlineMonitor::Shared().Watch(
        deadline_, [st = comm->state(), what = what_] { AbortState(*st, &what); });
  }
  ~NcclHandle() override {
    if (done_ == nullptr) return;
    const bool drained = waited_ || comm_->DrainNoThrow(done_);
    DeadlineMonitor::Shared().Done(watch_);
    if (!drained) {
      // NCCL may still write the buffer: never hand it back to the allocator.
      std::lock_guard<std::mutex> lock(g_orphans_mu);
      Orphans().push_back(std::move(keep_));
      return;  // the event is leaked with it
    }
    DPT_CUDA_WARN(cudaEventDestroy(done_));
  }
  NcclHandle(const NcclHandle&) = delete;
  NcclHandle& operator=(const NcclHandle&) = delete;

  void Wait() override {
    if (done_ == nullptr || waited_) return;
    comm_->WaitDone(done_, what_, deadline_);
    waited_ = true;
    DeadlineMonitor::Shared().Done(watch_);
    keep_ = Tensor();
  }
  bool Test() override {
    if (done_ == nullptr || waited_) return true;
    return comm_->Query(done_, what_);
  }

 private:
  NcclCommunicator* comm_;
  cudaEvent_t done_;  // null: nothing to wait for (empty tensor)
  Tensor keep_;       // keeps the buffer alive while NCCL uses it
  std::string what_;
  Clock::time_point deadline_;
  DeadlineMonitor::Id watch_ = 0;
  bool waited_ = false;
};

NcclCommunicator::NcclCommunicator(Backend& be, MpiCommunicator& control,
                                   std::unique_ptr<MpiCommunicator> owned, double timeout_s)
    : be_(be),
      control_(control),
      owned_(std::move(owned)),
      timeout_s_(timeout_s > 0 ? timeout_s : 300.0),
      rank_(control.rank()),
      size_(control.size()) {
  // 1. Every rank must have its device before anyone enters NCCL: one that does not would leave
  //    the others waiting in ncclCommInitRank. Gather the reasons so every rank reports them all.
  std::string problem;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    problem = "no CUDA device (" + cuda::detail::CudaErrorText(e) + ")";
  } else if (cuda::OrdinalOf(be_) >= count) {
    problem = "CUDA device " + std::to_string(cuda::OrdinalOf(be_)) + " does not exist (" +
              std::to_string(count) + " visible)";
  } else if ((e = cudaSetDevice(cuda::OrdinalOf(be_))) != cudaSuccess) {
    (void)cudaGetLastError();
    problem = "cudaSetDevice(" + std::to_string(cuda::OrdinalOf(be_)) +
              "): " + cuda::detail::CudaErrorText(e);
  }
  const std::vector<std::string> all = control_.AllGatherStrings(problem);
  std::string missing;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) missing += "\n  rank " + std::to_string(r) + ": " + all[r];
  }
  if (!missing.empty()) {
    DPT_THROW(NcclError) << "cannot start NCCL: not every rank has its CUDA device:" << missing;
  }

  // 2. Rank 0's unique id, with its status, to everyone (a failure on rank 0 must not leave the
  //    others waiting for an id that never comes).
  struct Bootstrap {
    int32_t ok = 0;
    char error[512] = {0};
    ncclUniqueId id;
  } boot{};
  if (rank_ == 0) {
    const ncclResult_t r = ncclGetUniqueId(&boot.id);
    boot.ok = r == ncclSuccess ? 1 : 0;
    if (!boot.ok) {
      std::snprintf(boot.error, sizeof boot.error, "%s",
                    cuda::detail::NcclResultText(static_cast<int>(r)).c_str());
    }
  }
  control_.BroadcastHost(&boot, sizeof boot, 0);
  if (!boot.ok) DPT_THROW(NcclError) << "ncclGetUniqueId on rank 0 failed: " << boot.error;

  // 3. Non-blocking initialisation, bounded by the timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t init = ncclCommInitRankConfig(&comm, size_, boot.id, rank_, &config);
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->comm = comm;
  }
  Check(init, "ncclCommInitRankConfig");

  try {
    int least = 0, greatest = 0;
    DPT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DPT_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    DPT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  } catch (...) {
    Abort();
    throw;
  }
  std::lock_guard<std::mutex> lock(g_live_mu);
  Live().insert(this);
}

NcclCommunicator::~NcclCommunicator() {
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    Live().erase(this);
  }
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    // Destroyed by stack unwinding: an error is on its way to the launcher, usually on this rank
    // only. ncclCommFinalize completes only when every rank is quiescent, and the peers are
    // blocked in the next collective waiting for this rank, so a graceful end would hold the
    // error (and its message) for dist.collective_timeout_s. ncclCommAbort waits for no peer.
    Abort();
  }
  std::unique_lock<std::mutex> lock(st_->mu);  // the monitor aborts under it
  if (st_->comm != nullptr && !st_->aborted) {
    // Let queued collectives finish (bounded), then finalize (flushes, waits for peers; bounded)
    // and destroy; anything that does not settle in time is aborted instead. No handle is left,
    // so the monitor holds no deadline of this communicator.
    ncclComm_t comm = st_->comm;
    const auto start = Clock::now();
    bool clean = true;
    while (stream_ != nullptr) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady || Seconds(start) > timeout_s_) {
        (void)cudaGetLastError();
        clean = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (clean) {
      ncclResult_t r = ncclCommFinalize(comm);
      while (r == ncclInProgress && Seconds(start) <= timeout_s_) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm, &r) != ncclSuccess) r = ncclInternalError;
      }
      clean = r == ncclSuccess;
    }
    if (clean) {
      ncclCommDestroy(comm);
    } else {
      ncclCommAbort(comm);
      st_->aborted = true;
    }
    st_->comm = nullptr;
  }
  lock.unlock();
  if (ready_ != nullptr) DPT_CUDA_WARN(cudaEventDestroy(ready_));
  if (stream_ != nullptr) {
    // Tensors that outlive this communicator (a Split's buckets, orphans of an abort) must not
    // be fenced later on a handle the driver may have handed to another stream.
    be_.allocator().ForgetStream(stream_);
    DPT_CUDA_WARN(cudaStreamDestroy(stream_));
  }
}

void NcclCommunicator::CheckUsable() const {
  std::lock_guard<std::mutex> lock(st_->mu);
  if (st_->comm == nullptr || st_->aborted) ThrowAborted();
}

void NcclCommunicator::ThrowAborted() const {
  if (!st_->expired.empty()) {
    DPT_THROW(CommError) << st_->expired
                         << " did not complete within dist.collective_timeout_s = " << timeout_s_
                         << " s: a peer rank has probably died, hung or fallen "
                         << "behind; the NCCL communicator was aborted at the deadline. "
                         << "NCCL_DEBUG=INFO shows the connections NCCL made; docs/gpu.md lists "
                         << "the usual causes";
  }
  DPT_THROW(CommError) << "the NCCL communicator was aborted after an earlier error or timeout";
}

template <class F>
ncclResult_t NcclCommunicator::Call(F call) {
  std::lock_guard<std::mutex> lock(st_->mu);
  if (st_->comm == nullptr || st_->aborted) ThrowAborted();
  return call(st_->comm);
}

void NcclCommunicator::Fail(ncclResult_t r, const std::string& what) {
  std::string text = cuda::detail::NcclResultText(static_cast<int>(r));
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    if (st_->comm != nullptr) {
      const char* last = ncclGetLastError(st_->comm);
      if (last != nullptr && last[0] != '\0') text += std::string(" [") + last + "]";
    }
  }
  Abort();
  DPT_THROW(NcclError) << what << ": " << text << " (rank " << rank_ << " of " << size_
                       << "; the NCCL communicator was aborted)";
}

void NcclCommunicator::TimedOut(const std::string& what, double waited) {
  Abort();
  DPT_THROW(CommError) << what << " did not complete within " << waited
                       << " s (dist.collective_timeout_s = " << timeout_s_
                       << "): a peer rank has probably died, hung or fallen behind; the NCCL "
                       << "communicator was aborted. NCCL_DEBUG=INFO shows the connections "
                       << "NCCL made; docs/gpu.md lists the usual causes";
}

void NcclCommunicator::WaitIdle(const char* what) {
  const auto start = Clock::now();
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = Call([&](ncclComm_t c) { return ncclCommGetAsyncError(c, &state); });
    if (r != ncclSuccess) Fail(r, std::string("ncclCommGetAsyncError after ") + what);
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) Fail(state, what);
    if (Seconds(start) > timeout_s_) TimedOut(what, Seconds(start));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicator::Check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  if (r == ncclInProgress) {
    WaitIdle(what);
    return;
  }
  Fail(r, what);
}

void NcclCommunicator::AfterCompute() {
  DPT_CUDA_CHECK(cudaEventRecord(ready_, cuda::ComputeStreamOf(be_)));
  DPT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
}

cudaEvent_t NcclCommunicator::RecordDone() {
  cudaEvent_t done = nullptr;
  DPT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const cudaError_t e = cudaEventRecord(done, stream_);
  if (e != cudaSuccess) {
    cudaEventDestroy(done);
    DPT_CUDA_CHECK(e);
  }
  return done;
}

bool NcclCommunicator::Query(cudaEvent_t done, const std::string& what) {
  CheckUsable();
  const cudaError_t q = cudaEventQuery(done);
  if (q == cudaSuccess) return true;
  if (q != cudaErrorNotReady) {
    (void)cudaGetLastError();
    Abort();
    DPT_THROW(CudaError) << "waiting for " << what << ": " << cuda::detail::CudaErrorText(q);
  }
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = Call([&](ncclComm_t c) { return ncclCommGetAsyncError(c, &state); });
  if (r != ncclSuccess) Fail(r, "ncclCommGetAsyncError during " + what);
  if (state != ncclSuccess && state != ncclInProgress) Fail(state, what);
  return false;
}

void NcclCommunicator::WaitDone(cudaEvent_t done, const std::string& what,
                                Clock::time_point deadline) {
  CheckUsable();
  // Later compute-stream work (the optimizer step reading the reduced gradients) waits on the
  // GPU; the host also waits, so a hang becomes an error at the collective's deadline (here, or
  // on the monitor's thread when this one is blocked elsewhere).
  DPT_CUDA_CHECK(cudaStreamWaitEvent(cuda::ComputeStreamOf(be_), done, 0));
  const auto queued = deadline - std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeout_s_));
  for (int spins = 0; !Query(done, what); ++spins) {
    if (Clock::now() > deadline) TimedOut(what, Seconds(queued));
    if (spins < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

bool NcclCommunicator::DrainNoThrow(cudaEvent_t done) noexcept {
  const auto start = Clock::now();
  while (true) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady || st_->aborted || Seconds(start) > timeout_s_) {
      (void)cudaGetLastError();
      Abort();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

std::unique_ptr<CommHandle> NcclCommunicator::AllReduceAsync(Tensor* t, ReduceOp op) {
  CheckUsable();
  CheckDeviceTensor(*t, "allreduce");
  DPT_CHECK(op != ReduceOp::kAvg || IsFloat(t->dtype()))
      << "nccl: average of a " << DTypeName(t->dtype()) << " tensor";
  std::ostringstream what;
  what << "NCCL allreduce of " << t->numel() << " " << DTypeName(t->dtype()) << " values";
  if (t->numel() == 0) return std::make_unique<NcclHandle>(this, nullptr, Tensor(), what.str());
  t->buffer()->RecordStream(stream_);  // its block waits for this stream before any reuse
  AfterCompute();
  Check(Call([&](ncclComm_t c) {
          return ncclAllReduce(t->raw(), t->raw(), static_cast<size_t>(t->numel()),
                               NcclType(t->dtype()), NcclOp(op), c, stream_);
        }),
        "ncclAllReduce");
  t->buffer()->FenceStreamUse(stream_);  // released early, it waits for this collective only
  return std::make_unique<NcclHandle>(this, RecordDone(), *t, what.str());
}

void NcclCommunicator::Broadcast(Tensor* t, int root) {
  CheckUsable();
  CheckDeviceTensor(*t, "broadcast");
  DPT_CHECK(root >= 0 && root < size_) << "broadcast root " << root << " of " << size_;
  if (t->bytes() == 0) return;
  t->buffer()->RecordStream(stream_);
  AfterCompute();
  Check(Call([&](ncclComm_t c) {
          return ncclBroadcast(t->raw(), t->raw(), t->bytes(), ncclUint8, root, c, stream_);
        }),
        "ncclBroadcast");
  NcclHandle h(this, RecordDone(), *t,
               "NCCL broadcast of " + std::to_string(t->bytes()) + " bytes");
  h.Wait();
}

void NcclCommunicator::AllGather(const Tensor& in, Tensor* out) {
  CheckUsable();
  CheckDeviceTensor(in, "allgather");
  CheckDeviceTensor(*out, "allgather");
  DPT_CHECK(out->bytes() == in.bytes() * static_cast<size_t>(size_))
      << "allgather: " << out->bytes() << " bytes for " << size_ << " x " << in.bytes();
  if (in.bytes() == 0) return;
  in.buffer()->RecordStream(stream_);
  out->buffer()->RecordStream(stream_);
  AfterCompute();
  Check(Call([&](ncclComm_t c) {
          return ncclAllGather(in.raw(), out->raw(), in.bytes(), ncclUint8, c, stream_);
        }),
        "ncclAllGather");
  NcclHandle h(this, RecordDone(), *out,
               "NCCL allgather of " + std::to_string(in.bytes()) + " bytes per rank");
  h.Wait();
}

template <class Launch>
std::unique_ptr<CommHandle> NcclCommunicator::InPlaceChunks(Tensor* t, const char* name,
                                                            Launch launch) {
  CheckUsable();
  CheckDeviceTensor(*t, name);
  DPT_CHECK(t->dtype() == DType::kF32 && t->numel() % size_ == 0)
      << "nccl " << name << ": " << t->numel() << " " << DTypeName(t->dtype()) << " values are not "
      << size_ << " equal f32 chunks";
  const auto chunk = static_cast<size_t>(t->numel() / size_);
  const std::string what =
      std::string("NCCL ") + name + " of " + std::to_string(t->numel()) + " f32 values";
  if (chunk == 0) return std::make_unique<NcclHandle>(this, nullptr, Tensor(), what);
  t->buffer()->RecordStream(stream_);
  AfterCompute();
  float* base = t->data<float>();
  launch(base, base + static_cast<size_t>(rank_) * chunk, chunk);
  // A gradient group's scratch, released once its reduce-scatter is done, waits for that
  // collective only, not for the next group's queued behind it on this stream.
  t->buffer()->FenceStreamUse(stream_);
  return std::make_unique<NcclHandle>(this, RecordDone(), *t, what);
}

// In place per NCCL's rules: the reduce-scatter's receive buffer is chunk rank() of its send
// buffer, the all-gather's send buffer is chunk rank() of its receive buffer.
std::unique_ptr<CommHandle> NcclCommunicator::ReduceScatterAsync(Tensor* t, ReduceOp op) {
  return InPlaceChunks(t, "reduce-scatter", [&](float* base, float* mine, size_t chunk) {
    Check(Call([&](ncclComm_t c) {
            return ncclReduceScatter(base, mine, chunk, ncclFloat32, NcclOp(op), c, stream_);
          }),
          "ncclReduceScatter");
  });
}

std::unique_ptr<CommHandle> NcclCommunicator::AllGatherAsync(Tensor* t) {
  return InPlaceChunks(t, "all-gather", [&](float* base, float* mine, size_t chunk) {
    Check(Call([&](ncclComm_t c) {
            return ncclAllGather(mine, base, chunk, ncclFloat32, c, stream_);
          }),
          "ncclAllGather");
  });
}

std::unique_ptr<Communicator> NcclCommunicator::Split(int color) {
  std::unique_ptr<MpiCommunicator> sub = control_.SplitMpi(color);
  if (sub == nullptr) return nullptr;
  MpiCommunicator& ref = *sub;
  return std::make_unique<NcclCommunicator>(be_, ref, std::move(sub), timeout_s_);
}

}  // namespace

std::unique_ptr<Communicator> CreateNcclCommunicator(Backend& backend, MpiCommunicator& control,
                                                     double timeout_s) {
  DPT_CHECK(cuda::IsCudaBackend(backend))
      << "the NCCL communicator needs the cuda backend, got '" << backend.name() << "'";
  return std::make_unique<NcclCommunicator>(backend, control, nullptr, timeout_s);
}

void AbortNcclCommunicators() noexcept {
  // The states, then the aborts without the lock: a communicator destroyed meanwhile (its
  // destructor takes the lock) must not wait for an ncclCommAbort stuck in network teardown.
  std::vector<std::shared_ptr<NcclState>> states;
  try {
    std::lock_guard<std::mutex> lock(g_live_mu);
    for (NcclCommunicator* c : Live()) states.push_back(c->state());
  } catch (...) {
    return;  // no memory for the list: nothing to abort with
  }
  for (const auto& st : states) AbortState(*st, nullptr);
}

}  // namespace dptrain
