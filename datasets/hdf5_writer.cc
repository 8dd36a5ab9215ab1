// SPDX-License-Identifier: Apache-2.0
// Hdf5Writer: arrays, strings, groups and attributes through RAII-owned HDF5 ids.
#include "datasets/hdf5_writer.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/error.h"
#include "core/hdf5/hdf5_util.h"

namespace dptrain {
namespace {

// File (little-endian) type and memory (native) type of an element.
hid_t FileType(H5Elem e) {
  switch (e) {
    case H5Elem::kU8:
      return H5T_STD_U8LE;
    case H5Elem::kI8:
      return H5T_STD_I8LE;
    case H5Elem::kU16:
      return H5T_STD_U16LE;
    case H5Elem::kI16:
      return H5T_STD_I16LE;
    case H5Elem::kU32:
      return H5T_STD_U32LE;
    case H5Elem::kI32:
      return H5T_STD_I32LE;
    case H5Elem::kU64:
      return H5T_STD_U64LE;
    case H5Elem::kI64:
      return H5T_STD_I64LE;
    case H5Elem::kF32:
      return H5T_IEEE_F32LE;
    case H5Elem::kF64:
      return H5T_IEEE_F64LE;
  }
  return H5T_STD_U8LE;
}

hid_t MemType(H5Elem e) {
  switch (e) {
    case H5Elem::kU8:
      return H5T_NATIVE_UINT8;
    case H5Elem::kI8:
      return H5T_NATIVE_INT8;
    case H5Elem::kU16:
      return H5T_NATIVE_UINT16;
    case H5Elem::kI16:
      return H5T_NATIVE_INT16;
    case H5Elem::kU32:
      return H5T_NATIVE_UINT32;
    case H5Elem::kI32:
      return H5T_NATIVE_INT32;
    case H5Elem::kU64:
      return H5T_NATIVE_UINT64;
    case H5Elem::kI64:
      return H5T_NATIVE_INT64;
    case H5Elem::kF32:
      return H5T_NATIVE_FLOAT;
    case H5Elem::kF64:
      return H5T_NATIVE_DOUBLE;
  }
  return H5T_NATIVE_UINT8;
}

h5::Id SimpleSpace(const std::vector<int64_t>& dims) {
  if (dims.empty()) return h5::Space(H5Screate(H5S_SCALAR));
  std::vector<hsize_t> d(dims.begin(), dims.end());
  return h5::Space(H5Screate_simple(static_cast<int>(d.size()), d.data(), nullptr));
}

}  // namespace

struct Hdf5Writer::Impl {
  std::string path;
  h5::Id file;
  h5::Id lcpl;  // link creation: create missing intermediate groups
  // Arrays made by CreateArray, open until Close() (after `file`: destroyed first).
  struct OpenArray {
    h5::Id dset;
    std::vector<int64_t> dims;
  };
  std::map<std::string, OpenArray> arrays;

  // The dataset `name` of `elem` in the file, with the dataspace and creation properties given.
  h5::Id CreateDataset(const std::string& name, H5Elem elem, const h5::Id& space,
                       const h5::Id& dcpl) const {
    h5::Id dset = h5::Dataset(H5Dcreate2(file.get(), name.c_str(), FileType(elem), space.get(),
                                         lcpl.get(), dcpl.get(), H5P_DEFAULT));
    if (!dset.valid()) {
      DPT_THROW(IoError) << path << ": " << name
                         << ": cannot create dataset: " << h5::ErrorStackString();
    }
    return dset;
  }
};

Hdf5Writer::Hdf5Writer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  h5::ScopedSilence silence;
  impl_->path = path;
  impl_->file = h5::File(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!impl_->file.valid()) {
    DPT_THROW(IoError) << path << ": cannot create HDF5 file: " << h5::ErrorStackString();
  }
  impl_->lcpl = h5::Plist(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(impl_->lcpl.get(), 1);
}

Hdf5Writer::~Hdf5Writer() {
  if (impl_ != nullptr) {
    h5::ScopedSilence silence;
    impl_->arrays.clear();
    impl_->file.Reset();
  }
}

void Hdf5Writer::WriteArray(const std::string& name, H5Elem elem, const std::vector<int64_t>& dims,
                            const void* data, int64_t chunk_rows) {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer used after Close()";
  h5::ScopedSilence silence;
  int64_t numel = 1;
  for (int64_t d : dims) {
    DPT_CHECK_AS(IoError, d >= 0) << impl_->path << ": " << name << ": negative dimension";
    numel *= d;
  }
  h5::Id space = SimpleSpace(dims);
  h5::Id dcpl = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
  if (chunk_rows > 0 && !dims.empty() && dims[0] > 0) {
    std::vector<hsize_t> chunk(dims.begin(), dims.end());
    chunk[0] = static_cast<hsize_t>(std::min(chunk_rows, dims[0]));
    for (size_t i = 1; i < chunk.size(); ++i) chunk[i] = std::max<hsize_t>(chunk[i], 1);
    DPT_H5_CHECK_AS(IoError, H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()))
        << impl_->path << ": " << name << ": cannot set chunking";
  }
  h5::Id dset = impl_->CreateDataset(name, elem, space, dcpl);
  if (numel > 0) {
    DPT_CHECK(data != nullptr) << name << ": null data";
    if (H5Dwrite(dset.get(), MemType(elem), H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
      DPT_THROW(IoError) << impl_->path << ": " << name
                         << ": cannot write dataset: " << h5::ErrorStackString();
    }
  }
}

void Hdf5Writer::CreateArray(const std::string& name, H5Elem elem, const std::vector<int64_t>& dims,
                             int64_t chunk_rows) {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer used after Close()";
  DPT_CHECK(!dims.empty() && chunk_rows > 0)
      << name << ": CreateArray needs rank >= 1, chunk_rows > 0";
  DPT_CHECK(impl_->arrays.count(name) == 0) << name << ": CreateArray called twice";
  h5::ScopedSilence silence;
  std::vector<hsize_t> d(dims.size()), max_d(dims.size()), chunk(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    DPT_CHECK_AS(IoError, dims[i] >= 0) << impl_->path << ": " << name << ": negative dimension";
    d[i] = max_d[i] = static_cast<hsize_t>(dims[i]);
    chunk[i] = std::max<hsize_t>(d[i], 1);
  }
  max_d[0] = H5S_UNLIMITED;
  chunk[0] = static_cast<hsize_t>(chunk_rows);
  h5::Id space = h5::Space(H5Screate_simple(static_cast<int>(d.size()), d.data(), max_d.data()));
  h5::Id dcpl = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
  DPT_H5_CHECK_AS(IoError, H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()))
      << impl_->path << ": " << name << ": cannot set chunking";
  h5::Id dset = impl_->CreateDataset(name, elem, space, dcpl);
  impl_->arrays[name] = Impl::OpenArray{std::move(dset), dims};
}

void Hdf5Writer::WriteRows(const std::string& name, H5Elem elem, int64_t first, int64_t rows,
                           const void* data) {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer used after Close()";
  auto it = impl_->arrays.find(name);
  DPT_CHECK(it != impl_->arrays.end()) << name << ": WriteRows on an array not made by CreateArray";
  const std::vector<int64_t>& dims = it->second.dims;
  DPT_CHECK(first >= 0 && rows >= 0 && first + rows <= dims[0])
      << name << ": rows [" << first << ", " << first + rows << ") outside [0, " << dims[0] << ")";
  if (rows == 0) return;
  DPT_CHECK(data != nullptr) << name << ": null data";
  h5::ScopedSilence silence;
  std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
  start[0] = static_cast<hsize_t>(first);
  count[0] = static_cast<hsize_t>(rows);
  h5::Id file_space = h5::Space(H5Dget_space(it->second.dset.get()));
  DPT_H5_CHECK_AS(IoError, H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(),
                                               nullptr, count.data(), nullptr))
      << impl_->path << ": " << name << ": cannot select rows";
  h5::Id mem_space =
      h5::Space(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
  if (H5Dwrite(it->second.dset.get(), MemType(elem), mem_space.get(), file_space.get(), H5P_DEFAULT,
               data) < 0) {
    DPT_THROW(IoError) << impl_->path << ": " << name << ": cannot write rows [" << first << ", "
                       << first + rows << "): " << h5::ErrorStackString();
  }
}

void Hdf5Writer::SetRows(const std::string& name, int64_t rows) {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer used after Close()";
  auto it = impl_->arrays.find(name);
  DPT_CHECK(it != impl_->arrays.end()) << name << ": SetRows on an array not made by CreateArray";
  DPT_CHECK(rows >= 0) << name << ": SetRows(" << rows << ")";
  h5::ScopedSilence silence;
  std::vector<hsize_t> d(it->second.dims.begin(), it->second.dims.end());
  d[0] = static_cast<hsize_t>(rows);
  DPT_H5_CHECK_AS(IoError, H5Dset_extent(it->second.dset.get(), d.data()))
      << impl_->path << ": " << name << ": cannot resize to " << rows << " rows";
  it->second.dims[0] = rows;
}

void Hdf5Writer::WriteString(const std::string& name, const std::string& text) {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer used after Close()";
  h5::ScopedSilence silence;
  h5::Id type = h5::Type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  h5::Id space = h5::Space(H5Screate(H5S_SCALAR));
  h5::Id dset = h5::Dataset(H5Dcreate2(impl_->file.get(), name.c_str(), type.get(), space.get(),
                                       impl_->lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
  const char* p = text.c_str();
  if (!dset.valid() || H5Dwrite(dset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, &p) < 0) {
    DPT_THROW(IoError) << impl_->path << ": " << name
                       << ": cannot write string: " << h5::ErrorStackString();
  }
}

void Hdf5Writer::CreateGroup(const std::string& name) {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer used after Close()";
  h5::ScopedSilence silence;
  h5::Id g = h5::Group(
      H5Gcreate2(impl_->file.get(), name.c_str(), impl_->lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!g.valid()) {
    DPT_THROW(IoError) << impl_->path << ": " << name
                       << ": cannot create group: " << h5::ErrorStackString();
  }
}

void Hdf5Writer::SetAttr(const std::string& object, const std::string& attr, H5Elem elem,
                         const std::vector<int64_t>& dims, const void* data) {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer used after Close()";
  h5::ScopedSilence silence;
  h5::Id space = SimpleSpace(dims);
  h5::Id a =
      h5::Attr(H5Acreate_by_name(impl_->file.get(), object.c_str(), attr.c_str(), FileType(elem),
                                 space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!a.valid() || H5Awrite(a.get(), MemType(elem), data) < 0) {
    DPT_THROW(IoError) << impl_->path << ": " << object << ": cannot write attribute " << attr
                       << ": " << h5::ErrorStackString();
  }
}

void Hdf5Writer::SetIntAttr(const std::string& object, const std::string& attr, int64_t value) {
  SetAttr(object, attr, H5Elem::kI64, {}, &value);
}

void Hdf5Writer::SetDoubleAttr(const std::string& object, const std::string& attr, double value) {
  SetAttr(object, attr, H5Elem::kF64, {}, &value);
}

void Hdf5Writer::SetFloatsAttr(const std::string& object, const std::string& attr,
                               const std::vector<float>& values) {
  SetAttr(object, attr, H5Elem::kF32, {static_cast<int64_t>(values.size())}, values.data());
}

void Hdf5Writer::SetStringAttr(const std::string& object, const std::string& attr,
                               const std::string& text) {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer used after Close()";
  h5::ScopedSilence silence;
  h5::Id type = h5::Type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  h5::Id space = h5::Space(H5Screate(H5S_SCALAR));
  h5::Id a = h5::Attr(H5Acreate_by_name(impl_->file.get(), object.c_str(), attr.c_str(), type.get(),
                                        space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  const char* p = text.c_str();
  if (!a.valid() || H5Awrite(a.get(), type.get(), &p) < 0) {
    DPT_THROW(IoError) << impl_->path << ": " << object << ": cannot write attribute " << attr
                       << ": " << h5::ErrorStackString();
  }
}

void Hdf5Writer::Close() {
  DPT_CHECK(impl_ != nullptr && impl_->file.valid()) << "Hdf5Writer closed twice";
  h5::ScopedSilence silence;
  impl_->lcpl.Reset();
  impl_->arrays.clear();
  if (H5Fflush(impl_->file.get(), H5F_SCOPE_GLOBAL) < 0) {
    DPT_THROW(IoError) << impl_->path << ": cannot flush: " << h5::ErrorStackString();
  }
  // Closed by hand, not by the RAII owner, so that a failing close (data not on disk) reports.
  if (H5Fclose(impl_->file.Release()) < 0) {
    DPT_THROW(IoError) << impl_->path << ": cannot close: " << h5::ErrorStackString();
  }
}

}  // namespace dptrain
