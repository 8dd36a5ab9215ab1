// SPDX-License-Identifier: Apache-2.0
// Routes each collective by the device its tensor lives on.
#include "runtime/comm/routing_communicator.h"

#include "core/error.h"

namespace dptrain {

RoutingCommunicator::RoutingCommunicator(Communicator& host, Communicator& device)
    : host_(host), device_(device) {
  DPT_CHECK(host.rank() == device.rank() && host.size() == device.size())
      << "host communicator rank " << host.rank() << "/" << host.size() << " vs device "
      << device.rank() << "/" << device.size();
}

RoutingCommunicator::RoutingCommunicator(std::unique_ptr<Communicator> host,
                                         std::unique_ptr<Communicator> device)
    : owned_host_(std::move(host)),
      owned_device_(std::move(device)),
      host_(*owned_host_),
      device_(*owned_device_) {}

std::string RoutingCommunicator::name() const { return host_.name() + "+" + device_.name(); }

Communicator& RoutingCommunicator::For(const Tensor& t) {
  DPT_CHECK(t.defined()) << "collective on an undefined tensor";
  return t.device() == Device::kCpu ? host_ : device_;
}

void RoutingCommunicator::AllGather(const Tensor& in, Tensor* out) {
  DPT_CHECK(in.device() == out->device()) << "allgather between host and device memory";
  For(in).AllGather(in, out);
}

std::unique_ptr<Communicator> RoutingCommunicator::Split(int color) {
  std::unique_ptr<Communicator> host = host_.Split(color);
  std::unique_ptr<Communicator> device = device_.Split(color);
  DPT_CHECK((host == nullptr) == (device == nullptr)) << "split: host and device disagree";
  if (host == nullptr) return nullptr;
  return std::make_unique<RoutingCommunicator>(std::move(host), std::move(device));
}

}  // namespace dptrain
