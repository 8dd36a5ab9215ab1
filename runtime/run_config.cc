// SPDX-License-Identifier: Apache-2.0
// The facts derived from a TrainConfig in one place: the loss and the default sample shape.
#include "runtime/run_config.h"

#include "models/zoo/zoo.h"

namespace dptrain {

LossKind ResolveLoss(const ModelConfig& m) {
  switch (m.loss) {
    case LossChoice::kCrossEntropy:
      return LossKind::kCrossEntropy;
    case LossChoice::kMse:
      return LossKind::kMse;
    case LossChoice::kAuto:
      break;
  }
  return m.name.empty() ? LossKind::kCrossEntropy : DefaultLoss(m.name);
}

Shape DefaultSampleShape(const ModelConfig& m) {
  return m.name.empty() ? Shape{1, 28, 28} : DefaultInputShape(m.name);
}

}  // namespace dptrain
