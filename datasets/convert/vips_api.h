// SPDX-License-Identifier: Apache-2.0
// libvips through dlopen. Only `convert --from imagefolder` resizes with it, and linking it
// would load its ~100 shared libraries (GLib, GIO, librsvg, libtiff, poppler, GnuTLS, ...) into
// every dptrain process: every rank of every training run, every `dptrain --version`. Here that
// was about 40 ms of each start; from a network file system, 100 libraries per rank is a
// metadata storm at scale. The headers give the types and the exact signatures (decltype), so a
// mismatch is a compile error, not a crash.
#pragma once

#include <vips/vips.h>
// After vips.h (it needs its types): vips_vector_set_enabled.
#include <vips/vector.h>

#include <string>

namespace dptrain {

// The libvips (and GLib) functions the converter calls; the names are libvips' own.
struct VipsApi {
  decltype(&::vips_init) init;
  decltype(&::vips_version_string) version_string;
  decltype(&::vips_error_buffer) error_buffer;
  decltype(&::vips_error_buffer_copy) error_buffer_copy;
  decltype(&::vips_cache_set_max) cache_set_max;
  decltype(&::vips_concurrency_set) concurrency_set;
  decltype(&::vips_vector_set_enabled) vector_set_enabled;
  decltype(&::vips_image_new_from_memory) image_new_from_memory;
  decltype(&::vips_image_write_to_memory) image_write_to_memory;
  decltype(&::vips_reduce) reduce;              // variadic: options end with nullptr
  decltype(&::vips_affine) affine;              // variadic
  decltype(&::vips_extract_area) extract_area;  // variadic
  decltype(&::vips_array_int_new) array_int_new;
  decltype(&::vips_area_unref) area_unref;
  decltype(&::vips_interpolate_bilinear_static) interpolate_bilinear_static;
  decltype(&::g_object_unref) object_unref;  // GObject and GLib, reached through libvips
  decltype(&::g_free) free;
};

// The shared library's name: libvips.so.<current - age> of the headers built against (42).
const std::string& VipsLibraryName();

// libvips' functions, loaded on the first call (thread-safe, never unloaded); nullptr with the
// reason in *why (dlerror's text, or the missing symbol) when it cannot be loaded.
const VipsApi* TryVips(std::string* why);

// As TryVips, throwing UnsupportedError (exit 2) that names the library and the package to
// install.
const VipsApi& Vips();

}  // namespace dptrain
