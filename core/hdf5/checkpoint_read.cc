// SPDX-License-Identifier: Apache-2.0
// The checkpoint file format, reading side: ReadCheckpoint (structure, dtypes, every tensor's
// CRC-32, /state, format version, the 'module.' prefix), IsCheckpointFile and the `dptrain
// inspect` description. Over 400 lines on purpose: ReadCheckpoint and DescribeCheckpoint share one
// raw reader (it keeps each tensor's checksum verdict for inspect), which would otherwise need a
// private header between two files.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "core/hdf5/checkpoint_file.h"
#include "core/hdf5/hdf5_util.h"
#include "core/util/input_file.h"
#include "core/util/strings.h"

namespace dptrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModulePrefix = "module.";

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
  out->computed = CheckpointTensorCrc(out->t);
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
  if (const std::string why = InputFileProblem(path, "an HDF5 file"); !why.empty()) {
    DPT_THROW(CheckpointError) << "checkpoint " << path << ": " << why;
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
  std::string state_crc = "no checksum";  // for inspect
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
      // Crc32 of every other /state attribute; files written before it existed have none.
      if (a.Has("crc32")) {
        const auto stored = static_cast<uint32_t>(a.Int("crc32"));
        std::string why;
        const std::optional<std::string> text = h5::AttributesText(g.get(), "crc32", &why);
        if (!text) {
          raw.errors.push_back("/state " + why);
          raw.state_crc = "UNREADABLE";
        } else if (const uint32_t computed = Crc32(text->data(), text->size());
                   computed != stored) {
          raw.errors.push_back(fmt::format(
              "/state: checksum mismatch (crc32 stored {:08x}, computed {:08x}): its attributes "
              "(step, epoch, seed, ...) changed after the save",
              stored, computed));
          raw.state_crc =
              fmt::format("CRC32 MISMATCH (stored {:08x}, computed {:08x})", stored, computed);
        } else {
          raw.state_crc = fmt::format("crc32 {:08x} ok", stored);
        }
      }
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
  if (H5Aexists(file.get(), "class_names") > 0) {
    h5::Id a = h5::Attr(H5Aopen(file.get(), "class_names", H5P_DEFAULT));
    const std::optional<std::string> names = h5::ReadStringAttr(a.get());
    if (!names) {
      raw.errors.push_back("@class_names: not a single string");
    } else {
      c.class_names = SplitLines(*names);
    }
  }
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
}  // namespace

Checkpoint ReadCheckpoint(const std::string& path) {
  RawCheckpoint raw = ReadRaw(path);
  if (!raw.errors.empty()) {
    DPT_THROW(CheckpointError) << "checkpoint " << path << " is corrupt (" << raw.errors.size()
                               << (raw.errors.size() == 1 ? " problem" : " problems")
                               << "): " << Join(raw.errors, "; ");
  }
  return std::move(raw.ckpt);
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
    os << "  /state " << raw.state_crc << "\n";
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
      os << fmt::format(
          "  {:<{}}  {:<7} {:<18} {}\n", r.t.name, width, CheckpointDTypeName(r.t.dtype),
          r.t.shape.empty() ? std::string("scalar") : CheckpointShapeString(r.t.shape), verdict);
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

}  // namespace dptrain
