// SPDX-License-Identifier: Apache-2.0
// Backend helpers shared by every implementation and descriptor printing.
#include "core/backend.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "core/error.h"

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

void Backend::Conv2dBackward(const OpPlan& plan, const Tensor& x, const Tensor& dy, const Tensor& w,
                             Tensor* dx, Tensor* dw, Tensor* db, bool accumulate) {
  Conv2dBackwardWeights(plan, x, dy, dw, db, accumulate);
  if (dx != nullptr) Conv2dBackwardData(plan, dy, w, dx);
}

void Backend::LinearBackward(const OpPlan& plan, const Tensor& x, const Tensor& dy, const Tensor& w,
                             Tensor* dx, Tensor* dw, Tensor* db, bool accumulate) {
  LinearBackwardWeights(plan, x, dy, dw, db, accumulate);
  if (dx != nullptr) LinearBackwardData(plan, dy, w, dx);
}

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Backend::OpScope::OpScope(Backend* be, const char* name) : be_(be), name_(name) {
  if (!be_->profiling_) return;
  if (be_->TimesOpsOnDevice()) {
    timer_ = be_->StartDeviceTimer();
  } else {
    start_ns_ = NowNs();
  }
}

Backend::OpScope::~OpScope() {
  // A device timer started is always stopped (even if profiling was switched off meanwhile), so
  // the backend never holds an open timer; a scope that started without profiling records nothing.
  const bool on_device = timer_ >= 0;
  if (!on_device && (!be_->profiling_ || start_ns_ == 0)) return;  // the hot path: nothing
  // Timed on the host: wait for the op so the wall time covers its device work. A failing
  // synchronisation (a sticky CUDA error) must not escape a destructor: the sample is dropped and
  // the next checked call reports the error.
  if (!on_device) {
    try {
      be_->Synchronize();
    } catch (...) {
      return;
    }
  }
  const std::string& node = be_->profile_node_ != nullptr ? *be_->profile_node_ : std::string();
  OpStat& s = be_->stats_[{node, name_}];
  s.name = name_;
  s.node = node;
  ++s.calls;
  s.flops += flops_;
  if (on_device) {
    be_->StopDeviceTimer(timer_, &s);
  } else {
    s.seconds += static_cast<double>(NowNs() - start_ns_) * 1e-9;
  }
}

std::vector<OpStat> Backend::Profile() {
  FlushDeviceTimers();
  std::vector<OpStat> out;
  for (const auto& [name, s] : stats_) out.push_back(s);
  std::sort(out.begin(), out.end(),
            [](const OpStat& a, const OpStat& b) { return a.seconds > b.seconds; });
  return out;
}

void Backend::ResetProfile() {
  FlushDeviceTimers();  // timers in flight point into the stats:
  DropDeviceTimers();   // those still open (inside an op) no longer do
  stats_.clear();
}

BatchNormDims BatchNormShape(const Shape& x) {
  DPT_CHECK(x.rank() == 2 || x.rank() == 4) << "batch norm input " << x.ToString();
  return {x[0], x[1], x.rank() == 4 ? x[2] * x[3] : 1};
}

ColumnCopy CheckColumnCopy(const Tensor& src, int64_t src_col, const Tensor& dst, int64_t dst_col,
                           int64_t cols) {
  DPT_CHECK(src.dtype() == DType::kF32 && dst.dtype() == DType::kF32) << "CopyColumns: f32 only";
  DPT_CHECK(src.shape().rank() >= 1 && dst.shape().rank() >= 1 && src.shape()[0] == dst.shape()[0])
      << "CopyColumns: " << src.shape().ToString() << " into " << dst.shape().ToString();
  const int64_t rows = src.shape()[0];
  ColumnCopy c{rows, rows > 0 ? src.numel() / rows : 0, rows > 0 ? dst.numel() / rows : 0};
  DPT_CHECK(cols >= 0 && src_col >= 0 && dst_col >= 0 && src_col + cols <= c.src_pitch &&
            dst_col + cols <= c.dst_pitch)
      << "CopyColumns: columns [" << src_col << ", " << src_col + cols << ") of rows of "
      << c.src_pitch << " into [" << dst_col << ", " << dst_col + cols << ") of rows of "
      << c.dst_pitch;
  return c;
}

PadDims CheckPad2d(const Tensor& x, const Tensor& y) {
  DPT_CHECK(x.dtype() == DType::kF32 && y.dtype() == DType::kF32) << "Pad2d: f32 only";
  const Shape& a = x.shape();
  const Shape& b = y.shape();
  DPT_CHECK(a.rank() == 4 && b.rank() == 4 && a[0] == b[0] && a[1] == b[1])
      << "Pad2d: " << a.ToString() << " into " << b.ToString();
  DPT_CHECK(x.raw() != y.raw()) << "Pad2d: y aliases x";
  return PadDims{a[0] * a[1], a[2], a[3], b[2], b[3]};
}

LayoutDims CheckLayoutChange(const Tensor& x, const Tensor& y, const char* op) {
  DPT_CHECK(x.dtype() == DType::kF32 && y.dtype() == DType::kF32) << op << ": f32 only";
  const Shape& s = x.shape();
  DPT_CHECK(s.rank() == 4 && y.shape() == s)
      << op << ": " << s.ToString() << " into " << y.shape().ToString();
  DPT_CHECK(x.raw() != y.raw()) << op << ": y aliases x";
  return LayoutDims{s[0], s[1], s[2] * s[3]};
}

int64_t RowLength(int64_t n, int64_t rows, const char* op) {
  DPT_CHECK(rows > 0 && n % rows == 0) << op << ": " << n << " values in rows of " << rows;
  return n / rows;
}

std::string Conv2dDesc::ToString() const {
  std::ostringstream os;
  os << "conv2d x=(" << n << "," << c << "," << h << "," << w << ") k=" << k << " kernel=" << r
     << "x" << s << " stride=" << stride << " pad=" << pad;
  if (groups != 1) os << " groups=" << groups;
  if (dilation != 1) os << " dilation=" << dilation;
  os << " bias=" << bias << (relu ? " relu" : "") << " " << PrecisionName(precision);
  if (x_nhwc || y_nhwc) os << " nhwc=" << (x_nhwc ? "x" : "") << (y_nhwc ? "y" : "");
  if (dy_bf16) os << " dy=bf16";
  if (x_bf16) os << " x=bf16";
  if (y_bf16) os << " y=bf16";
  if (dx_sub) os << " dx=sampled";
  return os.str();
}

bool Conv2dDesc::Valid() const {
  return n > 0 && c > 0 && h > 0 && w > 0 && k > 0 && r > 0 && s > 0 && stride > 0 && pad >= 0 &&
         groups > 0 && dilation > 0 && c % groups == 0 && k % groups == 0 && out_h() > 0 &&
         out_w() > 0;
}

bool ConvPoolDesc::Valid() const {
  const Conv2dDesc& c = conv;
  const PoolDesc& p = pool;
  return c.Valid() && c.relu && c.groups == 1 && c.dilation == 1 && c.stride == 1 &&
         c.c <= kMaxInputChannels && p.Valid() && p.kind == PoolKind::kMax && p.n == c.n &&
         p.c == c.k && p.h == c.out_h() && p.w == c.out_w() && p.kernel == 2 && p.stride == 2 &&
         p.pad == 0 && p.out_h() == p.h / 2 && p.out_w() == p.w / 2;
}

std::string ConvPoolDesc::ToString() const { return conv.ToString() + " + " + pool.ToString(); }

std::string LinearDesc::ToString() const {
  std::ostringstream os;
  os << "linear x=(" << n << "," << in << ") out=" << out << " bias=" << bias << " "
     << PrecisionName(precision);
  return os.str();
}

int64_t PoolDesc::OutSize(int64_t in) const {
  const int64_t span = in + 2 * pad - kernel;
  if (span < 0 || stride <= 0) return 0;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  // PyTorch's rule: the last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

bool PoolDesc::Valid() const {
  return n > 0 && c > 0 && h > 0 && w > 0 && kernel > 0 && stride > 0 && pad >= 0 &&
         pad * 2 <= kernel && out_h() > 0 && out_w() > 0;
}

std::string PoolDesc::ToString() const {
  std::ostringstream os;
  os << (kind == PoolKind::kMax ? "maxpool" : "avgpool") << " x=(" << n << "," << c << "," << h
     << "," << w << ") kernel=" << kernel << " stride=" << stride << " pad=" << pad;
  if (ceil_mode) os << " ceil_mode";
  if (kind == PoolKind::kAvg && !count_include_pad) os << " count_include_pad=0";
  if (nhwc) os << (y_nchw ? " nhwc y=nchw" : " nhwc");
  if (dx_bf16) os << " dx=bf16";
  return os.str();
}

}  // namespace dptrain
