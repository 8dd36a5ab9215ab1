// SPDX-License-Identifier: Apache-2.0
// Checkpoint files: atomic writes (temporary name, fsync, rename, fsync of the directory), reads
// that verify every tensor's CRC-32, matching against a model, the background writer and the
// `dptrain inspect` description. HDF5 through the RAII helpers of core/hdf5/hdf5_util.h.
#include "runtime/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/hdf5/hdf5_util.h"
#include "core/util/strings.h"

#ifndef DPTRAIN_VERSION
#define DPTRAIN_VERSION "unknown"
#endif

namespace dptrain {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kModulePrefix = "module.";

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* DTypeName(CheckpointDType d) {
  return d == CheckpointDType::kF32 ? "float32" : "int64";
}

uint32_t TensorCrc(const CheckpointTensor& t) {
  return t.dtype == CheckpointDType::kF32 ? Crc32(t.f32.data(), t.f32.size() * sizeof(float))
                                          : Crc32(t.i64.data(), t.i64.size() * sizeof(int64_t));
}

// ---------------------------------------------------------------------------------------------
// Writing.

// Builds the file in memory (HDF5's core driver without a backing store): HDF5 never touches the
// disk, so every disk error (a full disk above all) is ours to report with errno, and nothing is
// left half-open inside the HDF5 library when the disk fails.
class ImageWriter {
 public:
  ImageWriter(const std::string& name, const std::string& final_path, size_t expected_bytes)
      : final_(final_path) {
    h5::Id fapl = h5::Plist(H5Pcreate(H5P_FILE_ACCESS));
    H5Pset_fapl_core(fapl.get(), std::max<size_t>(expected_bytes, size_t{1} << 20), 0);
    file_ = h5::File(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()));
    if (!file_.valid()) Fail("cannot create the HDF5 image", h5::ErrorStackString());
    lcpl_ = h5::Plist(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(lcpl_.get(), 1);
  }

  void Group(const std::string& name) {
    h5::Id g =
        h5::Group(H5Gcreate2(file_.get(), name.c_str(), lcpl_.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!g.valid()) Fail("cannot create group " + name, h5::ErrorStackString());
  }

  void Tensor(const std::string& name, const CheckpointTensor& t) {
    const bool f32 = t.dtype == CheckpointDType::kF32;
    DPT_CHECK(static_cast<int64_t>(f32 ? t.f32.size() : t.i64.size()) == t.numel())
        << name << ": " << (f32 ? t.f32.size() : t.i64.size()) << " values for shape "
        << ShapeString(t.shape);
    h5::Id space = Space(t.shape);
    h5::Id dset =
        h5::Dataset(H5Dcreate2(file_.get(), name.c_str(), f32 ? H5T_IEEE_F32LE : H5T_STD_I64LE,
                               space.get(), lcpl_.get(), H5P_DEFAULT, H5P_DEFAULT));
    if (!dset.valid()) Fail("cannot create " + name, h5::ErrorStackString());
    if (t.numel() > 0) {
      const void* data = f32 ? static_cast<const void*>(t.f32.data()) : t.i64.data();
      if (H5Dwrite(dset.get(), f32 ? H5T_NATIVE_FLOAT : H5T_NATIVE_INT64, H5S_ALL, H5S_ALL,
                   H5P_DEFAULT, data) < 0) {
        Fail("cannot write " + name, h5::ErrorStackString());
      }
    }
    const uint32_t crc = TensorCrc(t);
    Attr(name, "crc32", H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc);
  }

  void Int(const std::string& obj, const std::string& attr, int64_t v) {
    Attr(obj, attr, H5T_STD_I64LE, H5T_NATIVE_INT64, &v);
  }
  void Double(const std::string& obj, const std::string& attr, double v) {
    Attr(obj, attr, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
  }
  void String(const std::string& obj, const std::string& attr, const std::string& text) {
    h5::Id type = StringType();
    h5::Id space = h5::Space(H5Screate(H5S_SCALAR));
    h5::Id a = h5::Attr(H5Acreate_by_name(file_.get(), obj.c_str(), attr.c_str(), type.get(),
                                          space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    const char* p = text.c_str();
    if (!a.valid() || H5Awrite(a.get(), type.get(), &p) < 0) {
      Fail("cannot write attribute " + obj + " @" + attr, h5::ErrorStackString());
    }
  }
  void StringDataset(const std::string& name, const std::string& text) {
    h5::Id type = StringType();
    h5::Id space = h5::Space(H5Screate(H5S_SCALAR));
    h5::Id d = h5::Dataset(H5Dcreate2(file_.get(), name.c_str(), type.get(), space.get(),
                                      lcpl_.get(), H5P_DEFAULT, H5P_DEFAULT));
    const char* p = text.c_str();
    if (!d.valid() || H5Dwrite(d.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p) < 0) {
      Fail("cannot write " + name, h5::ErrorStackString());
    }
  }

  // The finished file's bytes; the in-memory file is closed.
  std::vector<char> Finish() {
    if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) Fail("cannot flush", h5::ErrorStackString());
    const ssize_t n = H5Fget_file_image(file_.get(), nullptr, 0);
    if (n < 0) Fail("cannot get the file image", h5::ErrorStackString());
    std::vector<char> image(static_cast<size_t>(n));
    if (H5Fget_file_image(file_.get(), image.data(), image.size()) != n) {
      Fail("cannot get the file image", h5::ErrorStackString());
    }
    lcpl_.Reset();
    file_.Reset();
    return image;
  }

 private:
  [[noreturn]] void Fail(const std::string& what, const std::string& stack) const {
    DPT_THROW(CheckpointError) << "cannot write checkpoint " << final_ << ": " << what << ": "
                               << stack;
  }
  static h5::Id Space(const std::vector<int64_t>& shape) {
    if (shape.empty()) return h5::Space(H5Screate(H5S_SCALAR));
    std::vector<hsize_t> d(shape.begin(), shape.end());
    return h5::Space(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr));
  }
  static h5::Id StringType() {
    h5::Id type = h5::Type(H5Tcopy(H5T_C_S1));
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    return type;
  }
  void Attr(const std::string& obj, const std::string& attr, hid_t file_type, hid_t mem_type,
            const void* v) {
    h5::Id space = h5::Space(H5Screate(H5S_SCALAR));
    h5::Id a = h5::Attr(H5Acreate_by_name(file_.get(), obj.c_str(), attr.c_str(), file_type,
                                          space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    if (!a.valid() || H5Awrite(a.get(), mem_type, v) < 0) {
      Fail("cannot write attribute " + obj + " @" + attr, h5::ErrorStackString());
    }
  }

  std::string final_;
  h5::Id file_, lcpl_;
};

[[noreturn]] void DiskFail(const std::string& final_path, const std::string& what, int err) {
  DPT_THROW(CheckpointError) << "cannot write checkpoint " << final_path << ": " << what << ": "
                             << std::strerror(err)
                             << (err == ENOSPC ? " (ENOSPC: the disk is full)" : "")
                             << "; the previous checkpoints are intact (hint: free disk space "
                             << "or point run_dir at a writable file system)";
}

// The test hook that makes "kill the writer mid-file" tests certain (runtime/train_hooks.h).
void MaybePauseForTests(const CheckpointPauseHook& pause, int64_t step, const std::string& tmp) {
  if (pause.seconds <= 0 || (pause.step >= 0 && pause.step != step)) return;
  const double seconds = pause.seconds;
  std::fprintf(stderr, "dptrain: test hook: pausing %.1f s while writing %s (pid %d)\n", seconds,
               tmp.c_str(), static_cast<int>(getpid()));
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// Writes `image` to `tmp` and fsyncs it (the test hook pauses halfway, with half on disk).
void WriteImage(const std::vector<char>& image, const std::string& tmp,
                const std::string& final_path, int64_t step, const CheckpointPauseHook& pause) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) DiskFail(final_path, "cannot create " + tmp, errno);
  size_t done = 0;
  const size_t half = image.size() / 2;
  bool paused = false;
  while (done < image.size()) {
    if (!paused && done >= half) {
      paused = true;
      ::fdatasync(fd);
      MaybePauseForTests(pause, step, tmp);
    }
    const size_t chunk = std::min(image.size() - done, paused ? image.size() - done : half - done);
    const ssize_t n = ::write(fd, image.data() + done, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      DiskFail(final_path, "write to " + tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    DiskFail(final_path, "fsync(" + tmp + ")", err);
  }
  // close() can report a deferred write error (NFS).
  if (::close(fd) != 0) DiskFail(final_path, "close(" + tmp + ")", errno);
}

// The rename is durable only once the directory entry is on disk.
void FsyncDirectory(const std::string& dir, const std::string& final_path) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) DiskFail(final_path, "cannot open " + dir + " for fsync", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some file systems do not support fsync on a directory: nothing more we can do there.
  if (rc != 0 && err != EINVAL && err != EROFS) DiskFail(final_path, "fsync(" + dir + ")", err);
}

std::string UtcNow() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<char> BuildImage(const std::string& tmp, const std::string& final_path,
                             const Checkpoint& c) {
  size_t bytes = c.config_toml.size() + (size_t{1} << 16);
  for (const auto* group : {&c.params, &c.optimizer}) {
    for (const CheckpointTensor& t : *group) bytes += 4 * t.f32.size() + 8 * t.i64.size() + 1024;
  }
  ImageWriter w(tmp, final_path, bytes);
  w.Group("/params");
  w.Group("/optimizer");
  w.Group("/state");
  for (const CheckpointTensor& t : c.params) w.Tensor("/params/" + t.name, t);
  for (const CheckpointTensor& t : c.optimizer) w.Tensor("/optimizer/" + t.name, t);
  w.String("/optimizer", "kind", c.optimizer_kind.empty() ? c.state.optimizer : c.optimizer_kind);
  w.Int("/optimizer", "steps", c.state.optimizer_steps);

  const CheckpointState& s = c.state;
  w.Int("/state", "format_version", kCheckpointFormatVersion);
  w.String("/state", "dptrain_version",
           s.dptrain_version.empty() ? std::string(DPTRAIN_VERSION) : s.dptrain_version);
  w.String("/state", "created", s.created.empty() ? UtcNow() : s.created);
  w.Int("/state", "step", s.step);
  w.Int("/state", "epoch", s.epoch);
  w.Int("/state", "samples_in_epoch", s.samples_in_epoch);
  w.Int("/state", "seed", s.seed);
  w.Int("/state", "rng_state", s.seed);
  w.String("/state", "rng",
           "counter-based: SplitMix64 of (seed, epoch, step, global sample index); the seed is "
           "the whole state");
  w.Int("/state", "world_size_at_save", s.world_size_at_save);
  w.Int("/state", "global_batch", s.global_batch);
  w.Int("/state", "accumulate", s.accumulate);
  w.Int("/state", "dataset_size", s.dataset_size);
  w.Int("/state", "steps_per_epoch", s.steps_per_epoch);
  w.Int("/state", "optimizer_steps", s.optimizer_steps);
  w.String("/state", "optimizer", s.optimizer);
  w.String("/state", "schedule", s.schedule);
  w.Int("/state", "schedule_step", s.step);
  w.Double("/state", "lr", s.lr);
  w.Int("/state", "last_eval_step", s.last_eval_step);
  w.Double("/state", "elapsed_s", s.elapsed_s);
  w.Double("/state", "loss_scale", s.loss_scale);
  w.Int("/state", "loss_scale_good_steps", s.loss_scale_good_steps);
  w.Int("/state", "skipped_steps", s.skipped_steps);
  w.Int("/state", "micro_batch", s.micro_batch);
  w.StringDataset("/config", c.config_toml);
  return w.Finish();
}

// ---------------------------------------------------------------------------------------------
// Reading.

template <class Info>
herr_t CollectLink(hid_t /*group*/, const char* name, const Info* /*info*/, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

std::vector<std::string> Links(hid_t group) {
  std::vector<std::string> names;
  hsize_t idx = 0;
  H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, &idx, &CollectLink, &names);
  return names;
}

bool Exists(hid_t loc, const std::string& name) {
  return H5Lexists(loc, name.c_str(), H5P_DEFAULT) > 0;
}

// Attributes and string datasets read into one value must hold exactly one element: H5Aread /
// H5Dread would write every element into the single value (a fuzzed file's 3-element attribute
// overflowed the stack).
bool OneAttrElement(hid_t attr) {
  h5::Id space = h5::Space(H5Aget_space(attr));
  return space.valid() && H5Sget_simple_extent_npoints(space.get()) == 1;
}
bool OneDatasetElement(hid_t dset) {
  h5::Id space = h5::Space(H5Dget_space(dset));
  return space.valid() && H5Sget_simple_extent_npoints(space.get()) == 1;
}

// A declared tensor larger than its file cannot have been written (HDF5 would hand back fill
// values for a sparse dataset): refuse before allocating (a 610-byte fuzzed file declared 4 TiB).
bool FitsInFile(hid_t dset, const std::vector<int64_t>& dims, size_t elem_bytes) {
  uint64_t bytes = elem_bytes;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) return false;
  }
  h5::Id file = h5::File(H5Iget_file_id(dset));
  hsize_t file_bytes = 0;
  if (!file.valid() || H5Fget_filesize(file.get(), &file_bytes) < 0) return true;
  h5::Id dcpl = h5::Plist(H5Dget_create_plist(dset));
  const uint64_t ratio = dcpl.valid() && H5Pget_nfilters(dcpl.get()) > 0 ? 4096 : 1;
  return bytes / ratio <= file_bytes;
}

// A tensor as read, with its checksum verdict (for inspect).
struct ReadTensor {
  CheckpointTensor t;
  bool read_ok = false;  // data (and checksum attribute, if any) read
  bool has_crc = false;
  bool crc_ok = true;
  uint32_t stored = 0, computed = 0;
};

// Reads the dataset `name` (a path in the file, for messages) opened as `dset` into *out.
// Returns an error text ("" on success).
std::string ReadDataset(hid_t dset, const std::string& name, ReadTensor* out) {
  h5::Id type = h5::Type(H5Dget_type(dset));
  h5::Id space = h5::Space(H5Dget_space(dset));
  if (!type.valid() || !space.valid()) return name + ": unreadable: " + h5::ErrorStackString();
  out->t.shape = h5::Dims(space.get());
  const H5T_class_t cls = H5Tget_class(type.get());
  if (!FitsInFile(dset, out->t.shape, cls == H5T_INTEGER ? 8 : 4)) {
    return name + ": declares more data than the file holds (truncated or corrupt file)";
  }
  const int64_t n = out->t.numel();
  if (cls == H5T_FLOAT && H5Tget_size(type.get()) == 4) {
    out->t.dtype = CheckpointDType::kF32;
    out->t.f32.resize(static_cast<size_t>(n));
    if (n > 0 &&
        H5Dread(dset, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->t.f32.data()) < 0) {
      return name + ": cannot read (truncated or corrupt file?): " + h5::ErrorStackString();
    }
  } else if (cls == H5T_INTEGER) {
    out->t.dtype = CheckpointDType::kI64;
    out->t.i64.resize(static_cast<size_t>(n));
    if (n > 0 &&
        H5Dread(dset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, out->t.i64.data()) < 0) {
      return name + ": cannot read (truncated or corrupt file?): " + h5::ErrorStackString();
    }
  } else {
    return name + ": dtype " + h5::TypeName(type.get()) +
           " is not supported (float32 tensors, int64 counters)";
  }
  out->computed = TensorCrc(out->t);
  if (H5Aexists(dset, "crc32") > 0) {
    out->has_crc = true;
    h5::Id a = h5::Attr(H5Aopen(dset, "crc32", H5P_DEFAULT));
    if (!a.valid() || !OneAttrElement(a.get()) ||
        H5Aread(a.get(), H5T_NATIVE_UINT32, &out->stored) < 0) {
      return name + ": cannot read its crc32 attribute: " + h5::ErrorStackString();
    }
    out->crc_ok = out->stored == out->computed;
    if (!out->crc_ok) {
      return fmt::format(
          "{}: checksum mismatch (crc32 stored {:08x}, computed {:08x}): the data "
          "is corrupt",
          name, out->stored, out->computed);
    }
  }
  return "";
}

// Reads every dataset directly in `group_path` ("/params") or, with nested, every dataset one
// level below its subgroups ("/optimizer/<param>/<slot>"; names "<param>/<slot>").
void ReadGroup(hid_t file, const std::string& group_path, bool nested, std::vector<ReadTensor>* out,
               std::vector<std::string>* errors) {
  h5::Id group = h5::Group(H5Gopen2(file, group_path.c_str(), H5P_DEFAULT));
  if (!group.valid()) {
    errors->push_back(group_path + ": cannot open group: " + h5::ErrorStackString());
    return;
  }
  for (const std::string& link : Links(group.get())) {
    const std::string full = group_path + "/" + link;
    h5::Id obj = h5::Object(H5Oopen(group.get(), link.c_str(), H5P_DEFAULT));
    if (!obj.valid()) {
      errors->push_back(full + ": cannot open: " + h5::ErrorStackString());
      continue;
    }
    const H5I_type_t kind = H5Iget_type(obj.get());
    if (nested && kind == H5I_GROUP) {
      for (const std::string& slot : Links(obj.get())) {
        h5::Id d = h5::Dataset(H5Dopen2(obj.get(), slot.c_str(), H5P_DEFAULT));
        if (!d.valid()) {
          errors->push_back(full + "/" + slot + ": not a readable dataset");
          continue;
        }
        ReadTensor rt;
        rt.t.name = link + "/" + slot;
        const std::string err = ReadDataset(d.get(), full + "/" + slot, &rt);
        rt.read_ok = err.empty() || rt.has_crc;
        if (!err.empty()) errors->push_back(err);
        out->push_back(std::move(rt));
      }
    } else if (!nested && kind == H5I_DATASET) {
      ReadTensor rt;
      rt.t.name = link;
      const std::string err = ReadDataset(obj.get(), full, &rt);
      rt.read_ok = err.empty() || rt.has_crc;
      if (!err.empty()) errors->push_back(err);
      out->push_back(std::move(rt));
    } else {
      errors->push_back(full + ": unexpected " + (kind == H5I_GROUP ? "group" : "object") +
                        (nested ? " (expected <param>/<slot> datasets)" : " (expected a dataset)"));
    }
  }
}

// Attribute readers for /state; a missing or unreadable attribute is recorded in errors.
class AttrReader {
 public:
  AttrReader(hid_t obj, std::string obj_name, std::vector<std::string>* errors)
      : obj_(obj), name_(std::move(obj_name)), errors_(errors) {}

  bool Has(const char* attr) const { return H5Aexists(obj_, attr) > 0; }

  int64_t Int(const char* attr, int64_t fallback = 0, bool required = true) {
    int64_t v = fallback;
    Read(attr, H5T_NATIVE_INT64, &v, required);
    return v;
  }
  double Double(const char* attr, double fallback = 0, bool required = true) {
    double v = fallback;
    Read(attr, H5T_NATIVE_DOUBLE, &v, required);
    return v;
  }
  std::string String(const char* attr, bool required = true) {
    if (!Present(attr, required)) return "";
    h5::Id a = h5::Attr(H5Aopen(obj_, attr, H5P_DEFAULT));
    h5::Id type = h5::Type(H5Aget_type(a.get()));
    if (!a.valid() || !type.valid() || H5Tget_class(type.get()) != H5T_STRING ||
        !OneAttrElement(a.get())) {
      errors_->push_back(name_ + " @" + attr + ": not a single string");
      return "";
    }
    if (H5Tis_variable_str(type.get()) > 0) {
      h5::Id mem = h5::Type(H5Tcopy(H5T_C_S1));
      H5Tset_size(mem.get(), H5T_VARIABLE);
      H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
      char* s = nullptr;
      if (H5Aread(a.get(), mem.get(), &s) < 0) {
        errors_->push_back(name_ + " @" + attr + ": unreadable");
        return "";
      }
      std::string out = s != nullptr ? s : "";
      H5free_memory(s);
      return out;
    }
    const size_t size = H5Tget_size(type.get());
    std::string buf(size + 1, '\0');
    h5::Id mem = h5::Type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), size + 1);
    if (H5Aread(a.get(), mem.get(), buf.data()) < 0) {
      errors_->push_back(name_ + " @" + attr + ": unreadable");
      return "";
    }
    buf.resize(std::strlen(buf.c_str()));
    return buf;
  }

 private:
  bool Present(const char* attr, bool required) {
    if (Has(attr)) return true;
    if (required) errors_->push_back(name_ + " @" + attr + ": missing attribute");
    return false;
  }
  void Read(const char* attr, hid_t mem, void* v, bool required) {
    if (!Present(attr, required)) return;
    h5::Id a = h5::Attr(H5Aopen(obj_, attr, H5P_DEFAULT));
    if (!a.valid() || !OneAttrElement(a.get())) {
      errors_->push_back(name_ + " @" + attr + ": not a single value");
      return;
    }
    if (H5Aread(a.get(), mem, v) < 0) {
      errors_->push_back(name_ + " @" + attr + ": unreadable: " + h5::ErrorStackString());
    }
  }

  hid_t obj_;
  std::string name_;
  std::vector<std::string>* errors_;
};

std::string ReadStringDataset(hid_t file, const char* name, std::vector<std::string>* errors) {
  h5::Id d = h5::Dataset(H5Dopen2(file, name, H5P_DEFAULT));
  h5::Id type = h5::Type(d.valid() ? H5Dget_type(d.get()) : H5I_INVALID_HID);
  if (!d.valid() || !type.valid() || H5Tget_class(type.get()) != H5T_STRING ||
      !OneDatasetElement(d.get())) {
    errors->push_back(std::string("/") + name + ": not a single string");
    return "";
  }
  if (H5Tis_variable_str(type.get()) > 0) {
    h5::Id mem = h5::Type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    if (H5Dread(d.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &s) < 0) {
      errors->push_back(std::string("/") + name + ": unreadable: " + h5::ErrorStackString());
      return "";
    }
    std::string out = s != nullptr ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  std::string buf(size + 1, '\0');
  h5::Id mem = h5::Type(H5Tcopy(H5T_C_S1));
  H5Tset_size(mem.get(), size + 1);
  if (H5Dread(d.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0) {
    errors->push_back(std::string("/") + name + ": unreadable: " + h5::ErrorStackString());
    return "";
  }
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

h5::Id OpenCheckpointFile(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    DPT_THROW(CheckpointError) << "checkpoint " << path << ": no such file";
  if (fs::is_directory(path, ec)) {
    DPT_THROW(CheckpointError) << "checkpoint " << path
                               << ": is a directory, expected an HDF5 file";
  }
  if (const std::string why = h5::UnreadableReason(path); !why.empty()) {
    DPT_THROW(CheckpointError) << "checkpoint " << path << ": cannot read the file: " << why;
  }
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 <= 0) {
    DPT_THROW(CheckpointError) << "checkpoint " << path
                               << ": not an HDF5 file (no HDF5 signature: empty, truncated at "
                                  "the start or overwritten)";
  }
  h5::Id fapl = h5::Plist(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_file_locking(fapl.get(), false, true);
  h5::Id file = h5::File(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!file.valid()) {
    DPT_THROW(CheckpointError) << "checkpoint " << path
                               << ": cannot open (truncated or corrupt file?): "
                               << h5::ErrorStackString();
  }
  return file;
}

struct RawCheckpoint {
  Checkpoint ckpt;
  std::vector<ReadTensor> params, optimizer;
  std::vector<std::string> errors;
};

// Strips a "module." prefix present on every name of `tensors`; returns true when it did.
bool StripModulePrefix(std::vector<ReadTensor>* tensors) {
  if (tensors->empty()) return false;
  for (const ReadTensor& r : *tensors) {
    if (r.t.name.rfind(kModulePrefix, 0) != 0) return false;
  }
  for (ReadTensor& r : *tensors) r.t.name.erase(0, std::strlen(kModulePrefix));
  return true;
}

RawCheckpoint ReadRaw(const std::string& path) {
  h5::ScopedSilence silence;
  h5::Id file = OpenCheckpointFile(path);
  RawCheckpoint raw;
  Checkpoint& c = raw.ckpt;
  if (!Exists(file.get(), "params")) {
    DPT_THROW(CheckpointError) << "checkpoint " << path
                               << ": no /params group: not a dptrain checkpoint (is it a dataset "
                                  "file?)";
  }
  ReadGroup(file.get(), "/params", false, &raw.params, &raw.errors);
  if (Exists(file.get(), "optimizer")) {
    ReadGroup(file.get(), "/optimizer", true, &raw.optimizer, &raw.errors);
    h5::Id g = h5::Group(H5Gopen2(file.get(), "optimizer", H5P_DEFAULT));
    if (g.valid()) {
      AttrReader a(g.get(), "/optimizer", &raw.errors);
      c.optimizer_kind = a.String("kind", false);
    }
  }
  c.has_state = Exists(file.get(), "state");
  if (c.has_state) {
    h5::Id g = h5::Group(H5Gopen2(file.get(), "state", H5P_DEFAULT));
    if (!g.valid()) {
      raw.errors.push_back("/state: cannot open group: " + h5::ErrorStackString());
    } else {
      AttrReader a(g.get(), "/state", &raw.errors);
      CheckpointState& s = c.state;
      s.format_version = a.Int("format_version");
      if (s.format_version > kCheckpointFormatVersion) {
        DPT_THROW(CheckpointError)
            << "checkpoint " << path << ": format_version " << s.format_version
            << " was written by a newer dptrain (" << a.String("dptrain_version", false)
            << "); this one reads format_version <= " << kCheckpointFormatVersion;
      }
      s.dptrain_version = a.String("dptrain_version", false);
      s.created = a.String("created", false);
      s.step = a.Int("step");
      s.epoch = a.Int("epoch");
      s.samples_in_epoch = a.Int("samples_in_epoch");
      s.seed = a.Int("seed");
      s.world_size_at_save = a.Int("world_size_at_save");
      s.global_batch = a.Int("global_batch");
      s.accumulate = a.Int("accumulate", 1, false);
      s.dataset_size = a.Int("dataset_size");
      s.steps_per_epoch = a.Int("steps_per_epoch", 0, false);
      s.optimizer_steps = a.Int("optimizer_steps");
      s.optimizer = a.String("optimizer");
      s.schedule = a.String("schedule", false);
      s.lr = a.Double("lr", 0, false);
      s.last_eval_step = a.Int("last_eval_step", -1, false);
      s.elapsed_s = a.Double("elapsed_s", 0, false);
      s.loss_scale = a.Double("loss_scale", 0, false);
      s.loss_scale_good_steps = a.Int("loss_scale_good_steps", 0, false);
      s.skipped_steps = a.Int("skipped_steps", 0, false);
      s.micro_batch = a.Int("micro_batch", 0, false);
    }
    // A dptrain checkpoint has a checksum on every tensor; one without is damaged or forged.
    for (const auto* group : {&raw.params, &raw.optimizer}) {
      for (const ReadTensor& r : *group) {
        if (r.read_ok && !r.has_crc) {
          raw.errors.push_back((group == &raw.params ? "/params/" : "/optimizer/") + r.t.name +
                               ": no crc32 attribute");
        }
      }
    }
  }
  if (Exists(file.get(), "config"))
    c.config_toml = ReadStringDataset(file.get(), "config", &raw.errors);
  if (StripModulePrefix(&raw.params)) {
    c.notices.push_back("checkpoint " + path +
                        ": every name in /params starts with 'module.' (a DataParallel/DDP "
                        "wrapper); the prefix was stripped");
  }
  if (StripModulePrefix(&raw.optimizer)) {
    c.notices.push_back("checkpoint " + path +
                        ": every name in /optimizer starts with 'module.'; the prefix was "
                        "stripped");
  }
  auto by_name = [](const ReadTensor& a, const ReadTensor& b) { return a.t.name < b.t.name; };
  std::sort(raw.params.begin(), raw.params.end(), by_name);
  std::sort(raw.optimizer.begin(), raw.optimizer.end(), by_name);
  for (const ReadTensor& r : raw.params) c.params.push_back(r.t);
  for (const ReadTensor& r : raw.optimizer) c.optimizer.push_back(r.t);
  return raw;
}

const CheckpointTensor* Find(const std::vector<CheckpointTensor>& v, const std::string& name) {
  auto it =
      std::lower_bound(v.begin(), v.end(), name,
                       [](const CheckpointTensor& t, const std::string& n) { return t.name < n; });
  return it != v.end() && it->name == name ? &*it : nullptr;
}

int64_t StepOf(const std::string& file_name) {
  static const std::regex kName(R"(ckpt-(\d{8,})\.h5)");
  std::smatch m;
  if (!std::regex_match(file_name, m, kName)) return -1;
  return std::stoll(m[1].str());
}

}  // namespace

// ---------------------------------------------------------------------------------------------

int64_t CheckpointTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const CheckpointTensor* Checkpoint::FindParam(const std::string& name) const {
  return Find(params, name);
}
const CheckpointTensor* Checkpoint::FindOptimizer(const std::string& name) const {
  return Find(optimizer, name);
}

std::string CheckpointFileName(int64_t step) { return fmt::format("ckpt-{:08d}.h5", step); }

uint32_t Crc32(const void* data, size_t bytes) {
  return static_cast<uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), static_cast<const Bytef*>(data), bytes));
}

CheckpointWriteStats WriteCheckpoint(const std::string& dir, const Checkpoint& ckpt, int64_t keep,
                                     const CheckpointPauseHook& pause) {
  h5::ScopedSilence silence;
  const auto t0 = Clock::now();
  const std::string name = CheckpointFileName(ckpt.state.step);
  CheckpointWriteStats stats;
  stats.step = ckpt.state.step;
  stats.path = dir + "/" + name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    DPT_THROW(CheckpointError) << "cannot write checkpoint " << stats.path
                               << ": cannot create the directory " << dir << ": "
                               << (ec ? ec.message() : "not a directory");
  }
  const std::string tmp = dir + "/." + name + ".tmp";
  const std::vector<char> image = BuildImage(tmp, stats.path, ckpt);
  try {
    WriteImage(image, tmp, stats.path, ckpt.state.step, pause);
    fs::rename(tmp, stats.path, ec);
    if (ec) {
      DPT_THROW(CheckpointError) << "cannot write checkpoint " << stats.path << ": rename from "
                                 << tmp << ": " << ec.message();
    }
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  FsyncDirectory(dir, stats.path);
  stats.bytes = static_cast<int64_t>(fs::file_size(stats.path, ec));
  // Only now that the new checkpoint is complete may older ones go.
  int64_t kept = 1;
  for (const std::string& p : ListCheckpoints(dir)) {
    if (p == stats.path) continue;
    if (kept < keep) {
      ++kept;
      continue;
    }
    if (fs::remove(p, ec)) {
      stats.deleted.push_back(p);
    } else if (ec) {
      stats.notices.push_back("cannot delete old checkpoint " + p + ": " + ec.message());
    }
  }
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

Checkpoint ReadCheckpoint(const std::string& path) {
  RawCheckpoint raw = ReadRaw(path);
  if (!raw.errors.empty()) {
    DPT_THROW(CheckpointError) << "checkpoint " << path << " is corrupt (" << raw.errors.size()
                               << (raw.errors.size() == 1 ? " problem" : " problems")
                               << "): " << Join(raw.errors, "; ");
  }
  return std::move(raw.ckpt);
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    const int64_t step = StepOf(file);
    if (step >= 0 && it->is_regular_file(ec)) found.emplace_back(step, it->path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> out;
  out.reserve(found.size());
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::optional<FoundCheckpoint> FindLatestCheckpoint(const std::string& dir,
                                                    std::vector<std::string>* skipped) {
  for (const std::string& path : ListCheckpoints(dir)) {
    try {
      Checkpoint c = ReadCheckpoint(path);
      if (!c.has_state) {
        DPT_THROW(CheckpointError) << "checkpoint " << path << ": no /state group";
      }
      return FoundCheckpoint{path, std::move(c)};
    } catch (const CheckpointError& e) {
      skipped->push_back(e.what());
    }
  }
  return std::nullopt;
}

std::vector<std::string> RemoveStaleTemporaries(const std::string& dir) {
  static const std::regex kTmp(R"(\.ckpt-\d{8,}\.h5\.tmp)");
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    std::error_code rm;
    if (std::regex_match(file, kTmp) && fs::remove(it->path(), rm)) {
      removed.push_back(it->path().string());
    }
  }
  return removed;
}

namespace {

// "" when `have` matches `expected`, else every difference in words.
std::string Mismatch(const std::string& group, const std::vector<CheckpointTensor>& have,
                     const std::vector<TensorSpec>& expected) {
  std::map<std::string, const CheckpointTensor*> by_name;
  for (const CheckpointTensor& t : have) by_name[t.name] = &t;
  std::vector<std::string> missing, misshaped, unexpected;
  for (const TensorSpec& s : expected) {
    auto it = by_name.find(s.name);
    if (it == by_name.end()) {
      if (!s.optional) missing.push_back(s.name + " " + ShapeString(s.shape));
      continue;
    }
    const CheckpointTensor& t = *it->second;
    if (t.shape != s.shape || t.dtype != s.dtype) {
      misshaped.push_back(fmt::format("{} is {} {} in the file, {} {} in the model", s.name,
                                      DTypeName(t.dtype), ShapeString(t.shape), DTypeName(s.dtype),
                                      ShapeString(s.shape)));
    }
    by_name.erase(it);
  }
  for (const auto& [name, t] : by_name) unexpected.push_back(name + " " + ShapeString(t->shape));
  std::vector<std::string> parts;
  if (!missing.empty()) {
    parts.push_back(fmt::format("{} missing: {}", missing.size(), Join(missing, ", ")));
  }
  if (!unexpected.empty()) {
    parts.push_back(fmt::format("{} unexpected: {}", unexpected.size(), Join(unexpected, ", ")));
  }
  if (!misshaped.empty()) {
    parts.push_back(fmt::format("{} mis-shaped: {}", misshaped.size(), Join(misshaped, "; ")));
  }
  return parts.empty() ? "" : group + ": " + Join(parts, "; ");
}

}  // namespace

void MatchCheckpoint(const std::string& path, const Checkpoint& ckpt,
                     const std::vector<TensorSpec>& params,
                     const std::vector<TensorSpec>* optimizer) {
  std::vector<std::string> problems;
  if (std::string m = Mismatch("/params", ckpt.params, params); !m.empty()) problems.push_back(m);
  if (optimizer != nullptr) {
    if (std::string m = Mismatch("/optimizer", ckpt.optimizer, *optimizer); !m.empty()) {
      problems.push_back(m);
    }
  }
  if (problems.empty()) return;
  DPT_THROW(CheckpointError) << "checkpoint " << path
                             << " does not match the model: " << Join(problems, "; ")
                             << "; hint: is it a checkpoint of another model (model.name, "
                                "model.layers, model.classes) or optimizer (train.optimizer)?";
}

bool IsCheckpointFile(const std::string& path) {
  h5::ScopedSilence silence;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || H5Fis_hdf5(path.c_str()) <= 0) return false;
  h5::Id fapl = h5::Plist(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_file_locking(fapl.get(), false, true);
  h5::Id file = h5::File(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  return file.valid() && Exists(file.get(), "params");
}

std::string DescribeCheckpoint(const std::string& path) {
  RawCheckpoint raw = ReadRaw(path);
  const Checkpoint& c = raw.ckpt;
  const CheckpointState& s = c.state;
  std::ostringstream os;
  os << path << "\n";
  if (c.has_state) {
    os << fmt::format("dptrain checkpoint, format_version {} (dptrain {}), written {}\n",
                      s.format_version, s.dptrain_version, s.created);
    const int64_t in_epoch = s.global_batch > 0 ? s.samples_in_epoch / s.global_batch : 0;
    os << fmt::format(
        "  step {}  epoch {} (completed) + {}/{} steps = {} samples into the next, of {}\n", s.step,
        s.epoch, in_epoch, s.steps_per_epoch, s.samples_in_epoch, s.dataset_size);
    os << fmt::format(
        "  world_size_at_save {}  global_batch {}  accumulate {}  seed {}\n"
        "  optimizer {} ({} steps)  schedule {} at step {}  lr {:.6g}  last_eval_step {}  "
        "elapsed {:.1f} s\n",
        s.world_size_at_save, s.global_batch, s.accumulate, s.seed, s.optimizer, s.optimizer_steps,
        s.schedule, s.step, s.lr, s.last_eval_step, s.elapsed_s);
  } else {
    os << "parameters file (no /state: usable as checkpoint.init, not to resume)\n";
  }
  auto list = [&](const char* group, const std::vector<ReadTensor>& tensors) {
    int64_t values = 0;
    size_t width = 0;
    for (const ReadTensor& r : tensors) {
      values += r.t.numel();
      width = std::max(width, r.t.name.size());
    }
    os << fmt::format("{} ({} tensors, {} values)\n", group, tensors.size(), values);
    for (const ReadTensor& r : tensors) {
      const std::string verdict = !r.has_crc ? "no checksum"
                                  : r.crc_ok ? fmt::format("crc32 {:08x} ok", r.stored)
                                             : fmt::format(
                                                   "CRC32 MISMATCH (stored {:08x}, "
                                                   "computed {:08x})",
                                                   r.stored, r.computed);
      os << fmt::format("  {:<{}}  {:<7} {:<18} {}\n", r.t.name, width, DTypeName(r.t.dtype),
                        r.t.shape.empty() ? std::string("scalar") : ShapeString(r.t.shape),
                        verdict);
    }
  };
  list("/params", raw.params);
  if (!raw.optimizer.empty() || !c.optimizer_kind.empty()) {
    os << "optimizer " << (c.optimizer_kind.empty() ? "?" : c.optimizer_kind) << ": ";
    list("/optimizer", raw.optimizer);
  }
  for (const std::string& n : c.notices) os << "notice: " << n << "\n";
  if (raw.errors.empty()) {
    os << "verdict: valid (every checksum matches)\n";
  } else {
    os << "verdict: INVALID, " << raw.errors.size() << " problem(s):\n";
    for (const std::string& e : raw.errors) os << "  " << e << "\n";
  }
  if (!c.config_toml.empty()) {
    os << "/config:\n";
    std::istringstream in(c.config_toml);
    for (std::string line; std::getline(in, line);) os << "  " << line << "\n";
  }
  return os.str();
}

// ---------------------------------------------------------------------------------------------

CheckpointWriter::CheckpointWriter(std::string dir, int64_t keep, CheckpointPauseHook pause)
    : dir_(std::move(dir)), keep_(keep), pause_(pause) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::Submit(Checkpoint ckpt) {
  if (thread_.joinable()) thread_.join();
  if (failed_.load()) return;  // the pending error is reported by Wait()
  thread_ = std::thread(&CheckpointWriter::Run, this, std::move(ckpt));
}

void CheckpointWriter::Run(const Checkpoint& ckpt) {
  try {
    CheckpointWriteStats stats = WriteCheckpoint(dir_, ckpt, keep_, pause_);
    std::lock_guard<std::mutex> lock(mu_);
    completed_.push_back(std::move(stats));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
    failed_.store(true);
  }
}

void CheckpointWriter::Wait() {
  if (thread_.joinable()) thread_.join();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e = std::exchange(error_, nullptr);
    failed_.store(false);
  }
  if (e) std::rethrow_exception(e);
}

std::vector<CheckpointWriteStats> CheckpointWriter::TakeCompleted() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(completed_, {});
}

}  // namespace dptrain
