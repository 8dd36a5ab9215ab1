// SPDX-License-Identifier: Apache-2.0
// One Communicator over two: collectives on host tensors go to the host communicator (MPI), on
// device tensors to the device communicator (NCCL), and every host-side control-plane call goes
// to the host communicator. Lets code written against a single Communicator (the trainer, the
// Reducer) run unchanged on GPUs: gradient buckets and parameter broadcasts are device tensors
// and take NCCL, agreements between ranks stay on MPI.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace dptrain {

class RoutingCommunicator final : public Communicator {
 public:
  // Both must span the same ranks in the same order and outlive this object (unless owned: the
  // communicators Split returns own theirs).
  RoutingCommunicator(Communicator& host, Communicator& device);
  RoutingCommunicator(std::unique_ptr<Communicator> host, std::unique_ptr<Communicator> device);

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override;  // "mpi+nccl"

  void AllReduce(Tensor* t, ReduceOp op) override { For(*t).AllReduce(t, op); }
  std::unique_ptr<CommHandle> AllReduceAsync(Tensor* t, ReduceOp op) override {
    return For(*t).AllReduceAsync(t, op);
  }
  void Broadcast(Tensor* t, int root) override { For(*t).Broadcast(t, root); }
  void AllGather(const Tensor& in, Tensor* out) override;
  void Barrier() override { host_.Barrier(); }

  void AllReduceHost(double* values, int count, ReduceOp op) override {
    host_.AllReduceHost(values, count, op);
  }
  void AllReduceHost(int64_t* values, int count, ReduceOp op) override {
    host_.AllReduceHost(values, count, op);
  }
  void BroadcastHost(void* data, size_t bytes, int root) override {
    host_.BroadcastHost(data, bytes, root);
  }
  std::vector<std::string> AllGatherStrings(const std::string& mine) override {
    return host_.AllGatherStrings(mine);
  }
  // Splits both (collective over both, in that order).
  std::unique_ptr<Communicator> Split(int color) override;

 private:
  Communicator& For(const Tensor& t);

  std::unique_ptr<Communicator> owned_host_, owned_device_;
  Communicator& host_;
  Communicator& device_;
};

}  // namespace dptrain
