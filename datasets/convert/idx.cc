// SPDX-License-Identifier: Apache-2.0
// MNIST / Fashion-MNIST idx files (plain or gzip) -> dataset HDF5. zlib's gzread reads both
// compressed and plain files, so the format is detected from the content, not the name.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/util/input_file.h"
#include "datasets/convert/convert.h"
#include "datasets/dataset.h"

namespace dptrain {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr uint32_t kMaxSide = 1 << 14;         // sanity bound on H and W

// An open gzip (or plain) file; closed on destruction.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    std::string why;
    const int fd = OpenInputFile(path, "an idx file", &why);
    if (fd < 0) DPT_THROW(IoError) << path << ": " << why;
    f_ = gzdopen(fd, "rb");  // gzclose closes fd
    if (f_ == nullptr) {
      const int err = errno;
      ::close(fd);
      DPT_THROW(IoError) << path << ": cannot open: " << std::strerror(err);
    }
  }
  ~GzFile() {
    if (f_ != nullptr) gzclose(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; returns how many were read (fewer only at the end of the data).
  // Throws IoError on a corrupt or truncated gzip stream.
  size_t Read(void* dst, size_t n) {
    size_t done = 0;
    auto* p = static_cast<uint8_t*>(dst);
    while (done < n) {
      const auto want = static_cast<unsigned>(std::min<size_t>(n - done, size_t(1) << 24));
      const int got = gzread(f_, p + done, want);
      if (got < 0) ThrowZlib("corrupt gzip data");
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    if (done < n) {
      int err = Z_OK;
      gzerror(f_, &err);
      if (err != Z_OK && err != Z_STREAM_END) ThrowZlib("truncated gzip data");
    }
    return done;
  }

  uint32_t ReadBigEndian32(const char* what) {
    std::array<uint8_t, 4> b{};
    if (Read(b.data(), 4) != 4) {
      DPT_THROW(DataError) << path_ << ": truncated header (reading " << what << ")";
    }
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  // Reads exactly n bytes into a vector that grows as data arrives, so that a header claiming
  // more data than the file holds fails as "truncated", not as a huge allocation.
  std::vector<uint8_t> ReadExactly(size_t n, const char* what) {
    std::vector<uint8_t> out;
    constexpr size_t kStep = size_t(64) << 20;
    while (out.size() < n) {
      const size_t old = out.size();
      const size_t want = std::min(kStep, n - old);
      out.resize(old + want);
      const size_t got = Read(out.data() + old, want);
      if (got < want) {
        DPT_THROW(DataError) << path_ << ": truncated: the header announces " << n << " bytes of "
                             << what << " but the file has " << old + got;
      }
    }
    uint8_t extra = 0;
    if (Read(&extra, 1) != 0) {
      DPT_THROW(DataError) << path_ << ": unexpected data after the " << n << " bytes of " << what
                           << " the header announces";
    }
    return out;
  }

 private:
  [[noreturn]] void ThrowZlib(const char* what) {
    int err = Z_OK;
    const char* msg = gzerror(f_, &err);
    DPT_THROW(IoError) << path_ << ": " << what << " (zlib: " << (msg ? msg : "?") << ")";
  }

  std::string path_;
  gzFile f_ = nullptr;
};

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

}  // namespace

void ConvertIdx(const std::string& images, const std::string& labels, const std::string& out) {
  GzFile fi(images);
  const uint32_t magic = fi.ReadBigEndian32("magic number");
  if (magic != kImagesMagic) {
    DPT_THROW(DataError) << images << ": bad magic number " << Hex(magic) << ", expected "
                         << Hex(kImagesMagic) << " (idx3-ubyte images)"
                         << (magic == kLabelsMagic ? "; this looks like a labels file" : "");
  }
  const uint32_t n = fi.ReadBigEndian32("image count");
  const uint32_t h = fi.ReadBigEndian32("rows");
  const uint32_t w = fi.ReadBigEndian32("columns");
  if (n == 0 || h == 0 || w == 0 || h > kMaxSide || w > kMaxSide) {
    DPT_THROW(DataError) << images << ": implausible dimensions " << n << " x " << h << " x " << w
                         << " (count x rows x columns)";
  }

  GzFile fl(labels);
  const uint32_t lmagic = fl.ReadBigEndian32("magic number");
  if (lmagic != kLabelsMagic) {
    DPT_THROW(DataError) << labels << ": bad magic number " << Hex(lmagic) << ", expected "
                         << Hex(kLabelsMagic) << " (idx1-ubyte labels)"
                         << (lmagic == kImagesMagic ? "; this looks like an images file" : "");
  }
  const uint32_t ln = fl.ReadBigEndian32("label count");
  if (ln != n) {
    DPT_THROW(DataError) << labels << ": has " << ln << " labels but " << images << " has " << n
                         << " images";
  }

  const std::vector<uint8_t> label_bytes = fl.ReadExactly(n, "labels");
  const std::vector<uint8_t> pixels = fi.ReadExactly(size_t{n} * h * w, "pixels");
  std::vector<int32_t> lab(label_bytes.begin(), label_bytes.end());
  const int64_t classes = *std::max_element(lab.begin(), lab.end()) + 1;
  WriteHdf5Dataset(out, pixels.data(), Shape({int64_t{n}, 1, int64_t{h}, int64_t{w}}), lab.data(),
                   classes);
}

}  // namespace dptrain
