// SPDX-License-Identifier: Apache-2.0
// Backend helpers shared by every implementation and descriptor printing.
#include "runtime/backend.h"

#include <sstream>

namespace dptrain {

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kF32:
      return "fp32";
    case Precision::kBF16:
      return "bf16";
    case Precision::kF16:
      return "fp16";
  }
  return "?";
}

Tensor Backend::Empty(const Shape& shape, DType dtype, std::string_view label) {
  const size_t bytes = static_cast<size_t>(shape.numel()) * SizeOf(dtype);
  return Tensor(allocator_->Allocate(bytes, label), shape, dtype);
}

Tensor Backend::Zeros(const Shape& shape, DType dtype, std::string_view label) {
  Tensor t = Empty(shape, dtype, label);
  Zero(&t);
  return t;
}

std::string Conv2dDesc::ToString() const {
  std::ostringstream os;
  os << "conv2d x=(" << n << "," << c << "," << h << "," << w << ") k=" << k << " kernel=" << r
     << "x" << s << " stride=" << stride << " pad=" << pad << " bias=" << bias << " "
     << PrecisionName(precision);
  return os.str();
}

std::string LinearDesc::ToString() const {
  std::ostringstream os;
  os << "linear x=(" << n << "," << in << ") out=" << out << " bias=" << bias << " "
     << PrecisionName(precision);
  return os.str();
}

std::string PoolDesc::ToString() const {
  std::ostringstream os;
  os << (kind == PoolKind::kMax ? "maxpool" : "avgpool") << " x=(" << n << "," << c << "," << h
     << "," << w << ") kernel=" << kernel << " stride=" << stride << " pad=" << pad;
  return os.str();
}

}  // namespace dptrain
