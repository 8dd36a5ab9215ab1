// SPDX-License-Identifier: Apache-2.0
// RAII owners for HDF5 ids, error-stack capture and small read helpers (dptrain_hdf5), for the
// .cc files that read or write HDF5 (datasets/, checkpoints). Includes <hdf5.h>, so no public
// header of another folder includes it: HDF5 types stay behind the Dataset and checkpoint seams.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace dptrain::h5 {

// Owns one HDF5 id (file, group, dataset, dataspace, datatype, property list, attribute) and
// closes it with the matching H5*close function. Move-only. Closing errors are ignored: a
// destructor never throws.
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Id() { Reset(); }
  Id(Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Id& operator=(Id&& o) noexcept {
    if (this != &o) {
      Reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Gives up ownership without closing (the caller closes and checks the result).
  hid_t Release() { return std::exchange(id_, H5I_INVALID_HID); }
  void Reset() {
    if (id_ >= 0 && closer_ != nullptr) closer_(id_);
    id_ = H5I_INVALID_HID;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

inline Id File(hid_t id) { return Id(id, &H5Fclose); }
inline Id Group(hid_t id) { return Id(id, &H5Gclose); }
inline Id Dataset(hid_t id) { return Id(id, &H5Dclose); }
inline Id Space(hid_t id) { return Id(id, &H5Sclose); }
inline Id Type(hid_t id) { return Id(id, &H5Tclose); }
inline Id Plist(hid_t id) { return Id(id, &H5Pclose); }
inline Id Attr(hid_t id) { return Id(id, &H5Aclose); }
inline Id Object(hid_t id) { return Id(id, &H5Oclose); }

// Turns off HDF5's automatic printing of error stacks to stderr for the current thread (the
// thread-safe build keeps one error stack per thread) and restores it on destruction. Every
// public entry point of datasets/ that calls HDF5 holds one, so failures surface only as our
// exceptions, whose messages carry the stack's text (ErrorStackString).
class ScopedSilence {
 public:
  ScopedSilence() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~ScopedSilence() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  ScopedSilence(const ScopedSilence&) = delete;
  ScopedSilence& operator=(const ScopedSilence&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// The current thread's HDF5 error stack as one short line, innermost cause first, e.g.
// "file signature not found; unable to open file". Empty when the stack is empty.
std::string ErrorStackString();

// Element type of a dataset or attribute in words: "uint8", "int64", "float32", "string", ...
std::string TypeName(hid_t type);

// Dimensions of a dataspace (empty for a scalar).
std::vector<int64_t> Dims(hid_t space);

// The attributes of `obj` except `skip` as text, for a checksum over them: one line
// "name=value\n" per attribute in name order (byte order), integers in decimal, floats as
// "%.17g" (C locale; "nan" for any NaN), strings as they are. nullopt with *why (not null) naming
// the attribute when one is not a single integer, float or string, or cannot be read. Python's
// equivalent is in docs/checkpoints.md ("/state@crc32").
std::optional<std::string> AttributesText(hid_t obj, const char* skip, std::string* why);

// The text of a string attribute holding one string (variable or fixed length); nullopt when
// the attribute is not a single string or cannot be read.
std::optional<std::string> ReadStringAttr(hid_t attr);

// Opens `path` read-only with file locking disabled where the file system does not support it
// (shared cluster file systems). Throws `E` naming the file: missing, not HDF5, truncated.
template <class E>
Id OpenFileReadOnly(const std::string& path);

}  // namespace dptrain::h5

// Throws `Type` when an HDF5 call returns a negative value; the message has the call's text and
// the HDF5 error stack, then the context streamed after the macro:
//   DPT_H5_CHECK_AS(DataError, H5Dread(...)) << path << ": /images: cannot read samples";
#define DPT_H5_CHECK_AS(Type, expr)                                                               \
  if ((expr) >= 0) {                                                                              \
  } else                                                                                          \
    ::dptrain::detail::Raise() & ::dptrain::detail::ErrorStream<Type>(__FILE__, __LINE__, "hdf5") \
                                     << ::dptrain::h5::ErrorStackString() << " (in " #expr "); "
