// SPDX-License-Identifier: Apache-2.0
// DescribeHdf5File: walks the link tree with H5Lvisit and prints objects and attributes.
#include "datasets/inspect.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/hdf5/hdf5_util.h"
#include "datasets/dataset.h"

namespace dptrain {
namespace {

// left + s + right built by appending: GCC 12 at -O3 reports a false -Wrestrict for
// operator+(const char*, std::string&&) (GCC bug 105329), which -Werror turns into a failure.
std::string Wrap(const char* left, const std::string& s, const char* right) {
  std::string out(left);
  out += s;
  out += right;
  return out;
}
std::string Quoted(const std::string& s) { return Wrap("\"", s, "\""); }

constexpr size_t kMaxValues = 8;    // array attributes: first values, then "..."
constexpr size_t kMaxString = 120;  // long strings (a config text) are shortened

std::string Shorten(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  if (s.size() > kMaxString) {
    s.resize(kMaxString);
    s += "...";
  }
  return s;
}

std::string DimsString(const std::vector<int64_t>& d) {
  return d.empty() ? std::string("scalar") : Shape(d).ToString();
}

// The value of an attribute: numbers (first kMaxValues), strings, or "<type>" for others.
std::string AttrValue(hid_t attr) {
  h5::Id type = h5::Type(H5Aget_type(attr));
  h5::Id space = h5::Space(H5Aget_space(attr));
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  const H5T_class_t cls = H5Tget_class(type.get());
  std::ostringstream os;
  if (n < 0) return "?";
  if (cls == H5T_STRING) {
    if (n != 1) return "string " + DimsString(h5::Dims(space.get()));
    const std::optional<std::string> text = h5::ReadStringAttr(attr);
    return text ? Quoted(Shorten(*text)) : "?";
  }
  if (cls != H5T_INTEGER && cls != H5T_FLOAT) return Wrap("<", h5::TypeName(type.get()), ">");
  std::vector<double> v(static_cast<size_t>(n));
  if (n > 0 && H5Aread(attr, H5T_NATIVE_DOUBLE, v.data()) < 0) return "?";
  const bool array = H5Sget_simple_extent_ndims(space.get()) > 0;
  if (array) os << "[";
  for (size_t i = 0; i < v.size() && i < kMaxValues; ++i) {
    if (i) os << ", ";
    os << v[i];
  }
  if (v.size() > kMaxValues) os << ", ... (" << v.size() << " values)";
  if (array) os << "]";
  return os.str();
}

herr_t AttrCallback(hid_t loc, const char* name, const H5A_info_t* /*info*/, void* data) {
  auto* os = static_cast<std::ostringstream*>(data);
  h5::Id a = h5::Attr(H5Aopen(loc, name, H5P_DEFAULT));
  *os << "    @" << name << " = " << (a.valid() ? AttrValue(a.get()) : "?") << "\n";
  return 0;
}

void DescribeObject(hid_t file, const std::string& name, std::ostringstream& os) {
  h5::Id obj = h5::Object(H5Oopen(file, name.c_str(), H5P_DEFAULT));
  if (!obj.valid()) {
    os << name << "  (unreadable: " << h5::ErrorStackString() << ")\n";
    return;
  }
  const H5I_type_t kind = H5Iget_type(obj.get());
  if (kind == H5I_GROUP) {
    os << (name == "/" ? "/" : name + "/") << "  group\n";
  } else if (kind == H5I_DATASET) {
    h5::Id type = h5::Type(H5Dget_type(obj.get()));
    h5::Id space = h5::Space(H5Dget_space(obj.get()));
    os << name << "  " << h5::TypeName(type.get()) << " " << DimsString(h5::Dims(space.get()));
    h5::Id dcpl = h5::Plist(H5Dget_create_plist(obj.get()));
    if (dcpl.valid() && H5Pget_layout(dcpl.get()) == H5D_CHUNKED) {
      std::vector<hsize_t> cd(32);
      const int r = H5Pget_chunk(dcpl.get(), 32, cd.data());
      if (r > 0)
        os << "  chunks " << Shape(std::vector<int64_t>(cd.begin(), cd.begin() + r)).ToString();
    }
    os << "\n";
  } else {
    os << name << "  (named datatype or other object)\n";
  }
  hsize_t idx = 0;
  H5Aiterate2(obj.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, &AttrCallback, &os);
}

// H5Lvisit callback; the link-info type is deduced so the code builds against 1.10 and 1.12+.
template <class Info>
herr_t CollectName(hid_t /*group*/, const char* name, const Info* /*info*/, void* data) {
  static_cast<std::vector<std::string>*>(data)->push_back(std::string("/") + name);
  return 0;
}

// Summary of a dataset file: N, sample shape, dtype, classes, label counts, validity.
void DescribeDataset(hid_t file, const std::string& path, std::ostringstream& os) {
  os << "\ndataset summary:\n";
  h5::Id images = h5::Dataset(H5Dopen2(file, "images", H5P_DEFAULT));
  h5::Id labels = h5::Dataset(H5Dopen2(file, "labels", H5P_DEFAULT));
  if (images.valid()) {
    h5::Id type = h5::Type(H5Dget_type(images.get()));
    h5::Id space = h5::Space(H5Dget_space(images.get()));
    const std::vector<int64_t> d = h5::Dims(space.get());
    if (!d.empty()) {
      os << "  samples  " << d[0] << "\n";
      os << "  sample   " << Shape(std::vector<int64_t>(d.begin() + 1, d.end())).ToString() << " "
         << h5::TypeName(type.get()) << "\n";
    }
  }
  if (labels.valid()) {
    h5::Id type = h5::Type(H5Dget_type(labels.get()));
    h5::Id space = h5::Space(H5Dget_space(labels.get()));
    const hssize_t n = H5Sget_simple_extent_npoints(space.get());
    if (H5Tget_class(type.get()) == H5T_INTEGER && n >= 0) {
      std::vector<int64_t> v(static_cast<size_t>(n));
      if (n == 0 ||
          H5Dread(labels.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0) {
        std::map<int64_t, int64_t> counts;
        for (int64_t x : v) ++counts[x];
        const int64_t max = counts.empty() ? -1 : counts.rbegin()->first;
        os << "  labels   " << n << " (" << counts.size() << " distinct, max " << max << ")\n";
        os << "  per class";
        for (const auto& [label, c] : counts) os << " " << label << ":" << c;
        os << "\n";
      }
    }
  }
  try {
    OpenOptions opts;
    opts.cache = CacheMode::kChunks;
    const auto ds = OpenHdf5Dataset(path, opts);
    const DatasetInfo& info = ds->info();
    os << "  classes  " << (info.classes > 0 ? std::to_string(info.classes) : "(not recorded)")
       << "\n";
    if (!info.class_names.empty()) {
      os << "  names   ";
      for (size_t k = 0; k < info.class_names.size(); ++k) {
        if (k == 20 && info.class_names.size() > 24) {
          os << " ... (" << info.class_names.size() - 20 << " more)";
          break;
        }
        os << " " << k << ":" << info.class_names[k];
      }
      os << "\n";
    }
    os << "  valid    yes: " << info.size << " samples of " << info.sample_shape.ToString() << " "
       << (info.image_dtype == DType::kU8 ? "uint8" : "float32") << "\n";
  } catch (const Error& e) {
    os << "  valid    NO: " << e.what() << "\n";
  }
}

}  // namespace

std::string DescribeHdf5File(const std::string& path) {
  h5::ScopedSilence silence;
  h5::Id file = h5::OpenFileReadOnly<IoError>(path);
  std::vector<std::string> names;
  if (H5Lvisit(file.get(), H5_INDEX_NAME, H5_ITER_INC, &CollectName, &names) < 0) {
    DPT_THROW(IoError) << path << ": cannot list objects: " << h5::ErrorStackString();
  }
  std::ostringstream os;
  os << path << "\n";
  DescribeObject(file.get(), "/", os);
  for (const std::string& name : names) DescribeObject(file.get(), name, os);
  const bool is_dataset = H5Lexists(file.get(), "images", H5P_DEFAULT) > 0 &&
                          H5Lexists(file.get(), "labels", H5P_DEFAULT) > 0;
  if (is_dataset) DescribeDataset(file.get(), path, os);
  return os.str();
}

std::string Hdf5LibraryVersion() {
  unsigned major = 0, minor = 0, release = 0;
  if (H5get_libversion(&major, &minor, &release) < 0) return "unknown";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

}  // namespace dptrain
