// SPDX-License-Identifier: Apache-2.0
// The in-memory dataset (synthetic data and tests). The HDF5 dataset is in hdf5_dataset*.cc.
#include "datasets/dataset.h"

#include <algorithm>

#include "core/error.h"

namespace dptrain {
namespace {

class MemoryDataset final : public Dataset {
 public:
  MemoryDataset(std::vector<float> images, std::vector<int32_t> labels, Shape sample_shape)
      : images_(std::move(images)), labels_(std::move(labels)) {
    info_.path = "<memory>";
    info_.size = static_cast<int64_t>(labels_.size());
    info_.sample_shape = std::move(sample_shape);
    info_.image_dtype = DType::kF32;
    sample_numel_ = info_.sample_shape.numel();
    DPT_CHECK_AS(DataError, info_.size > 0) << "in-memory dataset: no samples";
    DPT_CHECK_AS(DataError, sample_numel_ > 0)
        << "in-memory dataset: empty sample shape " << info_.sample_shape.ToString();
    DPT_CHECK_AS(DataError, static_cast<int64_t>(images_.size()) == info_.size * sample_numel_)
        << "in-memory dataset: " << images_.size() << " image values for " << info_.size
        << " samples of shape " << info_.sample_shape.ToString();
    for (size_t i = 0; i < labels_.size(); ++i) {
      DPT_CHECK_AS(DataError, labels_[i] >= 0)
          << "in-memory dataset: label " << labels_[i] << " at index " << i << " is negative";
    }
  }

  const DatasetInfo& info() const override { return info_; }

  void Read(const int64_t* indices, int64_t count, float* images, int32_t* labels) override {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t idx = indices[i];
      DPT_CHECK(idx >= 0 && idx < info_.size)
          << "sample index " << idx << " outside [0, " << info_.size << ")";
      std::copy_n(images_.data() + idx * sample_numel_, sample_numel_, images + i * sample_numel_);
      labels[i] = labels_[static_cast<size_t>(idx)];
    }
  }

 private:
  DatasetInfo info_;
  std::vector<float> images_;
  std::vector<int32_t> labels_;
  int64_t sample_numel_ = 0;
};

}  // namespace

std::unique_ptr<Dataset> MakeMemoryDataset(std::vector<float> images, std::vector<int32_t> labels,
                                           Shape sample_shape) {
  return std::make_unique<MemoryDataset>(std::move(images), std::move(labels),
                                         std::move(sample_shape));
}

}  // namespace dptrain
