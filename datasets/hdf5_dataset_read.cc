// SPDX-License-Identifier: Apache-2.0
// HDF5 dataset reads: the whole file in RAM, or an LRU of whole decoded blocks (whole HDF5 chunks
// along N). Whole-chunk reads matter: a random 64-sample hyperslab read through HDF5's default
// 1 MiB chunk cache decodes each touched chunk again per sample (~15x slower).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/hdf5/hdf5_util.h"
#include "datasets/hdf5_dataset_impl.h"

namespace dptrain {
namespace {

// x / 255 for every uint8 value: exact division, same result as a per-pixel divide.
const std::array<float, 256>& U8ToFloat() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = static_cast<float>(i) / 255.0f;
    return t;
  }();
  return table;
}

}  // namespace

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
  ReadSamples(indices, count, labels, [&](const uint8_t* sample, int64_t i) {
    Convert(sample, images + i * sample_numel_);
  });
}

bool Hdf5Dataset::ReadU8(const int64_t* indices, int64_t count, uint8_t* images, int32_t* labels) {
  if (info_.image_dtype != DType::kU8) return false;
  ReadSamples(indices, count, labels, [&](const uint8_t* sample, int64_t i) {
    std::memcpy(images + i * sample_numel_, sample, sample_bytes_);
  });
  return true;
}

template <class Put>
void Hdf5Dataset::ReadSamples(const int64_t* indices, int64_t count, int32_t* labels,
                              const Put& put) {
  for (int64_t i = 0; i < count; ++i) {
    DPT_CHECK(indices[i] >= 0 && indices[i] < info_.size)
        << info_.path << ": sample index " << indices[i] << " outside [0, " << info_.size << ")";
    labels[i] = labels_[static_cast<size_t>(indices[i])];
  }
  if (in_ram_) {
    for (int64_t i = 0; i < count; ++i) {
      put(ram_.data() + static_cast<size_t>(indices[i]) * sample_bytes_, i);
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
      put(block->data() + static_cast<size_t>(row) * sample_bytes_, i);
    }
  }
}

}  // namespace dptrain
