// SPDX-License-Identifier: Apache-2.0
// The HDF5 edit engine of hdf5_edits.h: EditHdf5 (one fuzz-chosen edit after another: delete,
// move, retype, reshape or poke objects and attributes) and FixCrc32Attributes. Over 400 lines on
// purpose: one switch over the edit kinds and the helpers only it uses, which read together.
#include "tests/fuzz/hdf5_edits.h"

#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/hdf5/hdf5_util.h"
#include "runtime/checkpoint/checkpoint.h"

namespace dptrain::fuzz {
namespace {

constexpr hsize_t kMaxElements = 4096;

struct Objects {
  std::vector<std::string> datasets, groups;  // absolute paths; groups include "/"
};

herr_t CollectLink(hid_t /*group*/, const char* name, const H5L_info_t* info, void* op) {
  if (info->type == H5L_TYPE_HARD) static_cast<std::vector<std::string>*>(op)->push_back(name);
  return 0;
}

// Replaces the attribute crc32 of the object `obj` with `crc`.
void ReplaceCrc32(hid_t obj, uint32_t crc) {
  H5Adelete(obj, "crc32");
  const hid_t as = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(obj, "crc32", H5T_STD_U32LE, as, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    H5Awrite(a, H5T_NATIVE_UINT32, &crc);
    H5Aclose(a);
  }
  H5Sclose(as);
}

Objects ListObjects(hid_t file) {
  std::vector<std::string> links;
  H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, CollectLink, &links);
  Objects objs;
  objs.groups.push_back("/");
  for (const std::string& l : links) {
    const std::string path = "/" + l;
    const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
    if (d >= 0) {
      objs.datasets.push_back(path);
      H5Dclose(d);
      continue;
    }
    const hid_t g = H5Gopen2(file, path.c_str(), H5P_DEFAULT);
    if (g >= 0) {
      objs.groups.push_back(path);
      H5Gclose(g);
    }
  }
  return objs;
}

template <class T>
const T& Pick(FuzzedDataProvider& in, const std::vector<T>& v) {
  return v[in.ConsumeIntegralInRange<size_t>(0, v.size() - 1)];
}

// Mostly a name the reader knows, sometimes anything.
std::string PickName(FuzzedDataProvider& in, const std::vector<std::string>& names) {
  if (!names.empty() && in.ConsumeIntegralInRange(0, 3) != 0) return Pick(in, names);
  std::string s = in.ConsumeRandomLengthString(24);
  if (s.empty() || s == "." || s == "/") s = "x";
  return s;
}

// A link path for a new object: a known name at the root or below an existing group.
std::string PickPath(FuzzedDataProvider& in, const Objects& objs,
                     const std::vector<std::string>& names) {
  std::string name = PickName(in, names);
  if (name.front() == '/') return name;
  const std::string& parent = Pick(in, objs.groups);
  return parent == "/" ? "/" + name : parent + "/" + name;
}

// Element types of new datasets and attributes.
enum class Kind : uint8_t { kU8, kI8, kU16, kI32, kU32, kI64, kF32, kF64, kFixedString, kVlString };
constexpr int kNumKinds = 10;

hid_t FileType(Kind k, size_t fixed_len) {
  switch (k) {
    case Kind::kU8:
      return H5Tcopy(H5T_STD_U8LE);
    case Kind::kI8:
      return H5Tcopy(H5T_STD_I8LE);
    case Kind::kU16:
      return H5Tcopy(H5T_STD_U16LE);
    case Kind::kI32:
      return H5Tcopy(H5T_STD_I32LE);
    case Kind::kU32:
      return H5Tcopy(H5T_STD_U32LE);
    case Kind::kI64:
      return H5Tcopy(H5T_STD_I64LE);
    case Kind::kF32:
      return H5Tcopy(H5T_IEEE_F32LE);
    case Kind::kF64:
      return H5Tcopy(H5T_IEEE_F64LE);
    case Kind::kFixedString: {
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, fixed_len == 0 ? 1 : fixed_len);
      H5Tset_strpad(t, H5T_STR_NULLTERM);
      return t;
    }
    case Kind::kVlString: {
      const hid_t t = H5Tcopy(H5T_C_S1);
      H5Tset_size(t, H5T_VARIABLE);
      H5Tset_cset(t, H5T_CSET_UTF8);
      return t;
    }
  }
  return -1;
}

size_t ElementSize(Kind k) {
  switch (k) {
    case Kind::kU8:
    case Kind::kI8:
      return 1;
    case Kind::kU16:
      return 2;
    case Kind::kI32:
    case Kind::kU32:
    case Kind::kF32:
      return 4;
    case Kind::kI64:
    case Kind::kF64:
      return 8;
    default:
      return 0;
  }
}

// Overwrites element i of a little-endian buffer of `size`-byte elements of a float (is_float)
// or integer type with a value readers tend to mishandle.
void PokeSpecial(FuzzedDataProvider& in, uint8_t* elem, size_t size, bool is_float) {
  if (is_float) {
    static const double kSpecial[] = {std::nan(""), INFINITY, -INFINITY, -1.0,  0.0,
                                      -0.0,         1e30,     1e-45,     255.0, 0.5};
    const double v = kSpecial[in.ConsumeIntegralInRange<size_t>(0, std::size(kSpecial) - 1)];
    if (size == 4) {
      const float f = static_cast<float>(v);
      std::memcpy(elem, &f, 4);
    } else if (size == 8) {
      std::memcpy(elem, &v, 8);
    }
    return;
  }
  static const int64_t kSpecial[] = {-1,
                                     0,
                                     1,
                                     9,
                                     10,
                                     11,
                                     255,
                                     65535,
                                     1LL << 31,
                                     (1LL << 31) - 1,
                                     std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min()};
  const int64_t v = kSpecial[in.ConsumeIntegralInRange<size_t>(0, std::size(kSpecial) - 1)];
  std::memcpy(elem, &v, size <= 8 ? size : 8);  // little-endian: the low bytes
}

// Numeric bytes for n elements: from the input, with a few special values planted.
std::vector<uint8_t> NumericData(FuzzedDataProvider& in, Kind k, hsize_t n) {
  const size_t es = ElementSize(k);
  std::vector<uint8_t> buf(static_cast<size_t>(n) * es);
  const std::vector<uint8_t> raw = in.ConsumeBytes<uint8_t>(buf.size());
  if (!raw.empty()) std::memcpy(buf.data(), raw.data(), raw.size());
  const bool is_float = k == Kind::kF32 || k == Kind::kF64;
  for (int j = in.ConsumeIntegralInRange(0, 3); j > 0 && n > 0; --j) {
    const hsize_t i = in.ConsumeIntegralInRange<hsize_t>(0, n - 1);
    PokeSpecial(in, buf.data() + i * es, es, is_float);
  }
  return buf;
}

hid_t IntermediateGroups() {
  const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  return lcpl;
}

// Creates the dataset `path` (none may exist there) of kind k and shape dims, data from `in`.
void CreateDataset(hid_t file, const std::string& path, Kind k, const std::vector<hsize_t>& dims,
                   FuzzedDataProvider& in) {
  hsize_t n = 1;
  for (hsize_t d : dims) n *= d;
  if (n > kMaxElements) return;
  const bool vl = k == Kind::kVlString;
  const std::string text = in.ConsumeRandomLengthString(64);
  if ((vl || k == Kind::kFixedString) && !dims.empty()) return;  // strings: scalars only
  const hid_t type = FileType(k, text.size() + 1);
  const hid_t space = dims.empty()
                          ? H5Screate(H5S_SCALAR)
                          : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  bool chunk = !dims.empty() && n > 0 && in.ConsumeBool();
  if (chunk) {
    std::vector<hsize_t> c(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) c[i] = in.ConsumeIntegralInRange<hsize_t>(1, dims[i]);
    H5Pset_chunk(dcpl, static_cast<int>(c.size()), c.data());
    if (in.ConsumeBool()) H5Pset_deflate(dcpl, 1);
  }
  const hid_t lcpl = IntermediateGroups();
  const hid_t d = H5Dcreate2(file, path.c_str(), type, space, lcpl, dcpl, H5P_DEFAULT);
  if (d >= 0) {
    if (vl) {
      const char* p = text.c_str();
      H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, &p);
    } else if (k == Kind::kFixedString) {
      H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.c_str());
    } else if (n > 0) {
      const std::vector<uint8_t> buf = NumericData(in, k, n);
      H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    }
    H5Dclose(d);
  }
  H5Pclose(lcpl);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Tclose(type);
}

std::vector<hsize_t> RandomDims(FuzzedDataProvider& in) {
  std::vector<hsize_t> dims(in.ConsumeIntegralInRange(0, 4));
  for (hsize_t& d : dims) d = in.ConsumeIntegralInRange<hsize_t>(0, 9);
  return dims;
}

// The dataset's shape, and its kind when it is one of ours (else a random kind).
void Describe(hid_t d, FuzzedDataProvider& in, Kind* kind, std::vector<hsize_t>* dims) {
  const hid_t space = H5Dget_space(d);
  const int rank = H5Sget_simple_extent_ndims(space);
  dims->assign(rank > 0 ? static_cast<size_t>(rank) : 0, 0);
  if (rank > 0) H5Sget_simple_extent_dims(space, dims->data(), nullptr);
  H5Sclose(space);
  const hid_t t = H5Dget_type(d);
  const H5T_class_t cls = H5Tget_class(t);
  const size_t size = H5Tget_size(t);
  H5Tclose(t);
  *kind = static_cast<Kind>(in.ConsumeIntegralInRange(0, kNumKinds - 1));
  if (cls == H5T_FLOAT) *kind = size == 4 ? Kind::kF32 : Kind::kF64;
  if (cls == H5T_INTEGER) *kind = size == 1 ? Kind::kU8 : size == 8 ? Kind::kI64 : Kind::kI32;
}

// Replaces a dataset by one of another kind, another shape, or both.
void ReplaceDataset(hid_t file, const std::string& path, FuzzedDataProvider& in) {
  const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) return;
  Kind kind;
  std::vector<hsize_t> dims;
  Describe(d, in, &kind, &dims);
  H5Dclose(d);
  switch (in.ConsumeIntegralInRange(0, 2)) {
    case 0:
      kind = static_cast<Kind>(in.ConsumeIntegralInRange(0, kNumKinds - 1));
      break;
    case 1:
      if (!dims.empty() && in.ConsumeBool()) {
        hsize_t& one = dims[in.ConsumeIntegralInRange<size_t>(0, dims.size() - 1)];
        one = in.ConsumeIntegralInRange<hsize_t>(0, one + 2);
      } else {
        dims = RandomDims(in);
      }
      break;
    default:
      kind = static_cast<Kind>(in.ConsumeIntegralInRange(0, kNumKinds - 1));
      dims = RandomDims(in);
  }
  if (H5Ldelete(file, path.c_str(), H5P_DEFAULT) < 0) return;
  CreateDataset(file, path, kind, dims, in);
}

// Changes a few elements of a numeric dataset (in place, same type and shape).
void PokeValues(hid_t file, const std::string& path, FuzzedDataProvider& in) {
  const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) return;
  const hid_t ftype = H5Dget_type(d);
  const H5T_class_t cls = H5Tget_class(ftype);
  const hid_t space = H5Dget_space(d);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if ((cls == H5T_INTEGER || cls == H5T_FLOAT) && n > 0 && n <= (1 << 20)) {
    const hid_t mtype = H5Tget_native_type(ftype, H5T_DIR_ASCEND);
    const size_t es = H5Tget_size(mtype);
    std::vector<uint8_t> buf(static_cast<size_t>(n) * es);
    if (H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0) {
      for (int j = in.ConsumeIntegralInRange(1, 4); j > 0; --j) {
        const size_t i = in.ConsumeIntegralInRange<size_t>(0, static_cast<size_t>(n) - 1);
        if (in.ConsumeBool()) {
          PokeSpecial(in, buf.data() + i * es, es, cls == H5T_FLOAT);
        } else {
          const std::vector<uint8_t> b = in.ConsumeBytes<uint8_t>(es);
          if (!b.empty()) std::memcpy(buf.data() + i * es, b.data(), b.size());
        }
      }
      H5Dwrite(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data());
    }
    H5Tclose(mtype);
  }
  H5Sclose(space);
  H5Tclose(ftype);
  H5Dclose(d);
}

hid_t OpenObject(hid_t file, const std::string& path) {
  return H5Oopen(file, path.c_str(), H5P_DEFAULT);
}

// Sets attribute `name` of the object at `path` to a value of a random kind (replacing it).
void SetAttribute(hid_t file, const std::string& path, const std::string& name,
                  FuzzedDataProvider& in) {
  const hid_t obj = OpenObject(file, path);
  if (obj < 0) return;
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  const Kind k = static_cast<Kind>(in.ConsumeIntegralInRange(0, kNumKinds - 1));
  const std::string text = in.ConsumeRandomLengthString(64);
  const bool is_string = k == Kind::kFixedString || k == Kind::kVlString;
  const hsize_t n = !is_string && in.ConsumeBool() ? in.ConsumeIntegralInRange<hsize_t>(0, 5) : 1;
  const hid_t type = FileType(k, text.size() + 1);
  const hid_t space = n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
  const hid_t a = H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (a >= 0) {
    if (k == Kind::kVlString) {
      const char* p = text.c_str();
      H5Awrite(a, type, &p);
    } else if (k == Kind::kFixedString) {
      H5Awrite(a, type, text.c_str());
    } else if (n > 0) {
      const std::vector<uint8_t> buf = NumericData(in, k, n);
      H5Awrite(a, type, buf.data());
    }
    H5Aclose(a);
  }
  H5Sclose(space);
  H5Tclose(type);
  H5Oclose(obj);
}

// The names of the attributes of the object at `path`.
std::vector<std::string> AttributeNames(hid_t file, const std::string& path) {
  std::vector<std::string> names;
  const hid_t obj = OpenObject(file, path);
  if (obj < 0) return names;
  const int n = H5Aget_num_attrs(obj);
  for (int i = 0; i < n; ++i) {
    char buf[256] = {};
    if (H5Aget_name_by_idx(obj, ".", H5_INDEX_NAME, H5_ITER_NATIVE, static_cast<hsize_t>(i), buf,
                           sizeof buf, H5P_DEFAULT) > 0) {
      names.emplace_back(buf);
    }
  }
  H5Oclose(obj);
  return names;
}

}  // namespace

void EditHdf5(const std::string& path, FuzzedDataProvider& in,
              const std::vector<std::string>& names, int max_edits) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);  // failed edits are expected and ignored
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) {
    std::fprintf(stderr, "fuzz harness: cannot open %s for editing\n", path.c_str());
    std::abort();
  }
  for (int e = in.ConsumeIntegralInRange(0, max_edits); e > 0 && in.remaining_bytes() > 0; --e) {
    const Objects objs = ListObjects(file);
    std::vector<std::string> all = objs.groups;
    all.insert(all.end(), objs.datasets.begin(), objs.datasets.end());
    switch (in.ConsumeIntegralInRange(0, 8)) {
      case 0:  // delete an object (not the root)
        if (all.size() > 1) {
          H5Ldelete(file, all[in.ConsumeIntegralInRange<size_t>(1, all.size() - 1)].c_str(),
                    H5P_DEFAULT);
        }
        break;
      case 1: {  // delete an attribute
        const std::string& obj = Pick(in, all);
        const std::vector<std::string> attrs = AttributeNames(file, obj);
        if (!attrs.empty())
          H5Adelete_by_name(file, obj.c_str(), Pick(in, attrs).c_str(), H5P_DEFAULT);
        break;
      }
      case 2: {  // change an existing attribute's type or value
        const std::string& obj = Pick(in, all);
        const std::vector<std::string> attrs = AttributeNames(file, obj);
        if (!attrs.empty()) SetAttribute(file, obj, Pick(in, attrs), in);
        break;
      }
      case 3:  // add an attribute
        SetAttribute(file, Pick(in, all), PickName(in, names), in);
        break;
      case 4:
      case 5:  // another type or shape; a few other values
        if (!objs.datasets.empty()) {
          const std::string& ds = Pick(in, objs.datasets);
          if (in.ConsumeBool()) {
            ReplaceDataset(file, ds, in);
          } else {
            PokeValues(file, ds, in);
          }
        }
        break;
      case 6:  // a new dataset
        CreateDataset(file, PickPath(in, objs, names),
                      static_cast<Kind>(in.ConsumeIntegralInRange(0, kNumKinds - 1)),
                      RandomDims(in), in);
        break;
      case 7: {  // a new group
        const hid_t lcpl = IntermediateGroups();
        const hid_t g =
            H5Gcreate2(file, PickPath(in, objs, names).c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT);
        if (g >= 0) H5Gclose(g);
        H5Pclose(lcpl);
        break;
      }
      default: {  // move or rename an object
        if (all.size() > 1) {
          const std::string& src = all[in.ConsumeIntegralInRange<size_t>(1, all.size() - 1)];
          const hid_t lcpl = IntermediateGroups();
          H5Lmove(file, src.c_str(), file, PickPath(in, objs, names).c_str(), lcpl, H5P_DEFAULT);
          H5Pclose(lcpl);
        }
      }
    }
  }
  H5Fclose(file);
}

void FixCrc32Attributes(const std::string& path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  if (file < 0) return;
  for (const std::string& ds : ListObjects(file).datasets) {
    const hid_t d = H5Dopen2(file, ds.c_str(), H5P_DEFAULT);
    if (d < 0) continue;
    const hid_t ftype = H5Dget_type(d);
    const H5T_class_t cls = H5Tget_class(ftype);
    const size_t size = H5Tget_size(ftype);
    const hid_t space = H5Dget_space(d);
    const hssize_t n = H5Sget_simple_extent_npoints(space);
    hid_t mtype = -1;
    if (cls == H5T_FLOAT && size == 4) mtype = H5T_NATIVE_FLOAT;
    if (cls == H5T_INTEGER && size == 8) mtype = H5T_NATIVE_INT64;
    if (mtype >= 0 && n >= 0 && n <= (1 << 20) && H5Aexists(d, "crc32") > 0) {
      std::vector<uint8_t> buf(static_cast<size_t>(n) * size);
      if (H5Dread(d, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) >= 0) {
        ReplaceCrc32(d, Crc32(buf.data(), buf.size()));
      }
    }
    H5Sclose(space);
    H5Tclose(ftype);
    H5Dclose(d);
  }
  // /state@crc32 covers the group's other attributes (WriteCheckpoint's AttributesCrc).
  const hid_t g = H5Lexists(file, "state", H5P_DEFAULT) > 0 ? H5Gopen2(file, "state", H5P_DEFAULT)
                                                            : H5I_INVALID_HID;
  if (g >= 0 && H5Aexists(g, "crc32") > 0) {
    std::string why;
    if (const std::optional<std::string> text = h5::AttributesText(g, "crc32", &why)) {
      ReplaceCrc32(g, Crc32(text->data(), text->size()));
    }
  }
  if (g >= 0) H5Gclose(g);
  H5Fclose(file);
}

}  // namespace dptrain::fuzz
