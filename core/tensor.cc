// SPDX-License-Identifier: Apache-2.0
// Shape and Tensor bookkeeping; no data movement happens here.
#include "core/tensor.h"

#include "core/error.h"
#include "core/memory/caching_allocator.h"

namespace dptrain {

size_t SizeOf(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kU8:
      return 1;
    case DType::kI32:
      return 4;
  }
  return 0;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

const char* DeviceName(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

Shape Shape::WithBatch(int64_t n) const {
  Shape s = *this;
  DPT_CHECK(!s.dims_.empty());
  s.dims_[0] = n;
  return s;
}

std::string Shape::ToString() const {
  std::string s = "[";
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[i]);
  }
  return s + "]";
}

Buffer::~Buffer() {
  if (owner_ != nullptr) owner_->Release(ptr_, bytes_);
}

void Buffer::RecordStream(void* stream) const {
  if (owner_ != nullptr) owner_->RecordStream(ptr_, stream);
  if (parent_ != nullptr) parent_->RecordStream(stream);
}

void Buffer::FenceStreamUse(void* stream) const {
  if (owner_ != nullptr) owner_->FenceStreamUse(ptr_, stream);
  if (parent_ != nullptr) parent_->FenceStreamUse(stream);
}

std::shared_ptr<Buffer> Buffer::Unbound(size_t bytes, Device device, std::string label) {
  return std::make_shared<Buffer>(nullptr, nullptr, bytes, device, std::move(label));
}

void Buffer::Bind(std::shared_ptr<Buffer> parent, size_t offset) {
  DPT_CHECK(owner_ == nullptr && parent_ == nullptr && parent != nullptr &&
            parent->device() == device_ && offset + bytes_ <= parent->bytes())
      << "buffer '" << label_ << "' (" << bytes_ << " bytes, "
      << (parent_ != nullptr ? "placed already" : "unbound") << ") cannot be placed at " << offset
      << " in '" << (parent ? parent->label() : "") << "'";
  ptr_ = static_cast<char*>(parent->data()) + offset;
  parent_ = std::move(parent);
}

Tensor::Tensor(std::shared_ptr<Buffer> buffer, Shape shape, DType dtype, size_t offset_bytes)
    : buffer_(std::move(buffer)), shape_(std::move(shape)), dtype_(dtype), offset_(offset_bytes) {
  DPT_CHECK(buffer_ != nullptr);
  for (int64_t d : shape_.dims())
    DPT_CHECK(d >= 0) << "negative dimension in " << shape_.ToString();
  DPT_CHECK(offset_ + bytes() <= buffer_->bytes())
      << "view " << shape_.ToString() << " " << DTypeName(dtype_) << " at offset " << offset_
      << " exceeds buffer of " << buffer_->bytes() << " bytes";
}

Tensor Tensor::View(Shape shape, size_t offset_bytes) const {
  return Tensor(buffer_, std::move(shape), dtype_, offset_ + offset_bytes);
}

Tensor Tensor::View(Shape shape, DType dtype, size_t offset_bytes) const {
  return Tensor(buffer_, std::move(shape), dtype, offset_ + offset_bytes);
}

Tensor Tensor::Batch(int64_t n) const {
  DPT_CHECK(shape_.rank() >= 1 && n <= shape_[0]) << "batch " << n << " of " << shape_.ToString();
  return Tensor(buffer_, shape_.WithBatch(n), dtype_, offset_);
}

}  // namespace dptrain
