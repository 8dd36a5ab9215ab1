// SPDX-License-Identifier: Apache-2.0
// MPI communicator. Averages are sums scaled on the host side after the reduction (MPI has no
// average op). Non-blocking collectives only progress inside MPI calls, so callers that overlap
// them with compute poll Test() between pieces of work.
#include "runtime/comm/mpi_communicator.h"

#include <mpi.h>

#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "runtime/comm/watchdog.h"

#define DPT_MPI_CHECK(expr)                                                               \
  do {                                                                                    \
    const int dpt_rc_ = (expr);                                                           \
    if (dpt_rc_ != MPI_SUCCESS) {                                                         \
      char dpt_msg_[MPI_MAX_ERROR_STRING];                                                \
      int dpt_len_ = 0;                                                                   \
      MPI_Error_string(dpt_rc_, dpt_msg_, &dpt_len_);                                     \
      DPT_THROW(::dptrain::MpiError) << #expr << ": " << std::string(dpt_msg_, dpt_len_); \
    }                                                                                     \
  } while (false)

namespace dptrain {
namespace {

MPI_Datatype MpiType(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kU8:
      return MPI_UINT8_T;
    default:
      DPT_THROW(UnsupportedError) << "mpi: no reduction for dtype " << DTypeName(t);
  }
}

MPI_Op MpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void ScaleForAvg(Tensor* t, ReduceOp op, int size) {
  if (op != ReduceOp::kAvg || size == 1) return;
  DPT_CHECK(t->dtype() == DType::kF32) << "average of a non-float tensor";
  float* p = t->data<float>();
  const float inv = 1.f / static_cast<float>(size);
  for (int64_t i = 0; i < t->numel(); ++i) p[i] *= inv;
}

void CheckHost(const Tensor& t) {
  DPT_CHECK(t.device() == Device::kCpu) << "the MPI communicator needs host tensors";
}

class MpiHandle final : public CommHandle {
 public:
  // `chunk_to` >= 0: a reduce-scatter in place, whose result MPI leaves at the start of the
  // buffer; it moves to chunk `chunk_to` on completion.
  MpiHandle(MPI_Request req, Tensor t, ReduceOp op, int size, int chunk_to = -1)
      : req_(req), t_(std::move(t)), op_(op), size_(size), chunk_to_(chunk_to) {}
  ~MpiHandle() override {
    if (req_ != MPI_REQUEST_NULL) {
      // A handle dropped without Wait (an error elsewhere): complete it so the buffer is not
      // written after it is freed. Errors cannot be reported from a destructor.
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
  }
  void Wait() override {
    if (req_ == MPI_REQUEST_NULL) return;
    Watchdog::Scope scope("allreduce (gradient bucket)");
    DPT_MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
    Complete();
  }
  bool Test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    DPT_MPI_CHECK(MPI_Test(&req_, &done, MPI_STATUS_IGNORE));
    if (done) Complete();
    return done != 0;
  }

 private:
  void Complete() {
    if (chunk_to_ > 0) {
      const int64_t chunk = t_.numel() / size_;
      float* p = t_.data<float>();
      std::memmove(p + chunk_to_ * chunk, p, static_cast<size_t>(chunk) * sizeof(float));
    }
    if (chunk_to_ >= 0) {
      const int64_t chunk = t_.numel() / size_;
      Tensor mine = t_.View(Shape{chunk}, static_cast<size_t>(chunk_to_ * chunk) * sizeof(float));
      ScaleForAvg(&mine, op_, size_);
    } else {
      ScaleForAvg(&t_, op_, size_);
    }
  }

  MPI_Request req_;
  Tensor t_;
  ReduceOp op_;
  int size_;
  int chunk_to_;
};

// The chunk length of an in-place reduce-scatter / all-gather of `t` over `size` ranks.
int ChunkOf(const Tensor& t, int size, const char* what) {
  DPT_CHECK(t.dtype() == DType::kF32) << what << ": f32 data only";
  DPT_CHECK(t.numel() % size == 0)
      << what << ": " << t.numel() << " values are not " << size << " equal chunks";
  const int64_t chunk = t.numel() / size;
  DPT_CHECK(chunk <= std::numeric_limits<int>::max()) << what << ": chunk of " << chunk;
  return static_cast<int>(chunk);
}

class MpiComm final : public MpiCommunicator {
 public:
  // Takes ownership of `comm` (freed on destruction).
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    DPT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    DPT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DPT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void AllReduce(Tensor* t, ReduceOp op) override {
    CheckHost(*t);
    if (t->numel() == 0) return;
    Watchdog::Scope scope("allreduce");
    DPT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, t->raw(), static_cast<int>(t->numel()),
                                MpiType(t->dtype()), MpiOp(op), comm_));
    ScaleForAvg(t, op, size_);
  }

  std::unique_ptr<CommHandle> AllReduceAsync(Tensor* t, ReduceOp op) override {
    CheckHost(*t);
    MPI_Request req = MPI_REQUEST_NULL;
    if (t->numel() > 0) {
      DPT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, t->raw(), static_cast<int>(t->numel()),
                                   MpiType(t->dtype()), MpiOp(op), comm_, &req));
    }
    return std::make_unique<MpiHandle>(req, *t, op, size_);
  }

  void Broadcast(Tensor* t, int root) override {
    CheckHost(*t);
    BroadcastHost(t->raw(), t->bytes(), root);
  }

  std::unique_ptr<CommHandle> ReduceScatterAsync(Tensor* t, ReduceOp op) override {
    CheckHost(*t);
    const int chunk = ChunkOf(*t, size_, "reduce-scatter");
    MPI_Request req = MPI_REQUEST_NULL;
    if (chunk > 0) {
      // In place: MPI reads the whole buffer and writes this rank's result at its start.
      DPT_MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, t->raw(), chunk, MPI_FLOAT, MpiOp(op),
                                              comm_, &req));
    }
    return std::make_unique<MpiHandle>(req, *t, op, size_, chunk > 0 ? rank_ : -1);
  }

  std::unique_ptr<CommHandle> AllGatherAsync(Tensor* t) override {
    CheckHost(*t);
    const int chunk = ChunkOf(*t, size_, "all-gather");
    MPI_Request req = MPI_REQUEST_NULL;
    if (chunk > 0) {
      DPT_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, t->raw(), chunk, MPI_FLOAT,
                                   comm_, &req));
    }
    return std::make_unique<MpiHandle>(req, *t, ReduceOp::kSum, size_);
  }

  void AllGather(const Tensor& in, Tensor* out) override {
    Watchdog::Scope scope("allgather");
    CheckHost(in);
    CheckHost(*out);
    DPT_CHECK(out->bytes() == in.bytes() * static_cast<size_t>(size_));
    DPT_MPI_CHECK(MPI_Allgather(in.raw(), static_cast<int>(in.bytes()), MPI_BYTE, out->raw(),
                                static_cast<int>(in.bytes()), MPI_BYTE, comm_));
  }

  void Barrier() override {
    Watchdog::Scope scope("barrier");
    DPT_MPI_CHECK(MPI_Barrier(comm_));
  }

  std::unique_ptr<MpiCommunicator> SplitMpi(int color) override {
    MPI_Comm sub = MPI_COMM_NULL;
    DPT_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, rank_, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiComm>(sub);
  }

  void AllReduceHost(double* values, int count, ReduceOp op) override {
    Watchdog::Scope scope("allreduce (metrics)");
    DPT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MpiOp(op), comm_));
    if (op == ReduceOp::kAvg) {
      for (int i = 0; i < count; ++i) values[i] /= size_;
    }
  }
  void AllReduceHost(int64_t* values, int count, ReduceOp op) override {
    Watchdog::Scope scope("allreduce (agreement)");
    DPT_CHECK(op != ReduceOp::kAvg) << "average of integers";
    DPT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_INT64_T, MpiOp(op), comm_));
  }
  void BroadcastHost(void* data, size_t bytes, int root) override {
    Watchdog::Scope scope("broadcast");
    // MPI counts are int: send large buffers in pieces.
    constexpr size_t kPiece = size_t{1} << 30;
    for (size_t off = 0; off < bytes; off += kPiece) {
      const int n = static_cast<int>(std::min(kPiece, bytes - off));
      DPT_MPI_CHECK(MPI_Bcast(static_cast<char*>(data) + off, n, MPI_BYTE, root, comm_));
    }
  }
  void GatherHost(const double* mine, int count, double* all, int root) override {
    Watchdog::Scope scope("gather (metrics)");
    DPT_MPI_CHECK(MPI_Gather(mine, count, MPI_DOUBLE, all, count, MPI_DOUBLE, root, comm_));
  }
  std::vector<std::string> AllGatherStrings(const std::string& mine) override {
    Watchdog::Scope scope("allgather (strings)");
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(static_cast<size_t>(size_));
    DPT_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_));
    std::vector<int> displs(static_cast<size_t>(size_));
    int total = 0;
    for (int i = 0; i < size_; ++i) {
      displs[static_cast<size_t>(i)] = total;
      total += lens[static_cast<size_t>(i)];
    }
    std::vector<char> all(static_cast<size_t>(std::max(total, 1)));
    DPT_MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(),
                                 MPI_CHAR, comm_));
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(size_));
    for (int i = 0; i < size_; ++i) {
      out.emplace_back(all.data() + displs[static_cast<size_t>(i)],
                       static_cast<size_t>(lens[static_cast<size_t>(i)]));
    }
    return out;
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int provided = 0;
  // MULTIPLE: the collective watchdog's monitor thread receives arrival reports while the main
  // thread is inside a collective. FUNNELED would do for everything else.
  DPT_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  // Errors come back as return codes so they become typed exceptions (and then MPI_Abort in
  // main) instead of an abort deep inside the library.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

MpiSession::~MpiSession() {
  Watchdog::Stop();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

std::unique_ptr<MpiCommunicator> MpiSession::World() {
  MPI_Comm comm = MPI_COMM_NULL;
  DPT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return std::make_unique<MpiComm>(comm);
}

void MpiSession::LocalRankAndSize(int* local_rank, int* local_size) const {
  MPI_Comm local;
  DPT_MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local));
  DPT_MPI_CHECK(MPI_Comm_rank(local, local_rank));
  DPT_MPI_CHECK(MPI_Comm_size(local, local_size));
  MPI_Comm_free(&local);
}

bool MpiSession::Initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void MpiSession::Abort(int code) {
  if (Initialized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::string MpiSession::LibraryVersion() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, static_cast<size_t>(len));
  const auto nl = s.find_first_of(",\n");
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace dptrain
