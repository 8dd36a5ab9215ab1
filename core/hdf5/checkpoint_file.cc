// SPDX-License-Identifier: Apache-2.0
// The checkpoint file format, writing side (DESIGN.md sections 4 and 5): atomic writes (the HDF5
// file built in memory, written to a temporary name, fsynced, renamed, the directory fsynced),
// retention, and the small helpers of checkpoint_file.h (names, CRC-32, lookups). No model
// knowledge. Reading and verifying is checkpoint_read.cc; listing, find-latest and stale-temporary
// housekeeping are checkpoint_dir.cc.
#include "core/hdf5/checkpoint_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <thread>

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
        << CheckpointShapeString(t.shape);
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
    const uint32_t crc = CheckpointTensorCrc(t);
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

  // The attribute `crc32` on the group `obj`: Crc32 of h5::AttributesText (every other
  // attribute), so that an edited or damaged step, seed or epoch is found on reading.
  void AttributesCrc(const std::string& obj) {
    h5::Id g = h5::Group(H5Gopen2(file_.get(), obj.c_str(), H5P_DEFAULT));
    std::string why;
    const std::optional<std::string> text =
        g.valid() ? h5::AttributesText(g.get(), "crc32", &why) : std::nullopt;
    if (!text) Fail("cannot checksum " + obj + " " + why, h5::ErrorStackString());
    const uint32_t crc = Crc32(text->data(), text->size());
    Attr(obj, "crc32", H5T_STD_U32LE, H5T_NATIVE_UINT32, &crc);
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

// The test hook that makes "kill the writer mid-file" tests certain (CheckpointPauseHook).
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
  w.AttributesCrc("/state");  // after every other /state attribute
  w.StringDataset("/config", c.config_toml);
  if (!c.class_names.empty()) w.String("/", "class_names", Join(c.class_names, "\n"));
  return w.Finish();
}

const CheckpointTensor* Find(const std::vector<CheckpointTensor>& v, const std::string& name) {
  auto it =
      std::lower_bound(v.begin(), v.end(), name,
                       [](const CheckpointTensor& t, const std::string& n) { return t.name < n; });
  return it != v.end() && it->name == name ? &*it : nullptr;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string CheckpointShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* CheckpointDTypeName(CheckpointDType d) {
  return d == CheckpointDType::kF32 ? "float32" : "int64";
}

uint32_t CheckpointTensorCrc(const CheckpointTensor& t) {
  return t.dtype == CheckpointDType::kF32 ? Crc32(t.f32.data(), t.f32.size() * sizeof(float))
                                          : Crc32(t.i64.data(), t.i64.size() * sizeof(int64_t));
}

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

}  // namespace dptrain
