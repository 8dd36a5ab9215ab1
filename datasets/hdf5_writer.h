// SPDX-License-Identifier: Apache-2.0
// A small HDF5 writer with no HDF5 types in its interface: numeric arrays, strings, groups and
// attributes. Used by WriteHdf5Dataset and by tests that need files of any shape or dtype
// (including deliberately malformed dataset files).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dptrain {

// Element types the writer stores (little-endian in the file).
enum class H5Elem : uint8_t { kU8, kI8, kU16, kI16, kU32, kI32, kU64, kI64, kF32, kF64 };

class Hdf5Writer {
 public:
  // Creates `path`, truncating an existing file. Throws IoError naming the file.
  explicit Hdf5Writer(const std::string& path);
  // Closes the file if Close() was not called; errors are ignored (never throws).
  ~Hdf5Writer();
  Hdf5Writer(const Hdf5Writer&) = delete;
  Hdf5Writer& operator=(const Hdf5Writer&) = delete;

  // Writes the array `name` ("/params/conv1.weight"; missing groups are created) with shape
  // `dims` from `data` (C order, product(dims) elements of `elem`; may be null when empty).
  // chunk_rows > 0 chunks the array along dimension 0 with that many rows per chunk (the other
  // dimensions whole); 0 stores it contiguously. Throws IoError.
  void WriteArray(const std::string& name, H5Elem elem, const std::vector<int64_t>& dims,
                  const void* data, int64_t chunk_rows = 0);
  // Incremental writing, so that a large array never has to be held in memory whole:
  // CreateArray makes the array `name` with shape `dims`, chunked along dimension 0 with
  // chunk_rows (> 0) rows per chunk and no maximum on dimension 0; WriteRows fills rows
  // [first, first + rows) from `data` (C order, rows * product(dims[1:]) elements of `elem`);
  // SetRows changes dimension 0 (shrinking discards the rows past it). Rows never written read
  // as 0. The array stays open until Close(). Throws IoError; a row range outside the array or
  // an array not made by CreateArray is an InternalError.
  void CreateArray(const std::string& name, H5Elem elem, const std::vector<int64_t>& dims,
                   int64_t chunk_rows);
  void WriteRows(const std::string& name, H5Elem elem, int64_t first, int64_t rows,
                 const void* data);
  void SetRows(const std::string& name, int64_t rows);

  // A scalar variable-length UTF-8 string dataset (e.g. /config).
  void WriteString(const std::string& name, const std::string& text);
  void CreateGroup(const std::string& name);

  // Attributes on the object `object` ("/" is the root group; a group or dataset that exists).
  // A scalar when dims is empty.
  void SetAttr(const std::string& object, const std::string& attr, H5Elem elem,
               const std::vector<int64_t>& dims, const void* data);
  void SetIntAttr(const std::string& object, const std::string& attr, int64_t value);
  void SetDoubleAttr(const std::string& object, const std::string& attr, double value);
  void SetFloatsAttr(const std::string& object, const std::string& attr,
                     const std::vector<float>& values);
  void SetStringAttr(const std::string& object, const std::string& attr, const std::string& text);

  // Flushes and closes the file. Throws IoError. The writer is unusable afterwards.
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dptrain
