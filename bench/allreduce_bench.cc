// SPDX-License-Identifier: Apache-2.0
// Gradient allreduce: dptrain's Reducer (bucketed, asynchronous) against a bare collective of the
// same bytes; rank 0 prints one line per size with the algorithm, time and bus bandwidth
// (nccl-tests' convention: busbw = 2 (n-1)/n x bytes / time; algbw = bytes / time).
//   mpirun -np N allreduce_bench                 host memory over MPI (MPI_Allreduce vs the
//                                                Reducer's MPI_Iallreduce), the reference CNN's
//                                                gradient (1.69 MB) and a few other sizes
//   mpirun -np N allreduce_bench --device cuda   GPU memory over NCCL (one GPU per rank: set
//                                                CUDA_VISIBLE_DEVICES per local rank, as
//                                                bench/gpu.sh does), gradient sizes of ref_cnn,
//                                                a 25 MB bucket, resnet18 and resnet50
// Times are wall times of blocking calls (median of 20 after 5 warm-ups, every rank starting
// together after a barrier). nccl-tests times back-to-back launches with CUDA events, so for small
// messages its bandwidths are higher than these by what a blocking call adds.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "core/backend_registry.h"
#include "runtime/comm/device_communicator.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/reducer.h"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// NCCL on GPU memory: the bare collective (Communicator::AllReduce, blocking) and the Reducer's
// 25 MB buckets over it, as training runs them.
int DeviceBench(dptrain::MpiCommunicator& comm) {
  using namespace dptrain;
  std::string why;
  int64_t ok = BackendAvailable("cuda", &why) ? 1 : 0;
  comm.AllReduceHost(&ok, 1, ReduceOp::kMin);  // every rank skips, or none
  if (ok == 0) {
    if (comm.rank() == 0) {
      std::printf("allreduce_bench --device cuda: skipped, a rank has no GPU (%s)\n",
                  why.empty() ? "another rank" : why.c_str());
    }
    return 0;
  }
  Backend& be = GetBackend("cuda");
  const auto dev = CreateDeviceCommunicator(be, comm, 300.0);
  const int n = dev->size();
  const double factor = 2.0 * (n - 1) / n;
  if (comm.rank() == 0) {
    std::printf("%-10s %12s %14s %12s %12s %12s %10s\n", "what", "bytes", "algorithm", "time_us",
                "algbw_GB/s", "busbw_GB/s", "ratio");
  }
  // ref_cnn, one 25 MB bucket, resnet18 (11.2 M parameters), resnet50 (25.6 M).
  for (int64_t count : {int64_t{421888}, int64_t{25} << 18, int64_t{11181642}, int64_t{25557032}}) {
    Tensor g = be.Zeros(Shape{count}, DType::kF32, "grads");
    constexpr int kWarm = 5, kIters = 20;
    std::vector<double> bare, reducer;
    Reducer red(*dev, g, size_t{25} << 20);
    for (int it = 0; it < kWarm + kIters; ++it) {
      be.Synchronize();
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = std::chrono::steady_clock::now();
      dev->AllReduce(&g, ReduceOp::kSum);
      const double b = Seconds(t0);
      be.Synchronize();
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = std::chrono::steady_clock::now();
      red.Begin();
      red.Finish();
      be.Synchronize();
      const double r = Seconds(t0);
      if (it >= kWarm) {
        bare.push_back(b);
        reducer.push_back(r);
      }
    }
    if (comm.rank() == 0) {
      const double bytes = static_cast<double>(count) * 4;
      const double tb = Median(bare), tr = Median(reducer);
      // One rank moves nothing between GPUs: no bus bandwidth to speak of.
      const auto busbw = [&](double t) {
        char buf[32] = "-";
        if (n > 1) std::snprintf(buf, sizeof buf, "%.2f", factor * bytes / t * 1e-9);
        return std::string(buf);
      };
      std::printf("%-10s %12.0f %14s %12.1f %12.2f %12s %10s\n", "bare", bytes, "ncclAllReduce",
                  tb * 1e6, bytes / tb * 1e-9, busbw(tb).c_str(), "1.00");
      std::printf("%-10s %12.0f %14s %12.1f %12.2f %12s %10.2f\n", "reducer", bytes,
                  "25 MB buckets", tr * 1e6, bytes / tr * 1e-9, busbw(tr).c_str(), tr / tb);
    }
  }
  if (comm.rank() == 0 && n == 1) {
    std::printf("(one rank: NCCL copies in place, no bus bandwidth; run with 2 or more GPUs)\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dptrain;
  MpiSession mpi(&argc, &argv);
  auto comm = mpi.World();
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--device") device = argv[i + 1];
  }
  if (device == "cuda") {
    try {
      const int rc = DeviceBench(*comm);
      comm.reset();
      return rc;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
      MpiSession::Abort(1);
    }
  }
  Backend& be = GetBackend("cpu");
  const int n = comm->size();
  if (comm->rank() == 0) {
    std::printf("%-10s %12s %14s %12s %12s %10s\n", "what", "bytes", "algorithm", "time_us",
                "busbw_GB/s", "ratio");
  }
  for (int64_t count : {int64_t{421888}, int64_t{1} << 16, int64_t{4} << 20}) {
    Tensor g = be.Zeros(Shape{count}, DType::kF32, "grads");
    std::vector<float> raw(static_cast<size_t>(count), 1.f);
    constexpr int kIters = 60;
    std::vector<double> bare, reducer;
    for (int it = 0; it < kIters + 5; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto t0 = std::chrono::steady_clock::now();
      MPI_Allreduce(MPI_IN_PLACE, raw.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      const double b = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      MPI_Barrier(MPI_COMM_WORLD);
      Reducer red(*comm, g, size_t{25} << 20);
      t0 = std::chrono::steady_clock::now();
      red.Begin();
      red.Finish();
      const double r = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (it >= 5) {
        bare.push_back(b);
        reducer.push_back(r);
      }
    }
    if (comm->rank() == 0) {
      const double bytes = static_cast<double>(count) * 4;
      const double factor = 2.0 * (n - 1) / n;
      const double tb = Median(bare), tr = Median(reducer);
      std::printf("%-10s %12.0f %14s %12.1f %12.2f %10s\n", "bare", bytes, "MPI_Allreduce",
                  tb * 1e6, factor * bytes / tb * 1e-9, "1.00");
      std::printf("%-10s %12.0f %14s %12.1f %12.2f %10.2f\n", "reducer", bytes, "MPI_Iallreduce",
                  tr * 1e6, factor * bytes / tr * 1e-9, tr / tb);
    }
  }
  comm.reset();
  return 0;
}
