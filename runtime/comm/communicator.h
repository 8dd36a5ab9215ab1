// SPDX-License-Identifier: Apache-2.0
// The communication seams, in one place: MPI for agreements (ControlPlane), NCCL or MPI for
// gradients (Communicator). Every rank must call every collective in the same order with the
// same sizes; calls block unless named *Async.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dptrain {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax, kMin };

// A collective in flight. Wait() blocks until it completes (and rethrows its failure); Test()
// advances it without blocking and says whether it is done.
class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual void Wait() = 0;
  virtual bool Test() = 0;
};

// The control plane: agreements between ranks on small host values (failures, stop signals,
// metrics, bootstrap data). Always MPI (MpiCommunicator), whatever carries the gradients.
class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void AllReduceHost(double* values, int count, ReduceOp op) = 0;
  virtual void AllReduceHost(int64_t* values, int count, ReduceOp op) = 0;
  virtual void BroadcastHost(void* data, size_t bytes, int root) = 0;
  // Every rank's string, indexed by rank.
  virtual std::vector<std::string> AllGatherStrings(const std::string& mine) = 0;
  // `count` values from every rank into `all` on `root` (size() * count values, rank r's at
  // r * count; `all` is not touched on other ranks and may be null there).
  virtual void GatherHost(const double* mine, int count, double* all, int root) = 0;
  virtual void Barrier() = 0;

  // Convenience: true on every rank iff `ok` on every rank.
  bool AllTrue(bool ok);
};

// Tensor collectives (gradient buckets, parameter broadcasts) on the backend's memory: MPI on
// host memory for the CPU backend, NCCL on device memory for the CUDA backend
// (runtime/comm/device_communicator.h picks).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "nccl"

  // In-place reductions of f32, i32 or f64 data (tensor dtype).
  virtual void AllReduce(Tensor* t, ReduceOp op) = 0;
  virtual std::unique_ptr<CommHandle> AllReduceAsync(Tensor* t, ReduceOp op) = 0;
  virtual void Broadcast(Tensor* t, int root) = 0;
  // out has size() times in's elements; rank r's data lands at r * in.numel().
  virtual void AllGather(const Tensor& in, Tensor* out) = 0;

  // Sharded data parallelism (dist.shard), in place on f32 data whose length is size() chunks:
  // ReduceScatterAsync leaves in chunk rank() the reduction of every rank's chunk rank() (the
  // other chunks hold unspecified values afterwards); AllGatherAsync copies every rank's chunk
  // rank() into that chunk on every rank.
  virtual std::unique_ptr<CommHandle> ReduceScatterAsync(Tensor* t, ReduceOp op) = 0;
  virtual std::unique_ptr<CommHandle> AllGatherAsync(Tensor* t) = 0;

  // A communicator over the ranks that pass the same `color` (ordered by rank); nullptr for
  // ranks that pass a negative color. Collective over this communicator.
  virtual std::unique_ptr<Communicator> Split(int color) = 0;
};

// MPI carries both planes: the control plane always, and the tensor collectives on host memory.
// What MpiSession::World (runtime/comm/mpi_communicator.h) returns.
class MpiCommunicator : public ControlPlane, public Communicator {
 public:
  int rank() const override = 0;
  int size() const override = 0;
  // Split of both planes; nullptr for a negative color. Collective.
  virtual std::unique_ptr<MpiCommunicator> SplitMpi(int color) = 0;
  std::unique_ptr<Communicator> Split(int color) final { return SplitMpi(color); }
};

}  // namespace dptrain
