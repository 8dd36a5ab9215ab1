// SPDX-License-Identifier: Apache-2.0
// Gradient allreduce: dptrain's Reducer (bucketed, asynchronous) against a bare MPI_Allreduce of
// the same bytes, for the reference CNN's gradient (421,888 floats = 1.69 MB) and a few other
// sizes. Run under mpirun with >= 2 ranks; rank 0 prints one line per size with the algorithm,
// time and bus bandwidth (nccl-tests convention: 2 (n-1)/n x bytes / time).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/backend_registry.h"
#include "runtime/comm/mpi_communicator.h"
#include "runtime/comm/reducer.h"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dptrain;
  MpiSession mpi(&argc, &argv);
  auto comm = mpi.World();
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
