// SPDX-License-Identifier: Apache-2.0
// The HDF5 dataset class, private to datasets/ (scripts/check-floors.sh): shared by
// hdf5_dataset.cc (open and validation), hdf5_dataset_read.cc (reads: RAM copy or an LRU of whole
// decoded chunks) and hdf5_dataset_write.cc (WriteHdf5Dataset). Users see datasets/dataset.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/hdf5/hdf5_util.h"
#include "datasets/dataset.h"

namespace dptrain {

inline constexpr size_t kTargetBlockBytes = size_t(1)
                                            << 20;  // ~1 MiB per chunk (writer and reader)

class Hdf5Dataset final : public Dataset {
 public:
  Hdf5Dataset(const std::string& path, const OpenOptions& opts);
  const DatasetInfo& info() const override { return info_; }
  void Read(const int64_t* indices, int64_t count, float* images, int32_t* labels) override;
  bool ReadU8(const int64_t* indices, int64_t count, uint8_t* images, int32_t* labels) override;

 private:
  using Block = std::shared_ptr<const std::vector<uint8_t>>;

  void OpenImages();
  void OpenLabels(const OpenOptions& opts);
  void ReadAttributes();
  void CheckFinite(const uint8_t* block, int64_t first_sample, int64_t rows) const;
  // Reads rows [first, first + rows) of /images in the stored element type.
  void ReadRows(int64_t first, int64_t rows, uint8_t* out) const;
  Block GetBlock(int64_t b);
  // Labels of `indices`, then put(stored sample, i) for each: from RAM or from cached blocks.
  template <class Put>
  void ReadSamples(const int64_t* indices, int64_t count, int32_t* labels, const Put& put);
  void Convert(const uint8_t* sample, float* out) const;

  DatasetInfo info_;
  h5::Id file_;
  h5::Id images_;
  int64_t sample_numel_ = 0;
  size_t elem_bytes_ = 1;    // stored bytes per pixel: 1 (uint8) or 4 (float32)
  size_t sample_bytes_ = 0;  // stored bytes per sample
  std::vector<int32_t> labels_;
  int64_t file_classes_ = -1;  // the file's own classes attribute (-1: none)

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

}  // namespace dptrain
