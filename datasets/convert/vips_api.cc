// SPDX-License-Identifier: Apache-2.0
// libvips through dlopen (vips_api.h says why).
#include "datasets/convert/vips_api.h"

#include <dlfcn.h>

#include "core/error.h"
#include "datasets/convert/convert.h"

namespace dptrain {
namespace {

struct Loaded {
  VipsApi api{};
  std::string why;  // empty when loaded
};

template <class Fn>
void Resolve(void* lib, const char* name, Fn* fn, std::string* why) {
  // dlsym on the handle also searches its dependencies: g_free is GLib's, g_object_unref
  // GObject's.
  *fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (*fn == nullptr && why->empty()) {
    *why = VipsLibraryName() +
           " is older than the libvips " VIPS_VERSION
           " headers dptrain was built with: it has no " +
           std::string(name);
  }
}

Loaded Load() {
  Loaded r;
  // RTLD_LOCAL: nothing else resolves against its symbols. Never unloaded: GLib keeps threads
  // and type registrations that outlive any handle.
  void* lib = dlopen(VipsLibraryName().c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    r.why = err != nullptr ? err : VipsLibraryName();
    return r;
  }
  VipsApi& a = r.api;
  std::string* why = &r.why;
  Resolve(lib, "vips_init", &a.init, why);
  Resolve(lib, "vips_version_string", &a.version_string, why);
  Resolve(lib, "vips_error_buffer", &a.error_buffer, why);
  Resolve(lib, "vips_error_buffer_copy", &a.error_buffer_copy, why);
  Resolve(lib, "vips_cache_set_max", &a.cache_set_max, why);
  Resolve(lib, "vips_concurrency_set", &a.concurrency_set, why);
  Resolve(lib, "vips_vector_set_enabled", &a.vector_set_enabled, why);
  Resolve(lib, "vips_image_new_from_memory", &a.image_new_from_memory, why);
  Resolve(lib, "vips_image_write_to_memory", &a.image_write_to_memory, why);
  Resolve(lib, "vips_reduce", &a.reduce, why);
  Resolve(lib, "vips_affine", &a.affine, why);
  Resolve(lib, "vips_extract_area", &a.extract_area, why);
  Resolve(lib, "vips_array_int_new", &a.array_int_new, why);
  Resolve(lib, "vips_area_unref", &a.area_unref, why);
  Resolve(lib, "vips_interpolate_bilinear_static", &a.interpolate_bilinear_static, why);
  Resolve(lib, "g_object_unref", &a.object_unref, why);
  Resolve(lib, "g_free", &a.free, why);
  return r;
}

}  // namespace

const std::string& VipsLibraryName() {
  static const std::string name =
      "libvips.so." + std::to_string(VIPS_LIBRARY_CURRENT - VIPS_LIBRARY_AGE);
  return name;
}

const VipsApi* TryVips(std::string* why) {
  static const Loaded loaded = Load();  // thread-safe, once
  if (!loaded.why.empty()) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

const VipsApi& Vips() {
  std::string why;
  const VipsApi* api = TryVips(&why);
  if (api == nullptr) {
    DPT_THROW(UnsupportedError) << "convert --from imagefolder resizes with libvips and cannot "
                                << "load it (" << why << "): install libvips " VIPS_VERSION
                                << " or later as " << VipsLibraryName()
                                << " (Debian/Ubuntu: libvips42, libvips42t64 from Ubuntu 24.04 "
                                << "on), or add its directory to LD_LIBRARY_PATH";
  }
  return *api;
}

std::string VipsLibraryVersion() {
  std::string why;
  const VipsApi* api = TryVips(&why);
  if (api == nullptr) return "not loadable (" + why + ")";
  return api->version_string();
}

}  // namespace dptrain
