// SPDX-License-Identifier: Apache-2.0
// WriteHdf5Dataset: validates images, labels and attributes, writes the dataset file layout
// (chunked /images of ~1 MiB chunks, /labels, classes / mean / std attributes) to a temporary
// file and renames it into place, so a reader never sees a partial file.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "datasets/dataset.h"
#include "datasets/hdf5_dataset_impl.h"
#include "datasets/hdf5_writer.h"

namespace dptrain {
namespace {

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
