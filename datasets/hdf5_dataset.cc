// SPDX-License-Identifier: Apache-2.0
// The HDF5 dataset: opening a dataset file and validating it (/images dtype and shape, /labels,
// the classes / mean / std attributes, sizes against the file's), choosing the cache mode and
// block size, and OpenHdf5Dataset. Reads are in hdf5_dataset_read.cc, writing in
// hdf5_dataset_write.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "core/hdf5/hdf5_util.h"
#include "core/util/strings.h"
#include "datasets/dataset.h"
#include "datasets/hdf5_dataset_impl.h"

namespace dptrain {
namespace {

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

}  // namespace

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
    info_.classes = file_classes_ = static_cast<int64_t>(v);
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
  if (H5Aexists(file_.get(), "class_names") > 0) {
    h5::Id a = h5::Attr(H5Aopen(file_.get(), "class_names", H5P_DEFAULT));
    const std::optional<std::string> text = h5::ReadStringAttr(a.get());
    if (!text) {
      DPT_THROW(DataError) << path << ": attribute class_names must be one string (the names "
                           << "joined by newlines)";
    }
    info_.class_names = SplitLines(*text);
    if (file_classes_ > 0 && static_cast<int64_t>(info_.class_names.size()) != file_classes_) {
      DPT_THROW(DataError) << path << ": attribute class_names has " << info_.class_names.size()
                           << " names but the file's classes attribute is " << file_classes_;
    }
  }
}

std::unique_ptr<Dataset> OpenHdf5Dataset(const std::string& path, const OpenOptions& opts) {
  return std::make_unique<Hdf5Dataset>(path, opts);
}

}  // namespace dptrain
