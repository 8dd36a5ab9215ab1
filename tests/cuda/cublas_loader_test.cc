// SPDX-License-Identifier: Apache-2.0
// cuBLAS is loaded on first use, not at startup (core/cuda/cublas_loader.h): no GPU needed, so
// label unit with the CUDA backend's other rules.
#include "core/cuda/cublas_loader.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/cuda/cuda_check.h"

namespace dptrain::cuda {
namespace {

bool Mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(library) != std::string::npos) return true;
  }
  return false;
}

// Taken before main(), after every linked library is mapped and initialised.
const bool kCublasAtStart = Mapped("libcublas");

TEST(CublasLoaderTest, NotLoadedAtStartupThenLoadedOnFirstUse) {
  EXPECT_FALSE(kCublasAtStart) << "a linked libcublas/libcublasLt: ~0.4 s of every process start";
  std::string why;
  const CublasApi* api = TryCublas(&why);
  if (api == nullptr) GTEST_SKIP() << "no cuBLAS library on this machine: " << why;
  int major = 0;
  ASSERT_EQ(api->get_property(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(major, CUBLAS_VER_MAJOR);
  EXPECT_TRUE(Mapped("libcublas.so"));
  EXPECT_EQ(&Cublas(), api) << "loaded once";
  for (auto* fn :
       {reinterpret_cast<void*>(api->create), reinterpret_cast<void*>(api->destroy),
        reinterpret_cast<void*>(api->set_stream), reinterpret_cast<void*>(api->set_math_mode),
        reinterpret_cast<void*>(api->set_workspace), reinterpret_cast<void*>(api->gemm_ex),
        reinterpret_cast<void*>(api->status_name), reinterpret_cast<void*>(api->status_string)}) {
    EXPECT_NE(fn, nullptr);
  }
  // Error text comes from the loaded library.
  EXPECT_EQ(detail::CublasStatusText(CUBLAS_STATUS_NOT_INITIALIZED)
                .rfind("CUBLAS_STATUS_NOT_INITIALIZED: ", 0),
            0u)
      << detail::CublasStatusText(CUBLAS_STATUS_NOT_INITIALIZED);
}

}  // namespace
}  // namespace dptrain::cuda
