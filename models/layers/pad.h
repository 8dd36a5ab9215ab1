// SPDX-License-Identifier: Apache-2.0
// Zero padding of the image planes, as torch.nn.ZeroPad2d / F.pad(x, (left, right, top, bottom))
// and ONNX Pad in constant mode; negative amounts crop. The importer also puts one in front of a
// convolution whose padding differs between sides.
#pragma once

#include <string>

#include "models/layer.h"

namespace dptrain {

class Pad2d final : public Layer {
 public:
  Pad2d(Backend& be, std::string name, int64_t top, int64_t left, int64_t bottom, int64_t right)
      : Layer(be, std::move(name)), top_(top), left_(left), bottom_(bottom), right_(right) {}
  std::string type() const override { return "pad"; }
  Shape Setup(const Shape& in, const SetupOptions& opts) override;
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx) override;
  const Tensor& Backward(const Tensor& dy, bool accumulate) override;
  int64_t ActivationBytesPerSample() const override {
    return 4 * (out_per_sample_ + in_per_sample_);
  }

 private:
  int64_t top_, left_, bottom_, right_;
  int64_t in_per_sample_ = 0, out_per_sample_ = 0;
  Tensor out_, dx_buf_, y_, dx_;
};

}  // namespace dptrain
