// SPDX-License-Identifier: Apache-2.0
// HDF5 helpers shared by the dataset reader, the writer and `dptrain inspect`.
#include "core/hdf5/hdf5_util.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "core/util/input_file.h"

namespace dptrain::h5 {
namespace {

herr_t CollectError(unsigned /*n*/, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (err->desc != nullptr && err->desc[0] != '\0') out->emplace_back(err->desc);
  return 0;
}

}  // namespace

std::string ErrorStackString() {
  std::vector<std::string> descs;
  // Upward: the innermost (most specific) cause first, the API call last.
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, &CollectError, &descs);
  std::string out;
  int kept = 0;
  for (const std::string& d : descs) {
    if (out.find(d) != std::string::npos) continue;
    if (!out.empty()) out += "; ";
    out += d;
    if (++kept == 3) break;  // the first few causes say it all; the rest is HDF5's call chain
  }
  return out;
}

std::string TypeName(hid_t type) {
  const size_t size = H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") +
             std::to_string(8 * size);
    case H5T_FLOAT:
      return "float" + std::to_string(8 * size);
    case H5T_STRING:
      return "string";
    case H5T_BITFIELD:
      return "bitfield";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_COMPOUND:
      return "compound";
    case H5T_REFERENCE:
      return "reference";
    case H5T_ENUM:
      return "enum";
    case H5T_VLEN:
      return "vlen";
    case H5T_ARRAY:
      return "array";
    default:
      return "unknown";
  }
}

std::vector<int64_t> Dims(hid_t space) {
  const int rank = H5Sget_simple_extent_ndims(space);
  if (rank <= 0) return {};
  std::vector<hsize_t> d(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return std::vector<int64_t>(d.begin(), d.end());
}

template <class E>
Id OpenFileReadOnly(const std::string& path) {
  if (const std::string why = InputFileProblem(path, "an HDF5 file"); !why.empty()) {
    DPT_THROW(E) << path << ": " << why;
  }
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
  if (is_h5 <= 0) {
    DPT_THROW(E) << path << ": not an HDF5 file (no HDF5 signature)"
                 << (is_h5 < 0 ? ": " + ErrorStackString() : std::string());
  }
  Id fapl = Plist(H5Pcreate(H5P_FILE_ACCESS));
  // Read-only opens need no lock; locks fail on some parallel file systems (Lustre, NFS).
  H5Pset_file_locking(fapl.get(), false, true);
  Id file = File(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()));
  if (!file.valid()) {
    DPT_THROW(E) << path
                 << ": cannot open HDF5 file (truncated or corrupt?): " << ErrorStackString();
  }
  return file;
}

template Id OpenFileReadOnly<IoError>(const std::string& path);
template Id OpenFileReadOnly<DataError>(const std::string& path);

std::optional<std::string> ReadStringAttr(hid_t attr) {
  Id type = Type(H5Aget_type(attr));
  Id space = Space(H5Aget_space(attr));
  if (!type.valid() || !space.valid() || H5Tget_class(type.get()) != H5T_STRING ||
      H5Sget_simple_extent_npoints(space.get()) != 1) {
    return std::nullopt;
  }
  if (H5Tis_variable_str(type.get()) > 0) {
    Id mem = Type(H5Tcopy(H5T_C_S1));
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* s = nullptr;
    if (H5Aread(attr, mem.get(), &s) < 0) return std::nullopt;
    std::string out = s != nullptr ? s : "";
    H5free_memory(s);
    return out;
  }
  const size_t size = H5Tget_size(type.get());
  std::string buf(size + 1, '\0');
  Id mem = Type(H5Tcopy(H5T_C_S1));
  H5Tset_size(mem.get(), size + 1);
  if (H5Aread(attr, mem.get(), buf.data()) < 0) return std::nullopt;
  buf.resize(std::strlen(buf.c_str()));
  return buf;
}

namespace {

struct AttrTextState {
  const char* skip;
  std::string text;
  std::string why;
};

herr_t AppendAttrLine(hid_t obj, const char* name, const H5A_info_t* /*info*/, void* data) {
  auto* st = static_cast<AttrTextState*>(data);
  if (std::strcmp(name, st->skip) == 0) return 0;
  Id a = Attr(H5Aopen(obj, name, H5P_DEFAULT));
  Id type = Type(a.valid() ? H5Aget_type(a.get()) : H5I_INVALID_HID);
  Id space = Space(a.valid() ? H5Aget_space(a.get()) : H5I_INVALID_HID);
  if (!type.valid() || !space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1) {
    st->why = std::string("@") + name + ": not a single value";
    return -1;
  }
  std::string value;
  bool read = false;
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER: {
      if (H5Tget_sign(type.get()) == H5T_SGN_NONE) {
        uint64_t v = 0;
        read = H5Aread(a.get(), H5T_NATIVE_UINT64, &v) >= 0;
        value = std::to_string(v);
      } else {
        int64_t v = 0;
        read = H5Aread(a.get(), H5T_NATIVE_INT64, &v) >= 0;
        value = std::to_string(v);
      }
      break;
    }
    case H5T_FLOAT: {
      double v = 0;
      read = H5Aread(a.get(), H5T_NATIVE_DOUBLE, &v) >= 0;
      // fmt ignores the locale; a NaN is "nan" whatever its sign bit (as Python prints it).
      value = std::isnan(v) ? std::string("nan") : fmt::format("{:.17g}", v);
      break;
    }
    case H5T_STRING: {
      const std::optional<std::string> text = ReadStringAttr(a.get());
      read = text.has_value();
      value = text.value_or("");
      break;
    }
    default:
      st->why = std::string("@") + name + ": not an integer, float or string";
      return -1;
  }
  if (!read) {
    st->why = std::string("@") + name + ": unreadable";
    return -1;
  }
  st->text += name;
  st->text += '=';
  st->text += value;
  st->text += '\n';
  return 0;
}

}  // namespace

std::optional<std::string> AttributesText(hid_t obj, const char* skip, std::string* why) {
  AttrTextState st{skip, {}, {}};
  hsize_t idx = 0;
  if (H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, AppendAttrLine, &st) < 0) {
    *why = st.why.empty() ? "cannot list its attributes: " + ErrorStackString() : st.why;
    return std::nullopt;
  }
  return std::move(st.text);
}

}  // namespace dptrain::h5
