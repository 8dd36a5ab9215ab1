// SPDX-License-Identifier: Apache-2.0
// Shape, DType and Tensor: a typed, shaped view over a Buffer of device memory that a Backend's
// allocator owns. Tensors are cheap handles (shared ownership of the buffer); copying a Tensor
// never copies data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace dptrain {

enum class DType : uint8_t { kF32, kF16, kBF16, kU8, kI32 };
size_t SizeOf(DType t);
const char* DTypeName(DType t);  // "f32", "bf16", ...

enum class Device : uint8_t { kCpu, kCuda };
const char* DeviceName(Device d);  // "cpu", "cuda"

// Dimensions, outermost first: (N, C, H, W) for images, (N, F) for features.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;  // 1 for rank 0
  const std::vector<int64_t>& dims() const { return dims_; }
  // Same shape with dimension 0 replaced (the batch dimension).
  Shape WithBatch(int64_t n) const;
  std::string ToString() const;  // "[64, 1, 28, 28]"
  bool operator==(const Shape& o) const { return dims_ == o.dims_; }
  bool operator!=(const Shape& o) const { return dims_ != o.dims_; }

 private:
  std::vector<int64_t> dims_;
};

class CachingAllocator;

// A block of memory on one device. Returned to its allocator when the last Tensor that views it
// is destroyed; the allocator must outlive it (backends live for the whole process).
class Buffer {
 public:
  Buffer(CachingAllocator* owner, void* ptr, size_t bytes, Device device, std::string label)
      : owner_(owner), ptr_(ptr), bytes_(bytes), device_(device), label_(std::move(label)) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  const std::string& label() const { return label_; }
  // This memory is also used by work queued on `stream` (a cudaStream_t other than the compute
  // stream): its block is not reused before that work completes (CachingAllocator::RecordStream).
  void RecordStream(void* stream) const;
  // The work queued on `stream` so far is its last use there (CachingAllocator::FenceStreamUse).
  void FenceStreamUse(void* stream) const;

  // A buffer whose memory is a part of another, given later: Graph's shared input-gradient
  // buffers are created while the layers are set up and placed once all their sizes and
  // lifetimes are known. Until Bind, data() is null.
  static std::shared_ptr<Buffer> Unbound(size_t bytes, Device device, std::string label);
  // Places this unbound buffer at `offset` bytes into `parent` (kept alive by this buffer).
  void Bind(std::shared_ptr<Buffer> parent, size_t offset);

 private:
  CachingAllocator* owner_;
  std::shared_ptr<Buffer> parent_;  // Unbound buffers: the memory they are a part of
  void* ptr_;
  size_t bytes_;
  Device device_;
  std::string label_;
};

// A dense, row-major (C-contiguous) view: element (i0, ..., ik) is at offset
// sum(i_j * stride_j) with strides from the shape. Never owns a partial layout.
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buffer, Shape shape, DType dtype, size_t offset_bytes = 0);

  bool defined() const { return buffer_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return buffer_->device(); }
  int64_t numel() const { return shape_.numel(); }
  size_t bytes() const { return static_cast<size_t>(numel()) * SizeOf(dtype_); }
  const std::shared_ptr<Buffer>& buffer() const { return buffer_; }
  size_t offset_bytes() const { return offset_; }

  void* raw() const { return static_cast<char*>(buffer_->data()) + offset_; }
  template <class T>
  T* data() const {
    return static_cast<T*>(raw());
  }

  // A view of the same memory with another shape and byte offset; must fit in the buffer.
  Tensor View(Shape shape, size_t offset_bytes = 0) const;
  Tensor View(Shape shape, DType dtype, size_t offset_bytes) const;
  // The first n entries along dimension 0 (a smaller batch in a buffer sized for the largest).
  Tensor Batch(int64_t n) const;

 private:
  std::shared_ptr<Buffer> buffer_;
  Shape shape_;
  DType dtype_ = DType::kF32;
  size_t offset_ = 0;
};

}  // namespace dptrain
