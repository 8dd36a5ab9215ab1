// SPDX-License-Identifier: Apache-2.0
// The HDF5 dataset: validation at open, a RAM copy or an LRU of whole decoded chunks for reads,
// and the dataset writer. Whole-chunk reads matter: a random 64-sample hyperslab read through
// HDF5's default 1 MiB chunk cache decodes each touched chunk again per sample (~15x slower).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <list>
#include <mutex>
#include <string>
#include <system_error>
#include <unordered_map>

#include "core/error.h"
#include "core/hdf5/hdf5_util.h"
#include "datasets/dataset.h"
#include "datasets/hdf5_writer.h"

namespace dptrain {
namespace {

constexpr size_t kTargetBlockBytes = size_t(1) << 20;  // ~1 MiB per chunk (writer and reader)

// x / 255 for every uint8 value: exact division, same result as a per-pixel divide.
const std::array<float, 256>& U8ToFloat() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = static_cast<float>(i) / 255.0f;
    return t;
  }();
  return table;
}

// HDF5 reads storage that was never written as fill values, so a small (or truncated, or forged)
// file can declare a dataset of terabytes, and validation would size its buffers by the declared
// shape. The data of a dataset without filters cannot be larger than its file; with filters
// (compression) allow 4096x, well above deflate's limit of about 1032:1. Also rejects shapes
// whose byte count overflows.
void CheckSizeAgainstFile(const std::string& path, hid_t dset, const char* name,
                          const std::vector<int64_t>& dims, size_t elem_bytes) {
  uint64_t bytes = elem_bytes;
  bool overflow = false;
  for (int64_t d : dims) {
    overflow = overflow || d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes);
  }
  std::error_code ec;
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) return;  // the file was just opened; HDF5 reports a vanished file on read
  h5::Id dcpl = h5::Plist(H5Dget_create_plist(dset));
  const bool filtered = dcpl.valid() && H5Pget_nfilters(dcpl.get()) > 0;
  const uint64_t ratio = filtered ? 4096 : 1;
  if (overflow || bytes / ratio > file_bytes) {
    DPT_THROW(DataError) << path << ": " << name << " has shape " << Shape(dims).ToString()
                         << (overflow ? ", too large to address"
                                      : ", " + std::to_string(bytes) + " bytes")
                         << ", but the file has " << file_bytes << " bytes"
                         << (filtered ? " (compressed)" : "")
                         << ": the data is missing (truncated, or never written) or the file is "
                         << "corrupt";
  }
}

class Hdf5Dataset final : public Dataset {
 public:
  Hdf5Dataset(const std::string& path, const OpenOptions& opts);
  const DatasetInfo& info() const override { return info_; }
  void Read(const int64_t* indices, int64_t count, float* images, int32_t* labels) override;

 private:
  using Block = std::shared_ptr<const std::vector<uint8_t>>;

  void OpenImages();
  void OpenLabels(const OpenOptions& opts);
  void ReadAttributes();
  void CheckFinite(const uint8_t* block, int64_t first_sample, int64_t rows) const;
  // Reads rows [first, first + rows) of /images in the stored element type.
  void ReadRows(int64_t first, int64_t rows, uint8_t* out) const;
  Block GetBlock(int64_t b);
  void Convert(const uint8_t* sample, float* out) const;

  DatasetInfo info_;
  h5::Id file_;
  h5::Id images_;
  int64_t sample_numel_ = 0;
  size_t elem_bytes_ = 1;    // stored bytes per pixel: 1 (uint8) or 4 (float32)
  size_t sample_bytes_ = 0;  // stored bytes per sample
  std::vector<int32_t> labels_;

  bool in_ram_ = false;
  std::vector<uint8_t> ram_;  // all of /images in stored type (ram mode)

  // chunks mode: block b = rows [b * block_rows_, min(N, (b + 1) * block_rows_)), a whole number
  // of HDF5 chunks along N. LRU of decoded blocks; shared_ptr keeps a block alive for a reader
  // while another thread evicts it.
  int64_t block_rows_ = 1;
  size_t max_blocks_ = 2;
  std::mutex mu_;
  std::list<int64_t> lru_;  // most recent first
  std::unordered_map<int64_t, std::pair<Block, std::list<int64_t>::iterator>> blocks_;
};

Hdf5Dataset::Hdf5Dataset(const std::string& path, const OpenOptions& opts) {
  h5::ScopedSilence silence;
  info_.path = path;
  // Not in the initializer list: libhdf5's error printing must be silenced before the open.
  // cppcheck-suppress useInitializationList
  file_ = h5::OpenFileReadOnly<DataError>(path);
  OpenImages();
  OpenLabels(opts);
  ReadAttributes();

  const int64_t n = info_.size;
  const size_t total = static_cast<size_t>(n) * sample_bytes_;
  in_ram_ = opts.cache == CacheMode::kRam ||
            (opts.cache == CacheMode::kAuto && total <= opts.ram_limit_bytes);

  // Block size: whole chunks along N (the file's chunking), at least ~1 MiB per block so that
  // files with tiny chunks are not read one sample at a time.
  int64_t chunk_rows =
      std::max<int64_t>(1, static_cast<int64_t>(kTargetBlockBytes / sample_bytes_));
  h5::Id dcpl = h5::Plist(H5Dget_create_plist(images_.get()));
  if (dcpl.valid() && H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
    std::vector<hsize_t> cd(static_cast<size_t>(info_.sample_shape.rank() + 1));
    const int r = H5Pget_chunk(dcpl.get(), static_cast<int>(cd.size()), cd.data());
    if (r >= 1 && cd[0] > 0) {
      const int64_t rows = static_cast<int64_t>(cd[0]);
      const int64_t per_block = std::max<int64_t>(
          1, static_cast<int64_t>(kTargetBlockBytes) /
                 std::max<int64_t>(1, rows * static_cast<int64_t>(sample_bytes_)));
      chunk_rows = rows * per_block;
    }
  }
  block_rows_ = std::min(chunk_rows, n);
  max_blocks_ = std::max<size_t>(
      2, opts.chunk_cache_bytes /
             std::max<size_t>(1, static_cast<size_t>(block_rows_) * sample_bytes_));

  if (in_ram_) {
    ram_.resize(total);
    ReadRows(0, n, ram_.data());
    if (info_.image_dtype == DType::kF32) CheckFinite(ram_.data(), 0, n);
    // Everything is in memory: close the file now (it may be replaced or moved during training).
    images_.Reset();
    file_.Reset();
  } else if (info_.image_dtype == DType::kF32) {
    // Scan every block once for NaN/Inf (one block buffer; the LRU starts empty).
    std::vector<uint8_t> buf(static_cast<size_t>(block_rows_) * sample_bytes_);
    for (int64_t first = 0; first < n; first += block_rows_) {
      const int64_t rows = std::min(block_rows_, n - first);
      ReadRows(first, rows, buf.data());
      CheckFinite(buf.data(), first, rows);
    }
  }
}

void Hdf5Dataset::OpenImages() {
  const std::string& path = info_.path;
  if (H5Lexists(file_.get(), "images", H5P_DEFAULT) <= 0) {
    DPT_THROW(DataError) << path << ": dataset /images not found (a dataset file has /images "
                         << "[N, C, H, W] uint8 or float32 and /labels [N] integer)";
  }
  images_ = h5::Dataset(H5Dopen2(file_.get(), "images", H5P_DEFAULT));
  if (!images_.valid()) {
    DPT_THROW(DataError) << path
                         << ": /images is not a readable dataset: " << h5::ErrorStackString();
  }
  h5::Id type = h5::Type(H5Dget_type(images_.get()));
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  if (cls == H5T_INTEGER && size == 1 && H5Tget_sign(type.get()) == H5T_SGN_NONE) {
    info_.image_dtype = DType::kU8;
    elem_bytes_ = 1;
  } else if (cls == H5T_FLOAT && size == 4) {
    info_.image_dtype = DType::kF32;
    elem_bytes_ = 4;
  } else {
    DPT_THROW(DataError) << path << ": /images has dtype " << h5::TypeName(type.get())
                         << ", expected uint8 or float32";
  }
  h5::Id space = h5::Space(H5Dget_space(images_.get()));
  const std::vector<int64_t> dims = h5::Dims(space.get());
  if (dims.size() == 3 || dims.size() == 4) {
    CheckSizeAgainstFile(path, images_.get(), "/images", dims, elem_bytes_);
  }
  if (dims.size() == 4) {
    info_.sample_shape = Shape({dims[1], dims[2], dims[3]});
  } else if (dims.size() == 3) {
    info_.sample_shape = Shape({1, dims[1], dims[2]});
  } else {
    DPT_THROW(DataError) << path << ": /images has rank " << dims.size() << " (shape "
                         << Shape(dims).ToString() << "), expected 4 [N, C, H, W] or 3 [N, H, W]";
  }
  info_.size = dims[0];
  DPT_CHECK_AS(DataError, info_.size > 0) << path << ": /images has no samples (N = 0)";
  sample_numel_ = info_.sample_shape.numel();
  DPT_CHECK_AS(DataError, sample_numel_ > 0)
      << path << ": /images has an empty sample shape " << Shape(dims).ToString();
  sample_bytes_ = static_cast<size_t>(sample_numel_) * elem_bytes_;
}

void Hdf5Dataset::OpenLabels(const OpenOptions& opts) {
  const std::string& path = info_.path;
  if (H5Lexists(file_.get(), "labels", H5P_DEFAULT) <= 0) {
    DPT_THROW(DataError) << path << ": dataset /labels not found (a dataset file has /images "
                         << "[N, C, H, W] and /labels [N] integer)";
  }
  h5::Id labels = h5::Dataset(H5Dopen2(file_.get(), "labels", H5P_DEFAULT));
  if (!labels.valid()) {
    DPT_THROW(DataError) << path
                         << ": /labels is not a readable dataset: " << h5::ErrorStackString();
  }
  h5::Id type = h5::Type(H5Dget_type(labels.get()));
  if (H5Tget_class(type.get()) != H5T_INTEGER) {
    DPT_THROW(DataError) << path << ": /labels has dtype " << h5::TypeName(type.get())
                         << ", expected an integer type";
  }
  h5::Id space = h5::Space(H5Dget_space(labels.get()));
  const std::vector<int64_t> dims = h5::Dims(space.get());
  if (dims.size() != 1) {
    DPT_THROW(DataError) << path << ": /labels has rank " << dims.size() << " (shape "
                         << Shape(dims).ToString() << "), expected 1 [N]";
  }
  if (dims[0] != info_.size) {
    DPT_THROW(DataError) << path << ": /images has " << info_.size << " samples but /labels has "
                         << dims[0];
  }
  CheckSizeAgainstFile(path, labels.get(), "/labels", dims, H5Tget_size(type.get()));

  // classes: attribute on the root group (what WriteHdf5Dataset writes) or on /labels.
  for (hid_t obj : {file_.get(), labels.get()}) {
    if (info_.classes > 0 || H5Aexists(obj, "classes") <= 0) continue;
    const char* where = obj == file_.get() ? "attribute classes" : "/labels attribute classes";
    h5::Id a = h5::Attr(H5Aopen(obj, "classes", H5P_DEFAULT));
    h5::Id at = h5::Type(H5Aget_type(a.get()));
    h5::Id as = h5::Space(H5Aget_space(a.get()));
    const H5T_class_t cls = H5Tget_class(at.get());
    if ((cls != H5T_INTEGER && cls != H5T_FLOAT) || H5Sget_simple_extent_npoints(as.get()) != 1) {
      DPT_THROW(DataError) << path << ": /labels: " << where << " must be one integer, got "
                           << h5::TypeName(at.get()) << " with "
                           << H5Sget_simple_extent_npoints(as.get()) << " values";
    }
    double v = 0;
    DPT_H5_CHECK_AS(DataError, H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v))
        << path << ": /labels: cannot read " << where;
    if (!(v >= 1 && v <= std::numeric_limits<int32_t>::max()) || v != std::floor(v)) {
      DPT_THROW(DataError) << path << ": /labels: " << where << " = " << v
                           << " is not a positive integer";
    }
    info_.classes = static_cast<int64_t>(v);
  }
  const int64_t check_classes = opts.classes > 0 ? opts.classes : info_.classes;
  if (info_.classes <= 0 && opts.classes > 0) info_.classes = opts.classes;

  // Read as int64 so that out-of-range values are reported as stored, not clamped to int32.
  std::vector<int64_t> raw(static_cast<size_t>(info_.size));
  if (H5Dread(labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) < 0) {
    DPT_THROW(DataError) << path << ": /labels: cannot read: " << h5::ErrorStackString();
  }
  labels_.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    const int64_t v = raw[i];
    if (v < 0 || (check_classes > 0 && v >= check_classes) ||
        v > std::numeric_limits<int32_t>::max()) {
      DPT_THROW(DataError) << path << ": /labels: label " << v << " at index " << i
                           << " is outside [0, "
                           << (check_classes > 0 ? std::to_string(check_classes) : "2^31") << ")"
                           << (opts.classes > 0    ? " (model.classes)"
                               : check_classes > 0 ? " (the file's classes attribute)"
                                                   : "");
    }
    labels_[i] = static_cast<int32_t>(v);
  }
}

void Hdf5Dataset::ReadAttributes() {
  const std::string& path = info_.path;
  const int64_t c = info_.sample_shape[0];
  for (const char* name : {"mean", "std"}) {
    if (H5Aexists(file_.get(), name) <= 0) continue;
    h5::Id a = h5::Attr(H5Aopen(file_.get(), name, H5P_DEFAULT));
    h5::Id at = h5::Type(H5Aget_type(a.get()));
    h5::Id as = h5::Space(H5Aget_space(a.get()));
    const H5T_class_t cls = H5Tget_class(at.get());
    const int64_t n = H5Sget_simple_extent_npoints(as.get());
    if ((cls != H5T_INTEGER && cls != H5T_FLOAT) || (n != 1 && n != c)) {
      DPT_THROW(DataError) << path << ": /images: attribute " << name << " must be 1 or C = " << c
                           << " numbers, got " << n << " of " << h5::TypeName(at.get());
    }
    std::vector<float> v(static_cast<size_t>(n));
    DPT_H5_CHECK_AS(DataError, H5Aread(a.get(), H5T_NATIVE_FLOAT, v.data()))
        << path << ": /images: cannot read attribute " << name;
    for (float x : v) {
      if (!std::isfinite(x) || (std::string(name) == "std" && x <= 0)) {
        DPT_THROW(DataError) << path << ": /images: attribute " << name << " has value " << x;
      }
    }
    (std::string(name) == "mean" ? info_.mean : info_.std) = std::move(v);
  }
}

void Hdf5Dataset::ReadRows(int64_t first, int64_t rows, uint8_t* out) const {
  h5::Id fspace = h5::Space(H5Dget_space(images_.get()));
  std::vector<hsize_t> start(static_cast<size_t>(H5Sget_simple_extent_ndims(fspace.get())), 0);
  std::vector<hsize_t> count(start.size());
  H5Sget_simple_extent_dims(fspace.get(), count.data(), nullptr);
  start[0] = static_cast<hsize_t>(first);
  count[0] = static_cast<hsize_t>(rows);
  // The memory space has the selection's shape: with a flat 1-D memory space HDF5 falls back
  // to element-wise span iteration (~50 ms per 1 MiB chunk instead of well under 1 ms).
  h5::Id mspace =
      h5::Space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  const hid_t mtype = info_.image_dtype == DType::kU8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT;
  if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                          nullptr) < 0 ||
      H5Dread(images_.get(), mtype, mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0) {
    DPT_THROW(DataError) << info_.path << ": /images: cannot read samples [" << first << ", "
                         << first + rows << "): " << h5::ErrorStackString();
  }
}

void Hdf5Dataset::CheckFinite(const uint8_t* block, int64_t first_sample, int64_t rows) const {
  const int64_t total = rows * sample_numel_;
  for (int64_t i = 0; i < total; ++i) {
    float v;
    std::memcpy(&v, block + i * 4, sizeof(v));  // the bytes came from H5Dread as native floats
    if (!std::isfinite(v)) {
      const int64_t s = first_sample + i / sample_numel_;
      DPT_THROW(DataError) << info_.path << ": /images: non-finite pixel " << v << " in sample "
                           << s << " at element " << i % sample_numel_ << " of "
                           << info_.sample_shape.ToString();
    }
  }
}

Hdf5Dataset::Block Hdf5Dataset::GetBlock(int64_t b) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(b);
    if (it != blocks_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  // Miss: read outside our lock (a thread-safe HDF5 serialises internally); two threads missing
  // the same block both read it, and the second insert is dropped. An HDF5 built without
  // thread safety gets one process-wide lock around the read instead.
  const int64_t first = b * block_rows_;
  const int64_t rows = std::min(block_rows_, info_.size - first);
  auto data = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rows) * sample_bytes_);
  {
    static std::mutex unsafe_library_mu;
    static const bool threadsafe = [] {
      hbool_t ts = 0;
      return H5is_library_threadsafe(&ts) >= 0 && ts > 0;
    }();
    std::unique_lock<std::mutex> serial(unsafe_library_mu, std::defer_lock);
    if (!threadsafe) serial.lock();
    h5::ScopedSilence silence;
    ReadRows(first, rows, data->data());
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = blocks_.find(b);
  if (it != blocks_.end()) return it->second.first;
  lru_.push_front(b);
  blocks_.emplace(b, std::make_pair(Block(data), lru_.begin()));
  while (blocks_.size() > max_blocks_) {
    blocks_.erase(lru_.back());
    lru_.pop_back();
  }
  return data;
}

void Hdf5Dataset::Convert(const uint8_t* sample, float* out) const {
  if (info_.image_dtype == DType::kU8) {
    const auto& table = U8ToFloat();
    for (int64_t i = 0; i < sample_numel_; ++i) out[i] = table[sample[i]];
  } else {
    std::memcpy(out, sample, sample_bytes_);
  }
}

void Hdf5Dataset::Read(const int64_t* indices, int64_t count, float* images, int32_t* labels) {
  for (int64_t i = 0; i < count; ++i) {
    DPT_CHECK(indices[i] >= 0 && indices[i] < info_.size)
        << info_.path << ": sample index " << indices[i] << " outside [0, " << info_.size << ")";
    labels[i] = labels_[static_cast<size_t>(indices[i])];
  }
  if (in_ram_) {
    for (int64_t i = 0; i < count; ++i) {
      Convert(ram_.data() + static_cast<size_t>(indices[i]) * sample_bytes_,
              images + i * sample_numel_);
    }
    return;
  }
  // Group the requested samples by block so each needed block is fetched once per call.
  std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(count));  // (block, i)
  for (int64_t i = 0; i < count; ++i) order[static_cast<size_t>(i)] = {indices[i] / block_rows_, i};
  std::sort(order.begin(), order.end());
  size_t k = 0;
  while (k < order.size()) {
    const int64_t b = order[k].first;
    const Block block = GetBlock(b);
    for (; k < order.size() && order[k].first == b; ++k) {
      const int64_t i = order[k].second;
      const int64_t row = indices[i] - b * block_rows_;
      Convert(block->data() + static_cast<size_t>(row) * sample_bytes_, images + i * sample_numel_);
    }
  }
}

void Fsync(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;  // best effort: the rename below still publishes a complete file
  ::fsync(fd);
  ::close(fd);
}

void WriteDataset(const std::string& path, H5Elem elem, const void* images,
                  const Shape& images_shape, const int32_t* labels, int64_t classes,
                  const std::vector<float>& mean, const std::vector<float>& std) {
  DPT_CHECK_AS(DataError, images_shape.rank() == 4)
      << path << ": /images shape " << images_shape.ToString() << " is not [N, C, H, W]";
  const int64_t n = images_shape[0];
  DPT_CHECK_AS(DataError, n > 0) << path << ": /images: no samples to write (N = 0)";
  for (int i = 1; i < 4; ++i) {
    DPT_CHECK_AS(DataError, images_shape[i] > 0)
        << path << ": /images: empty sample shape " << images_shape.ToString();
  }
  const int64_t sample_numel = images_shape.numel() / n;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = labels[i];
    if (v < 0 || (classes > 0 && v >= classes)) {
      DPT_THROW(DataError) << path << ": /labels: label " << v << " at index " << i
                           << " is outside [0, " << classes << ")";
    }
  }
  if (elem == H5Elem::kF32) {
    const float* p = static_cast<const float*>(images);
    for (int64_t i = 0; i < n * sample_numel; ++i) {
      if (!std::isfinite(p[i])) {
        DPT_THROW(DataError) << path << ": /images: non-finite pixel " << p[i] << " in sample "
                             << i / sample_numel;
      }
    }
  }
  for (const auto* v : {&mean, &std}) {
    DPT_CHECK_AS(DataError,
                 v->empty() || v->size() == 1 || static_cast<int64_t>(v->size()) == images_shape[1])
        << path << ": mean/std need 1 or C = " << images_shape[1] << " values, got " << v->size();
  }
  const size_t sample_bytes = static_cast<size_t>(sample_numel) * (elem == H5Elem::kU8 ? 1 : 4);
  const int64_t chunk_rows = std::min<int64_t>(
      n, std::max<int64_t>(1, static_cast<int64_t>(kTargetBlockBytes / sample_bytes)));

  const std::string tmp = path + ".tmp";
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  try {
    Hdf5Writer w(tmp);
    w.WriteArray("/images", elem, images_shape.dims(), images, chunk_rows);
    w.WriteArray("/labels", H5Elem::kI32, {n}, labels, 0);
    if (classes > 0) w.SetIntAttr("/", "classes", classes);
    if (!mean.empty()) w.SetFloatsAttr("/", "mean", mean);
    if (!std.empty()) w.SetFloatsAttr("/", "std", std);
    w.Close();
  } catch (...) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
  Fsync(tmp);
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    DPT_THROW(IoError) << path << ": cannot rename " << tmp << " to it: " << why;
  }
}

}  // namespace

std::unique_ptr<Dataset> OpenHdf5Dataset(const std::string& path, const OpenOptions& opts) {
  return std::make_unique<Hdf5Dataset>(path, opts);
}

void WriteHdf5Dataset(const std::string& path, const uint8_t* images, const Shape& images_shape,
                      const int32_t* labels, int64_t classes, const std::vector<float>& mean,
                      const std::vector<float>& std) {
  WriteDataset(path, H5Elem::kU8, images, images_shape, labels, classes, mean, std);
}

void WriteHdf5Dataset(const std::string& path, const float* images, const Shape& images_shape,
                      const int32_t* labels, int64_t classes, const std::vector<float>& mean,
                      const std::vector<float>& std) {
  WriteDataset(path, H5Elem::kF32, images, images_shape, labels, classes, mean, std);
}

}  // namespace dptrain
