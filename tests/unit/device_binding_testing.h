// SPDX-License-Identifier: Apache-2.0
// Shared by the device-binding tests (device_binding_test.cc, device_binding_launch_test.cc):
// GPU ids, a BindingRequest builder and the message of an expected ConfigError.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "core/error.h"
#include "launcher/binding_policy.h"

namespace dptrain {
namespace {

inline const std::string kUuidA = "GPU-8f6c1a2e-1111-2222-3333-444455556666";
inline const std::string kUuidB = "GPU-0b1d2c3e-aaaa-bbbb-cccc-ddddeeeeffff";
inline const std::string kUuidC = "GPU-77aa88bb-0000-1111-2222-333344445555";
inline const std::string kMigA = "MIG-4f2b7c1d-1234-5678-9abc-def012345678";
inline const std::string kMigB = "MIG-9e8d7c6b-1234-5678-9abc-def012345678";

inline BindingRequest Request(int local_rank, int local_size, std::optional<std::string> visible,
                              std::optional<int> count = 4, std::string gpus = "",
                              BindingPolicy policy = BindingPolicy::kRemap) {
  BindingRequest r;
  r.local_rank = local_rank;
  r.local_size = local_size;
  r.cuda_visible_devices = std::move(visible);
  r.device_count = count;
  r.gpus = std::move(gpus);
  r.policy = policy;
  return r;
}

// The message of the ConfigError that `fn` throws ("" and a test failure when it throws none).
template <class F>
std::string ErrorOf(F&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

}  // namespace
}  // namespace dptrain
