// SPDX-License-Identifier: Apache-2.0
// cuBLAS through dlopen (cublas_loader.h says why).
#include "core/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace dptrain::cuda {
namespace {

const std::string& LibraryName() {
  static const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  return name;
}

struct Loaded {
  CublasApi api;
  std::string why;  // empty when loaded
};

template <class Fn>
bool Resolve(void* lib, const char* name, Fn* fn, std::string* why) {
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr && why->empty()) *why = LibraryName() + " has no " + name;
  return *fn != nullptr;
}

Loaded Load() {
  Loaded r;
  // RTLD_LOCAL: its symbols stay out of the global namespace (nothing else resolves against
  // them). Never unloaded: handles created from it live as long as the backend.
  void* lib = dlopen(LibraryName().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    r.why = err != nullptr ? err : LibraryName();
    return r;
  }
  CublasApi& a = r.api;
  std::string* why = &r.why;
  // The symbol names behind cublas_v2.h's macros (cublasCreate -> cublasCreate_v2, ...).
  Resolve(lib, "cublasCreate_v2", &a.create, why);
  Resolve(lib, "cublasDestroy_v2", &a.destroy, why);
  Resolve(lib, "cublasSetStream_v2", &a.set_stream, why);
  Resolve(lib, "cublasSetMathMode", &a.set_math_mode, why);
  Resolve(lib, "cublasSetWorkspace_v2", &a.set_workspace, why);
  Resolve(lib, "cublasGemmEx", &a.gemm_ex, why);
  Resolve(lib, "cublasGetProperty", &a.get_property, why);
  Resolve(lib, "cublasGetStatusName", &a.status_name, why);
  Resolve(lib, "cublasGetStatusString", &a.status_string, why);
  return r;
}

const Loaded& Library() {
  static const Loaded loaded = Load();  // thread-safe, once
  return loaded;
}

}  // namespace

const CublasApi* TryCublas(std::string* why) {
  const Loaded& l = Library();
  if (!l.why.empty()) {
    if (why != nullptr) *why = l.why;
    return nullptr;
  }
  return &l.api;
}

const CublasApi& Cublas() {
  std::string why;
  const CublasApi* api = TryCublas(&why);
  if (api == nullptr) {
    DPT_THROW(UnsupportedError) << "the CUDA backend cannot load cuBLAS (" << why
                                << "); it needs the cuBLAS library of "
                                << "CUDA " << CUBLAS_VER_MAJOR << " (" << LibraryName()
                                << ", as in NVIDIA's CUDA runtime "
                                << "images): install it, or add its directory to LD_LIBRARY_PATH";
  }
  return *api;
}

}  // namespace dptrain::cuda
