// SPDX-License-Identifier: Apache-2.0
// JPEG/PNG class folders (torchvision ImageFolder) -> dataset HDF5 shards: list in torchvision's
// order, decode (libjpeg-turbo, libpng) and resize (libvips) on a pool of threads,
// store in order one shard at a time through Hdf5Writer's row writes (a shard is never whole
// in RAM), each shard published by rename only when complete.
#include <fcntl.h>
#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/hdf5/hdf5_util.h"
#include "core/util/input_file.h"
#include "core/util/strings.h"
#include "datasets/convert/convert.h"
#include "datasets/convert/vips_api.h"
#include "datasets/dataset.h"
#include "datasets/hdf5_writer.h"

namespace dptrain {
namespace {

namespace fs = std::filesystem;

// PIL refuses images above twice Image.MAX_IMAGE_PIXELS (DecompressionBombError); so do we,
// which also bounds the decode buffer of an untrusted header.
constexpr int64_t kMaxPixels = 2 * int64_t{89478485};
constexpr int64_t kMaxSize = 16384;

// ---- listing ----

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// torchvision's IMG_EXTENSIONS: a file with one of them is a sample.
bool IsImageName(const std::string& name) {
  const std::string l = Lower(name);
  for (const char* ext :
       {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}) {
    if (EndsWith(l, ext)) return true;
  }
  return false;
}

bool IsValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(len) > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    const uint32_t min_cp = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

bool IsDir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);  // follows symlinks, as os.scandir's is_dir() and os.walk
}

// One class folder in os.walk(followlinks=True) order after torchvision's sorted(): directories
// by path, files by name within each. Appends "class/sub/file" names and sizes.
void WalkClass(const fs::path& root, const std::string& cls, std::vector<std::string>* files,
               std::vector<int64_t>* bytes) {
  std::vector<std::pair<std::string, std::vector<std::string>>> dirs;  // (relative dir, files)
  std::set<fs::path> seen;  // canonical paths: a symlink loop is walked once
  std::vector<std::string> todo = {""};
  while (!todo.empty()) {
    const std::string rel = todo.back();
    todo.pop_back();
    const fs::path here = rel.empty() ? root : root / rel;
    std::error_code ec;
    const fs::path canon = fs::canonical(here, ec);
    if (ec || !seen.insert(canon).second) continue;
    std::vector<std::string> names;
    fs::directory_iterator it(here, ec);
    if (ec) DPT_THROW(IoError) << here.string() << ": cannot list: " << ec.message();
    for (const fs::directory_entry& e : it) {
      const std::string name = e.path().filename().string();
      if (IsDir(e.path())) {
        todo.push_back(rel.empty() ? name : rel + "/" + name);
      } else if (IsImageName(name)) {
        names.push_back(name);
      }
    }
    std::sort(names.begin(), names.end());
    dirs.emplace_back(rel, std::move(names));
  }
  std::sort(dirs.begin(), dirs.end());
  for (const auto& [rel, names] : dirs) {
    for (const std::string& name : names) {
      const std::string f = cls + "/" + (rel.empty() ? name : rel + "/" + name);
      std::error_code ec;
      const auto size = fs::file_size(root.parent_path() / f, ec);
      files->push_back(f);
      bytes->push_back(ec ? -1 : static_cast<int64_t>(size));
    }
  }
}

// ---- decoding: whole file in memory -> RGB, HWC ----

// Why an image cannot be used; caught per image (never leaves this file).
struct BadImage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Rgb {
  int64_t w = 0, h = 0;
  std::vector<uint8_t> px;  // h * w * 3
};

std::vector<uint8_t> ReadFile(const std::string& path) {
  // A FIFO named like an image would block the reading worker for good.
  std::vector<uint8_t> buf;
  if (const std::string why = ReadInputFile(path, "a JPEG or PNG file", &buf); !why.empty()) {
    throw BadImage(why);
  }
  return buf;
}

void CheckPixels(int64_t w, int64_t h) {
  if (w <= 0 || h <= 0) throw BadImage("empty image");
  if (w * h > kMaxPixels) {
    throw BadImage(std::to_string(w) + " x " + std::to_string(h) + " pixels is more than " +
                   std::to_string(kMaxPixels) + " (PIL's decompression-bomb limit)");
  }
}

struct TjHandle {
  tjhandle h = tjInitDecompress();
  TjHandle() = default;
  ~TjHandle() {
    if (h != nullptr) tjDestroy(h);
  }
  TjHandle(const TjHandle&) = delete;
  TjHandle& operator=(const TjHandle&) = delete;
};

Rgb DecodeJpeg(const std::vector<uint8_t>& buf) {
  // One handle per image: a handle is not thread-safe, and after a failed header read
  // libjpeg-turbo 2.1 may report the next image of the same handle as 0 x 0.
  TjHandle tj;
  if (tj.h == nullptr) throw BadImage("cannot initialise libjpeg-turbo");
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.h, buf.data(), buf.size(), &w, &h, &subsamp, &colorspace) != 0) {
    throw BadImage(std::string("corrupt JPEG header: ") + tjGetErrorStr2(tj.h));
  }
  CheckPixels(w, h);
  // Warnings (corrupt data, premature end of file: libjpeg fills the rest with grey) stop the
  // decode and count as errors; scans are limited against progressive-JPEG denial of service.
  const int flags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const int channels = cmyk ? 4 : 3;
  std::vector<uint8_t> px(static_cast<size_t>(w) * static_cast<size_t>(h) * channels);
  if (tjDecompress2(tj.h, buf.data(), buf.size(), px.data(), w, 0, h, cmyk ? TJPF_CMYK : TJPF_RGB,
                    flags) != 0) {
    const bool warning = tjGetErrorCode(tj.h) == TJERR_WARNING;
    throw BadImage(std::string(warning ? "corrupt JPEG data: " : "cannot decode JPEG: ") +
                   tjGetErrorStr2(tj.h));
  }
  Rgb out{w, h, {}};
  if (!cmyk) {
    out.px = std::move(px);  // greyscale is replicated to RGB by libjpeg, as PIL's convert
    return out;
  }
  // PIL reads every 4-channel JPEG as Adobe-inverted CMYK ("CMYK;I") and converts CMYK to RGB
  // as r = nk - c * nk / 255 with nk = 255 - k (Pillow's cmyk2rgb, same rounding).
  out.px.resize(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  auto muldiv255 = [](int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (size_t i = 0, n = static_cast<size_t>(w) * static_cast<size_t>(h); i < n; ++i) {
    const uint8_t* p = px.data() + 4 * i;
    const int nk = p[3];  // 255 - (255 - stored k)
    for (int c = 0; c < 3; ++c) {
      const int v = nk - muldiv255(255 - p[c], nk);
      out.px[3 * i + static_cast<size_t>(c)] = static_cast<uint8_t>(std::clamp(v, 0, 255));
    }
  }
  return out;
}

// libpng reports errors by longjmp: the functions with setjmp below hold only trivially
// destructible locals, and every C++ object lives in their caller.
struct PngSource {
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  char error[256] = {};
};

void PngReadFn(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "truncated file (unexpected end of data)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

void PngErrorFn(png_structp png, png_const_charp msg) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->error, sizeof src->error, "%s", msg);
  png_longjmp(png, 1);
}

// Warnings are about ancillary chunks (colour profiles, text): the pixels are intact.
void PngWarningFn(png_structp /*png*/, png_const_charp /*msg*/) {}

bool PngReadHeader(png_structp png, png_infop info, png_uint_32* w, png_uint_32* h, int* channels,
                   size_t* rowbytes) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  // Palette -> RGB (with alpha when tRNS is present), 1/2/4-bit grey -> 8-bit (x 255/(2^d - 1),
  // as PIL), 16-bit -> the high byte. Grey/alpha channels are handled by the caller.
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  *w = png_get_image_width(png, info);
  *h = png_get_image_height(png, info);
  *channels = png_get_channels(png, info);
  *rowbytes = png_get_rowbytes(png, info);
  return png_get_bit_depth(png, info) == 8;
}

bool PngReadRows(png_structp png, png_infop info, png_bytep* rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  png_read_end(png, info);  // the last CRC and the zlib checksum: a truncated file fails here
  return true;
}

Rgb DecodePng(const std::vector<uint8_t>& buf) {
  PngSource src;
  src.data = buf.data();
  src.size = buf.size();
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, PngErrorFn, PngWarningFn);
  if (png == nullptr) throw BadImage("cannot initialise libpng");
  png_infop info = png_create_info_struct(png);
  struct Guard {
    png_structp* png;
    png_infop* info;
    ~Guard() { png_destroy_read_struct(png, info, nullptr); }
  } guard{&png, &info};
  if (info == nullptr) throw BadImage("cannot initialise libpng");
  png_set_read_fn(png, &src, PngReadFn);
  png_uint_32 w = 0, h = 0;
  int channels = 0;
  size_t rowbytes = 0;
  if (!PngReadHeader(png, info, &w, &h, &channels, &rowbytes)) {
    throw BadImage(std::string("corrupt PNG: ") + (src.error[0] ? src.error : "bad bit depth"));
  }
  CheckPixels(w, h);
  if (channels < 1 || channels > 4 || rowbytes != static_cast<size_t>(w) * channels) {
    throw BadImage("unsupported PNG layout (" + std::to_string(channels) + " channels)");
  }
  std::vector<uint8_t> px(rowbytes * h);
  std::vector<png_bytep> rows(h);
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = px.data() + rowbytes * y;
  if (!PngReadRows(png, info, rows.data())) {
    throw BadImage(std::string("corrupt PNG: ") + src.error);
  }
  // PIL's convert("RGB"): grey replicated, alpha dropped (not composited).
  Rgb out{w, h, {}};
  if (channels == 3) {
    out.px = std::move(px);
    return out;
  }
  out.px.resize(static_cast<size_t>(w) * h * 3);
  for (size_t i = 0, n = static_cast<size_t>(w) * h; i < n; ++i) {
    const uint8_t* p = px.data() + i * static_cast<size_t>(channels);
    uint8_t* q = out.px.data() + 3 * i;
    if (channels <= 2) {
      q[0] = q[1] = q[2] = p[0];
    } else {
      q[0] = p[0];
      q[1] = p[1];
      q[2] = p[2];
    }
  }
  return out;
}

Rgb Decode(const std::string& path) {
  const std::vector<uint8_t> buf = ReadFile(path);
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (buf.size() >= 3 && buf[0] == 0xff && buf[1] == 0xd8 && buf[2] == 0xff) return DecodeJpeg(buf);
  if (buf.size() >= 8 && std::memcmp(buf.data(), kPng, 8) == 0) return DecodePng(buf);
  if (buf.empty()) throw BadImage("empty file");
  throw BadImage("not a JPEG or PNG file (dptrain decodes these two formats)");
}

// libvips, once per process: no operation cache (it would keep references to our pixel
// buffers), one thread per pipeline (our pool runs one pipeline per worker), and no ORC
// vector programs: freeing them from several threads at once corrupts liborc's code memory
// (Debian 12's liborc 0.4.33; "double free or corruption", about one `convert` in 20 on 2 busy
// cores; AddressSanitizer: SEGV in orc_code_free under vips_vector_free). The plain C kernels
// were as fast here (360 images at --size 40: 0.34-0.41 s against 0.41-0.45 s) and closer to
// PIL (worst mean |dptrain - PIL| 0.56/255 against 0.73/255 in integration.imagefolder_convert).
void InitVips() {
  const VipsApi& v = Vips();  // loads it: throws naming the library when it is missing
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [&v] {
    ok = v.init("dptrain") == 0;
    if (ok) {
      v.cache_set_max(0);
      v.concurrency_set(1);
      v.vector_set_enabled(FALSE);
    }
  });
  if (!ok) DPT_THROW(InternalError) << "cannot initialise libvips: " << v.error_buffer();
}

// Owns a VipsImage reference.
struct VipsRef {
  VipsImage* p = nullptr;
  const VipsApi* api = TryVips(nullptr);  // loaded before any image is made (InitVips)
  VipsRef() = default;
  ~VipsRef() {
    if (p != nullptr && api != nullptr) api->object_unref(p);
  }
  VipsRef(const VipsRef&) = delete;
  VipsRef& operator=(const VipsRef&) = delete;
};

std::string VipsError() {
  const VipsApi& v = Vips();
  char* e = v.error_buffer_copy();
  std::string s = e != nullptr ? e : "";
  v.free(e);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return "libvips: " + s;
}

// Resize so the shorter side is S, centre crop, into out: 3 x S x S, CHW. Shrinking is
// vips_reduce with the linear kernel and no reducing gap: a triangle filter whose support grows
// with the scale, Pillow's BILINEAR resampling with reducing_gap=None. Enlarging (an image
// smaller than S) is vips_affine with the bilinear interpolator and pixel centres aligned as
// Pillow aligns them (output (x + 0.5) / scale - 0.5).
void ResizeCrop(const Rgb& img, int64_t size, uint8_t* out) {
  const ImageFolderGeometry g = ResizeCropGeometry(img.w, img.h, size);
  const VipsApi& v = Vips();
  VipsRef in, resized, crop;
  in.p = v.image_new_from_memory(img.px.data(), img.px.size(), static_cast<int>(img.w),
                                 static_cast<int>(img.h), 3, VIPS_FORMAT_UCHAR);
  if (in.p == nullptr) throw BadImage(VipsError());
  int rc = 0;
  if (g.resized_w <= img.w && g.resized_h <= img.h) {
    rc = v.reduce(in.p, &resized.p, static_cast<double>(img.w) / static_cast<double>(g.resized_w),
                  static_cast<double>(img.h) / static_cast<double>(g.resized_h), "kernel",
                  VIPS_KERNEL_LINEAR, "gap", 0.0, nullptr);
  } else {
    const int area[4] = {0, 0, static_cast<int>(g.resized_w), static_cast<int>(g.resized_h)};
    VipsArrayInt* oarea = v.array_int_new(area, 4);
    rc = v.affine(in.p, &resized.p, static_cast<double>(g.resized_w) / static_cast<double>(img.w),
                  0.0, 0.0, static_cast<double>(g.resized_h) / static_cast<double>(img.h),
                  "interpolate", v.interpolate_bilinear_static(), "idx", 0.5, "idy", 0.5, "odx",
                  -0.5, "ody", -0.5, "oarea", oarea, "extend", VIPS_EXTEND_COPY, nullptr);
    v.area_unref(VIPS_AREA(oarea));
  }
  if (rc != 0) throw BadImage(VipsError());
  if (resized.p->Xsize != g.resized_w || resized.p->Ysize != g.resized_h || resized.p->Bands != 3 ||
      resized.p->BandFmt != VIPS_FORMAT_UCHAR) {
    throw BadImage("libvips resized " + std::to_string(img.w) + "x" + std::to_string(img.h) +
                   " to " + std::to_string(resized.p->Xsize) + "x" +
                   std::to_string(resized.p->Ysize) + ", expected " + std::to_string(g.resized_w) +
                   "x" + std::to_string(g.resized_h));
  }
  if (v.extract_area(resized.p, &crop.p, static_cast<int>(g.crop_x), static_cast<int>(g.crop_y),
                     static_cast<int>(size), static_cast<int>(size), nullptr) != 0) {
    throw BadImage(VipsError());
  }
  size_t bytes = 0;
  void* hwc = v.image_write_to_memory(crop.p, &bytes);
  if (hwc == nullptr) throw BadImage(VipsError());
  const auto* p = static_cast<const uint8_t*>(hwc);
  const int64_t plane = size * size;
  if (static_cast<int64_t>(bytes) == 3 * plane) {
    for (int64_t i = 0; i < plane; ++i) {
      for (int64_t c = 0; c < 3; ++c) out[c * plane + i] = p[3 * i + c];
    }
  }
  v.free(hwc);
  if (static_cast<int64_t>(bytes) != 3 * plane) throw BadImage("libvips: short crop");
}

// ---- the ordered pool ----

// One image's outcome: pixels (3 x S x S) or why it is unreadable.
struct Converted {
  std::vector<uint8_t> chw;
  std::string error;
};

// Runs work(i) for i in [0, n) on `threads` workers, at most `window` items ahead of the
// consumer, and hands the results to the calling thread in index order (Take): the output does
// not depend on the number of threads. work must not throw (per-item failures are results); an
// exception that escapes it anyway is rethrown by Take. The destructor stops and joins.
class OrderedPool {
 public:
  OrderedPool(int64_t n, int threads, int64_t window, std::function<Converted(int64_t)> work)
      : n_(n), window_(window), work_(std::move(work)), slots_(static_cast<size_t>(window)) {
    for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { Loop(); });
  }
  ~OrderedPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  OrderedPool(const OrderedPool&) = delete;
  OrderedPool& operator=(const OrderedPool&) = delete;

  // The result of the next index (0, 1, ...); blocks until it is ready.
  Converted Take() {
    std::unique_lock<std::mutex> lock(mu_);
    Slot& s = slots_[static_cast<size_t>(taken_ % window_)];
    ready_.wait(lock, [&] { return s.full || failure_ != nullptr; });
    if (failure_ != nullptr) std::rethrow_exception(failure_);
    Converted c = std::move(s.value);
    s.full = false;
    ++taken_;
    lock.unlock();
    space_.notify_all();
    return c;
  }

 private:
  struct Slot {
    Converted value;
    bool full = false;
  };

  void Loop() {
    for (;;) {
      int64_t i = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_.wait(lock, [&] { return stop_ || next_ >= n_ || next_ < taken_ + window_; });
        if (stop_ || next_ >= n_) return;
        i = next_++;
      }
      Converted c;
      try {
        c = work_(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (failure_ == nullptr) failure_ = std::current_exception();
        stop_ = true;
        ready_.notify_all();
        space_.notify_all();
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        Slot& s = slots_[static_cast<size_t>(i % window_)];
        s.value = std::move(c);
        s.full = true;
      }
      ready_.notify_all();
    }
  }

  const int64_t n_, window_;
  std::function<Converted(int64_t)> work_;
  std::mutex mu_;
  std::condition_variable ready_, space_;
  std::vector<Slot> slots_;
  int64_t next_ = 0, taken_ = 0;
  bool stop_ = false;
  std::exception_ptr failure_;
  std::vector<std::thread> workers_;
};

// ---- shards ----

void Fsync(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;  // best effort: the rename still publishes a complete file
  ::fsync(fd);
  ::close(fd);
}

// FNV-1a 64 over S and the shard's file names and sizes: a rerun keeps a shard only when it was
// made from the same files at the same size.
std::string SourceDigest(const ImageFolderListing& l, const ShardRange& r, int64_t size) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h ^= static_cast<const uint8_t*>(p)[i];
      h *= 1099511628211ull;
    }
  };
  mix(&size, sizeof size);
  for (int64_t i = r.first; i < r.first + r.count; ++i) {
    const std::string& f = l.files[static_cast<size_t>(i)];
    mix(f.data(), f.size() + 1);
    mix(&l.bytes[static_cast<size_t>(i)], sizeof(int64_t));
    mix(&l.labels[static_cast<size_t>(i)], sizeof(int32_t));
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::optional<std::string> StringAttr(hid_t file, const char* name) {
  if (H5Aexists(file, name) <= 0) return std::nullopt;
  h5::Id a = h5::Attr(H5Aopen(file, name, H5P_DEFAULT));
  if (!a.valid()) return std::nullopt;
  return h5::ReadStringAttr(a.get());
}

std::optional<int64_t> IntAttr(hid_t file, const char* name) {
  if (H5Aexists(file, name) <= 0) return std::nullopt;
  h5::Id a = h5::Attr(H5Aopen(file, name, H5P_DEFAULT));
  int64_t v = 0;
  if (!a.valid() || H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) return std::nullopt;
  return v;
}

// What a shard file must be to be kept by a rerun.
struct ShardSpec {
  std::string path;
  ShardRange range;
  std::string digest;
};

// Whether `spec.path` is a complete shard of this conversion; its left-out images into
// *skipped. Any doubt (missing, unreadable, other content) means no: the shard is redone.
bool ShardComplete(const ShardSpec& spec, const ImageFolderListing& l, int64_t size,
                   const std::string& class_names, bool skip_bad,
                   std::vector<std::string>* skipped) {
  std::error_code ec;
  if (!fs::is_regular_file(spec.path, ec)) return false;
  try {
    OpenOptions o;
    o.cache = CacheMode::kChunks;  // validate labels and schema; read no pixels
    const auto ds = OpenHdf5Dataset(spec.path, o);
    const DatasetInfo& info = ds->info();
    if (info.image_dtype != DType::kU8 || info.sample_shape != Shape({3, size, size}) ||
        info.classes != static_cast<int64_t>(l.classes.size()) || info.size > spec.range.count ||
        (!skip_bad && info.size != spec.range.count)) {
      return false;
    }
    h5::ScopedSilence silence;
    h5::Id file = h5::OpenFileReadOnly<IoError>(spec.path);
    if (StringAttr(file.get(), "class_names") != class_names ||
        StringAttr(file.get(), "source_digest") != spec.digest ||
        IntAttr(file.get(), "source_count") != spec.range.count) {
      return false;
    }
    const std::vector<std::string> left_out =
        SplitLines(StringAttr(file.get(), "skipped").value_or(""));
    if (static_cast<int64_t>(left_out.size()) != spec.range.count - info.size) return false;
    skipped->insert(skipped->end(), left_out.begin(), left_out.end());
    return true;
  } catch (const Error&) {
    return false;
  }
}

// One shard being written: rows go straight to `<path>.tmp`; Finish() completes it and renames
// it into place. Destroyed unfinished (an error), it removes the .tmp: no partial file stays.
class ShardWriter {
 public:
  ShardWriter(const ShardSpec& spec, int64_t size, int64_t classes, const std::string& class_names)
      : spec_(spec), tmp_(spec.path + ".tmp"), classes_(classes), class_names_(class_names) {
    std::error_code ec;
    fs::remove(tmp_, ec);
    w_ = std::make_unique<Hdf5Writer>(tmp_);
    w_->CreateArray("/images", H5Elem::kU8, {spec.range.count, 3, size, size}, 1);
  }
  ~ShardWriter() {
    if (done_) return;
    w_.reset();  // closes the file (errors ignored) before it is removed
    std::error_code ec;
    fs::remove(tmp_, ec);
  }
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  void Append(const uint8_t* chw, int32_t label) {
    w_->WriteRows("/images", H5Elem::kU8, rows(), 1, chw);
    labels_.push_back(label);
  }
  void Skip(const std::string& what) { skipped_.push_back(what); }
  int64_t rows() const { return static_cast<int64_t>(labels_.size()); }

  void Finish() {
    const int64_t n = rows();
    if (n < spec_.range.count) w_->SetRows("/images", n);
    w_->WriteArray("/labels", H5Elem::kI32, {n}, labels_.data(), 0);
    w_->SetIntAttr("/", "classes", classes_);
    w_->SetStringAttr("/", "class_names", class_names_);
    w_->SetIntAttr("/", "source_count", spec_.range.count);
    w_->SetStringAttr("/", "source_digest", spec_.digest);
    if (!skipped_.empty()) {
      std::string s;
      for (const std::string& x : skipped_) s += (s.empty() ? "" : "\n") + x;
      w_->SetStringAttr("/", "skipped", s);
    }
    w_->Close();
    w_.reset();
    Fsync(tmp_);
    std::error_code ec;
    fs::rename(tmp_, spec_.path, ec);
    if (ec)
      DPT_THROW(IoError) << spec_.path << ": cannot rename " << tmp_ << " to it: " << ec.message();
    done_ = true;
  }

 private:
  ShardSpec spec_;
  std::string tmp_;
  int64_t classes_;
  std::string class_names_;
  std::unique_ptr<Hdf5Writer> w_;
  std::vector<int32_t> labels_;
  std::vector<std::string> skipped_;
  bool done_ = false;
};

}  // namespace

ImageFolderListing ListImageFolder(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    DPT_THROW(IoError) << dir << ": no such directory (ImageFolder layout: DIR/<class>/<image>)";
  }
  ImageFolderListing l;
  fs::directory_iterator it(dir, ec);
  if (ec) DPT_THROW(IoError) << dir << ": cannot list: " << ec.message();
  for (const fs::directory_entry& e : it) {
    if (IsDir(e.path())) l.classes.push_back(e.path().filename().string());
  }
  std::sort(l.classes.begin(), l.classes.end());  // byte order, as Python's sorted()
  if (l.classes.empty()) {
    DPT_THROW(DataError) << dir << ": no class folders (ImageFolder layout: DIR/<class>/<image>)";
  }
  std::vector<std::string> empty;
  for (size_t c = 0; c < l.classes.size(); ++c) {
    const std::string& name = l.classes[c];
    const fs::path root = fs::path(dir) / name;
    if (name.find('\n') != std::string::npos) {
      DPT_THROW(DataError) << root.string()
                           << ": a class folder name may not contain a newline (class_names "
                           << "joins the names with \"\\n\")";
    }
    if (!IsValidUtf8(name)) {
      DPT_THROW(DataError) << root.string() << ": the class folder name is not valid UTF-8";
    }
    const size_t before = l.files.size();
    WalkClass(root, name, &l.files, &l.bytes);
    if (l.files.size() == before) empty.push_back(root.string());
    l.labels.resize(l.files.size(), static_cast<int32_t>(c));
  }
  if (!empty.empty()) {
    std::string names;
    for (const std::string& e : empty) names += (names.empty() ? "" : ", ") + e;
    DPT_THROW(DataError) << names << ": no images (.jpg, .jpeg, .png) in "
                         << (empty.size() == 1 ? "this class folder" : "these class folders");
  }
  return l;
}

ImageFolderGeometry ResizeCropGeometry(int64_t w, int64_t h, int64_t size) {
  DPT_CHECK(w >= 1 && h >= 1 && size >= 1)
      << "ResizeCropGeometry(" << w << ", " << h << ", " << size << ")";
  // torchvision _compute_resized_output_size: int(S * long / short) in double.
  const int64_t short_side = std::min(w, h), long_side = std::max(w, h);
  const auto new_long =
      static_cast<int64_t>(static_cast<double>(size * long_side) / static_cast<double>(short_side));
  ImageFolderGeometry g;
  g.resized_w = w <= h ? size : new_long;
  g.resized_h = w <= h ? new_long : size;
  // torchvision center_crop: int(round((side - S) / 2.0)), Python's round: half to even.
  auto offset = [&](int64_t side) {
    const int64_t d = side - size;
    const int64_t half = d / 2;
    return d % 2 == 0 ? half : (half % 2 == 0 ? half : half + 1);
  };
  g.crop_x = offset(g.resized_w);
  g.crop_y = offset(g.resized_h);
  return g;
}

std::vector<ShardRange> PlanShards(int64_t n, int64_t sample_bytes, int64_t shard_bytes) {
  DPT_CHECK(n >= 0 && sample_bytes > 0) << "PlanShards(" << n << ", " << sample_bytes << ")";
  if (shard_bytes <= 0) return {ShardRange{0, n}};
  if (shard_bytes < sample_bytes) {
    DPT_THROW(ConfigError) << "--shard-size " << shard_bytes << " bytes is smaller than one "
                           << "sample (" << sample_bytes << " bytes = 3 x size x size)";
  }
  const int64_t per = shard_bytes / sample_bytes;
  std::vector<ShardRange> out;
  for (int64_t first = 0; first < n; first += per) out.push_back({first, std::min(per, n - first)});
  return out;
}

std::string ImageFolderShardPath(const std::string& out, int64_t index, bool sharded) {
  if (!sharded) return out;
  std::string base = out;
  if (EndsWith(base, ".h5")) base.resize(base.size() - 3);
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "-%05lld.h5", static_cast<long long>(index));
  return base + suffix;
}

ImageFolderResult ConvertImageFolder(const std::string& dir, const std::string& out,
                                     const ImageFolderOptions& opts) {
  const int64_t size = opts.size;
  if (size < 1 || size > kMaxSize) {
    DPT_THROW(ConfigError) << "--size " << size << ": expected 1.." << kMaxSize;
  }
  if (out.empty()) DPT_THROW(ConfigError) << "convert --from imagefolder needs --out";
  InitVips();  // before listing: a missing libvips is said at once, not after a long listing
  const ImageFolderListing l = ListImageFolder(dir);
  const int64_t sample_bytes = 3 * size * size;
  const auto n = static_cast<int64_t>(l.files.size());
  const std::vector<ShardRange> plan = PlanShards(n, sample_bytes, opts.shard_bytes);
  const bool sharded = opts.shard_bytes > 0;
  std::string class_names;
  for (const std::string& c : l.classes) class_names += (class_names.empty() ? "" : "\n") + c;

  ImageFolderResult result;
  result.classes = static_cast<int64_t>(l.classes.size());
  // Which shards a previous run completed; the files of the rest, in order, are the work.
  std::vector<std::pair<ShardSpec, std::vector<std::string>>> shards;  // spec, kept's skipped
  std::vector<ShardSpec> todo;
  std::vector<int64_t> work;  // indices into l.files
  for (size_t s = 0; s < plan.size(); ++s) {
    ShardSpec spec{ImageFolderShardPath(out, static_cast<int64_t>(s), sharded), plan[s],
                   SourceDigest(l, plan[s], size)};
    std::vector<std::string> skipped;
    if (ShardComplete(spec, l, size, class_names, opts.skip_bad, &skipped)) {
      const int64_t stored = spec.range.count - static_cast<int64_t>(skipped.size());
      result.kept.push_back(spec.path);
      result.images += stored;
      result.skipped.insert(result.skipped.end(), skipped.begin(), skipped.end());
      if (opts.note) {
        opts.note("skipped " + spec.path + ": complete from an earlier run (" +
                  std::to_string(stored) + " images)");
      }
      continue;
    }
    for (int64_t i = spec.range.first; i < spec.range.first + spec.range.count; ++i) {
      work.push_back(i);
    }
    todo.push_back(std::move(spec));
  }

  const int threads = opts.threads > 0
                          ? opts.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const auto total = static_cast<int64_t>(work.size());
  OrderedPool pool(total, threads, std::max<int64_t>(16, int64_t{4} * threads), [&](int64_t k) {
    const std::string path = (fs::path(dir) / l.files[static_cast<size_t>(work[k])]).string();
    Converted c;
    try {
      const Rgb img = Decode(path);
      c.chw.resize(static_cast<size_t>(sample_bytes));
      ResizeCrop(img, size, c.chw.data());
    } catch (const std::exception& e) {  // BadImage, bad_alloc
      c.chw.clear();
      c.error = e.what();
    }
    return c;
  });
  int64_t done = 0;
  for (const ShardSpec& spec : todo) {
    ShardWriter shard(spec, size, result.classes, class_names);
    for (int64_t i = spec.range.first; i < spec.range.first + spec.range.count; ++i) {
      const Converted c = pool.Take();
      const std::string& rel = l.files[static_cast<size_t>(i)];
      if (!c.error.empty()) {
        if (!opts.skip_bad) {
          DPT_THROW(DataError) << (fs::path(dir) / rel).string() << ": " << c.error
                               << " (--skip-bad leaves unreadable images out)";
        }
        shard.Skip(rel + " (" + c.error + ")");
        result.skipped.push_back(rel + " (" + c.error + ")");
      } else {
        shard.Append(c.chw.data(), l.labels[static_cast<size_t>(i)]);
      }
      ++done;
      if (opts.progress) opts.progress(done, total);
    }
    if (shard.rows() == 0) {
      if (opts.note) opts.note("not written " + spec.path + ": none of its images is readable");
      continue;  // the destructor removes the .tmp
    }
    shard.Finish();
    result.written.push_back(spec.path);
    result.images += shard.rows();
  }
  if (result.images == 0) {
    DPT_THROW(DataError) << dir << ": none of the " << n << " images is readable";
  }
  return result;
}

}  // namespace dptrain
