// SPDX-License-Identifier: Apache-2.0
// NumPy .npy (versions 1-3) -> dataset HDF5. The header is a Python dict literal; it is parsed
// by a small strict parser (no eval, bounded lengths) because the input is untrusted.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/util/input_file.h"
#include "datasets/convert/convert.h"
#include "datasets/dataset.h"

namespace dptrain {
namespace {

constexpr size_t kMaxHeader = size_t(1) << 20;

struct Dtype {
  char kind = '?';  // 'u', 'i', 'f', 'b', ...
  int size = 0;     // bytes per element
  bool big_endian = false;
  std::string text;  // as written, for messages
};

struct NpyArray {
  std::string path;
  Dtype dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // raw element bytes, as stored
};

// Parser for the header dict: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(const std::string& path, const std::string& text) : path_(path), s_(text) {}

  void Parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    Expect('{');
    for (;;) {
      SkipSpace();
      if (Peek() == '}') break;
      const std::string key = String();
      Expect(':');
      SkipSpace();
      if (key == "descr") {
        if (Peek() != '\'' && Peek() != '"') {
          Fail("descr is not a simple dtype string (structured dtypes are not supported)");
        }
        *descr = String();
        have_descr = true;
      } else if (key == "fortran_order") {
        *fortran = Bool();
        have_fortran = true;
      } else if (key == "shape") {
        *shape = Tuple();
        have_shape = true;
      } else {
        Fail("unknown header key '" + key + "'");
      }
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      SkipSpace();
      if (Peek() != '}') Fail("expected ',' or '}'");
    }
    ++pos_;
    if (!have_descr || !have_fortran || !have_shape) {
      Fail("header lacks one of 'descr', 'fortran_order', 'shape'");
    }
    SkipSpace();
    if (pos_ != s_.size()) Fail("unexpected text after the header dict");
  }

 private:
  [[noreturn]] void Fail(const std::string& what) {
    DPT_THROW(DataError) << path_ << ": malformed .npy header at character " << pos_ << ": "
                         << what;
  }
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void SkipSpace() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void Expect(char c) {
    SkipSpace();
    if (Peek() != c) Fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string String() {
    SkipSpace();
    const char q = Peek();
    if (q != '\'' && q != '"') Fail("expected a quoted string");
    const size_t end = s_.find(q, pos_ + 1);
    if (end == std::string::npos) Fail("unterminated string");
    std::string out = s_.substr(pos_ + 1, end - pos_ - 1);
    pos_ = end + 1;
    return out;
  }
  bool Bool() {
    if (s_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (s_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    Fail("expected True or False");
  }
  std::vector<int64_t> Tuple() {
    Expect('(');
    std::vector<int64_t> dims;
    for (;;) {
      SkipSpace();
      if (Peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) Fail("expected a dimension");
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(Peek()))) {
        if (v > (int64_t{1} << 48)) Fail("dimension too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (Peek() == 'L') ++pos_;  // Python 2 long suffix
      dims.push_back(v);
      if (dims.size() > 32) Fail("too many dimensions");
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
      } else if (Peek() != ')') {
        Fail("expected ',' or ')' in shape");
      }
    }
    ++pos_;
    return dims;
  }

  const std::string& path_;
  const std::string& s_;
  size_t pos_ = 0;
};

Dtype ParseDtype(const std::string& path, const std::string& d) {
  Dtype t;
  t.text = d;
  size_t i = 0;
  if (i < d.size() && (d[i] == '<' || d[i] == '>' || d[i] == '|' || d[i] == '=')) {
    t.big_endian = d[i] == '>';
    ++i;
  }
  if (i >= d.size()) DPT_THROW(DataError) << path << ": unsupported dtype '" << d << "'";
  t.kind = d[i++];
  if (i >= d.size() || i + 2 < d.size()) {
    DPT_THROW(DataError) << path << ": unsupported dtype '" << d << "'";
  }
  for (; i < d.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(d[i]))) {
      DPT_THROW(DataError) << path << ": unsupported dtype '" << d << "'";
    }
    t.size = t.size * 10 + (d[i] - '0');
  }
  return t;
}

NpyArray ReadNpy(const std::string& path) {
  // The whole file, from the descriptor the checks ran on; the header is then cut off the
  // front in place, so the peak is the file's size, as reading the data straight into place.
  std::vector<uint8_t> file;
  if (const std::string why = ReadInputFile(path, "a .npy file", &file); !why.empty()) {
    DPT_THROW(IoError) << path << ": " << why;
  }
  const uint64_t file_size = file.size();
  const uint8_t* pre = file.data();
  if (file_size < 10 || std::memcmp(pre, "\x93NUMPY", 6) != 0) {
    DPT_THROW(DataError) << path << ": not a .npy file (no \\x93NUMPY magic)";
  }
  const int major = pre[6];
  size_t header_len = 0, prefix = 0;
  if (major == 1) {
    header_len = pre[8] | (size_t{pre[9]} << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (file_size < 12) DPT_THROW(DataError) << path << ": truncated .npy header";
    header_len = pre[8] | (size_t{pre[9]} << 8) | (size_t{pre[10]} << 16) | (size_t{pre[11]} << 24);
    prefix = 12;
  } else {
    DPT_THROW(DataError) << path << ": unsupported .npy format version " << major << "."
                         << int{pre[7]} << " (1, 2 and 3 are supported)";
  }
  if (header_len > kMaxHeader || prefix + header_len > file_size) {
    DPT_THROW(DataError) << path << ": truncated or corrupt .npy header (length " << header_len
                         << ", file size " << file_size << ")";
  }
  const std::string header(reinterpret_cast<const char*>(pre) + prefix, header_len);
  // Version 1/2 headers are latin-1/ASCII, version 3 UTF-8; the dict we accept is ASCII.
  std::string descr;
  bool fortran = false;
  NpyArray a;
  a.path = path;
  HeaderParser(path, header).Parse(&descr, &fortran, &a.shape);
  if (fortran) {
    DPT_THROW(DataError) << path << ": fortran_order is True; only C-order arrays are supported "
                         << "(save with np.ascontiguousarray)";
  }
  a.dtype = ParseDtype(path, descr);
  if (a.dtype.size <= 0 || a.dtype.size > 16) {
    DPT_THROW(DataError) << path << ": unsupported dtype '" << descr << "'";
  }
  uint64_t count = 1;
  for (int64_t d : a.shape) {
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count)) {
      DPT_THROW(DataError) << path << ": shape " << Shape(a.shape).ToString() << " is too large";
    }
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(count, static_cast<uint64_t>(a.dtype.size), &bytes)) {
    DPT_THROW(DataError) << path << ": shape " << Shape(a.shape).ToString() << " is too large";
  }
  const uint64_t have = file_size - prefix - header_len;
  if (have != bytes) {
    DPT_THROW(DataError) << path << ": " << (have < bytes ? "truncated" : "trailing data")
                         << ": shape " << Shape(a.shape).ToString() << " of " << descr << " needs "
                         << bytes << " data bytes, the file has " << have;
  }
  file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(prefix + header_len));
  a.data = std::move(file);
  return a;
}

// Element i of an integer array as int64 (unsigned 64-bit values above INT64_MAX are clamped,
// which the range check then reports).
int64_t IntAt(const NpyArray& a, size_t i) {
  const int n = a.dtype.size;
  const uint8_t* p = a.data.data() + i * static_cast<size_t>(n);
  uint64_t u = 0;
  for (int b = 0; b < n; ++b) {
    const uint8_t byte = a.dtype.big_endian ? p[b] : p[n - 1 - b];
    u = (u << 8) | byte;
  }
  if (a.dtype.kind == 'i' && n < 8 && (u >> (8 * n - 1)) != 0) {
    u |= ~uint64_t{0} << (8 * n);  // sign-extend
  }
  if (a.dtype.kind == 'u' && u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<int64_t>(u);
}

// (N, H, W, C) -> (N, C, H, W) of ES-byte elements (a constant size: one move per element).
template <size_t ES>
std::vector<uint8_t> ChannelsFirst(const std::vector<uint8_t>& in, int64_t n, int64_t h, int64_t w,
                                   int64_t c) {
  std::vector<uint8_t> out(in.size());
  const int64_t hw = h * w;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = in.data() + static_cast<size_t>(i * hw * c) * ES;
    uint8_t* dst = out.data() + static_cast<size_t>(i * hw * c) * ES;
    for (int64_t p = 0; p < hw; ++p) {
      for (int64_t ch = 0; ch < c; ++ch) {
        std::memcpy(dst + static_cast<size_t>(ch * hw + p) * ES,
                    src + static_cast<size_t>(p * c + ch) * ES, ES);
      }
    }
  }
  return out;
}

bool IsChannelCount(int64_t d) { return d == 1 || d == 3 || d == 4; }

}  // namespace

NpyResult ConvertNpy(const std::string& images, const std::string& labels, const std::string& out,
                     NpyLayout layout) {
  NpyArray img = ReadNpy(images);
  const Dtype& it = img.dtype;
  const bool is_u8 = it.kind == 'u' && it.size == 1;
  const bool is_f32 = it.kind == 'f' && it.size == 4;
  if (!is_u8 && !is_f32) {
    DPT_THROW(DataError) << images << ": images dtype '" << it.text
                         << "' is not supported; use uint8 ('|u1') or float32 ('<f4')";
  }
  std::vector<int64_t> shape = img.shape;
  if (shape.size() == 3) shape.insert(shape.begin() + 1, 1);
  if (shape.size() != 4) {
    DPT_THROW(DataError) << images << ": images shape " << Shape(img.shape).ToString()
                         << " has rank " << img.shape.size() << ", expected (N, H, W), "
                         << "(N, C, H, W) or (N, H, W, C)";
  }
  for (int64_t d : shape) {
    DPT_CHECK_AS(DataError, d > 0)
        << images << ": images shape " << Shape(img.shape).ToString() << " has a zero dimension";
  }
  if (img.shape.size() == 3 && layout != NpyLayout::kAuto) {
    DPT_THROW(ConfigError) << images << ": --layout applies to rank-4 images, and these are (N, H, "
                           << "W) " << Shape(img.shape).ToString() << " (one channel); drop it";
  }
  NpyResult result;
  result.file_shape = img.shape;
  result.channels_last =
      img.shape.size() == 4 &&
      (layout == NpyLayout::kNHWC ||
       (layout == NpyLayout::kAuto && IsChannelCount(shape[3]) && !IsChannelCount(shape[1])));
  if (result.channels_last) {
    img.data = is_u8 ? ChannelsFirst<1>(img.data, shape[0], shape[1], shape[2], shape[3])
                     : ChannelsFirst<4>(img.data, shape[0], shape[1], shape[2], shape[3]);
    shape = {shape[0], shape[3], shape[1], shape[2]};
  }
  result.written_shape = shape;
  const int64_t n = shape[0];

  NpyArray lab = ReadNpy(labels);
  const Dtype& lt = lab.dtype;
  const bool int_ok = (lt.kind == 'i' || lt.kind == 'u') &&
                      (lt.size == 1 || lt.size == 2 || lt.size == 4 || lt.size == 8);
  if (!int_ok) {
    DPT_THROW(DataError) << labels << ": labels dtype '" << lt.text
                         << "' is not an integer type (e.g. '<i8', '<i4', '|u1')";
  }
  const bool shape_ok = lab.shape.size() == 1 || (lab.shape.size() == 2 && lab.shape[1] == 1);
  if (!shape_ok) {
    DPT_THROW(DataError) << labels << ": labels shape " << Shape(lab.shape).ToString()
                         << ", expected (N) or (N, 1)";
  }
  if (lab.shape[0] != n) {
    DPT_THROW(DataError) << labels << ": has " << lab.shape[0] << " labels but " << images
                         << " has " << n << " images";
  }
  std::vector<int32_t> lab32(static_cast<size_t>(n));
  int64_t max_label = 0;
  for (size_t i = 0; i < lab32.size(); ++i) {
    const int64_t v = IntAt(lab, i);
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) {
      DPT_THROW(DataError) << labels << ": label " << v << " at index " << i
                           << " is outside [0, 2^31)";
    }
    lab32[i] = static_cast<int32_t>(v);
    max_label = std::max(max_label, v);
  }
  const int64_t classes = max_label + 1;

  const Shape out_shape(shape);
  if (is_u8) {
    WriteHdf5Dataset(out, img.data.data(), out_shape, lab32.data(), classes);
    return result;
  }
  const size_t count = img.data.size() / 4;
  std::vector<float> f(count);
  for (size_t i = 0; i < count; ++i) {
    uint8_t b[4];
    std::memcpy(b, img.data.data() + 4 * i, 4);
    if (it.big_endian) {
      std::swap(b[0], b[3]);
      std::swap(b[1], b[2]);
    }
    std::memcpy(&f[i], b, 4);
    if (!std::isfinite(f[i])) {
      DPT_THROW(DataError) << images << ": non-finite pixel " << f[i] << " in image "
                           << static_cast<int64_t>(i) / (out_shape.numel() / n);
    }
  }
  WriteHdf5Dataset(out, f.data(), out_shape, lab32.data(), classes);
  return result;
}

}  // namespace dptrain
