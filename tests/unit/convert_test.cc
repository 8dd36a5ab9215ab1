// SPDX-License-Identifier: Apache-2.0
// Converters: tiny idx (plain and gzip), CIFAR-10 binary and .npy inputs round-trip through the
// HDF5 dataset; malformed inputs (bad magic, truncation, garbage) give clear dptrain errors and
// never crash. A little over 400 lines on purpose: the byte builders at the top serve every
// converter's tests, which a split would have to move into a header of their own.
#include "datasets/convert/convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <array>
#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>

#include "core/error.h"
#include "datasets/dataset.h"
#include "tests/testing/hdf5_files.h"

namespace dptrain {
namespace {

using ::testing::HasSubstr;
using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

// ---- byte builders ----

void PutBe32(std::string* s, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) s->push_back(static_cast<char>((v >> shift) & 0xff));
}
void PutLe32(std::string* s, uint32_t v) {
  for (int shift = 0; shift <= 24; shift += 8) s->push_back(static_cast<char>((v >> shift) & 0xff));
}

uint32_t Crc32(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

// A gzip member holding `data` in stored (uncompressed) deflate blocks: valid gzip without
// needing zlib in the test.
std::string Gzip(const std::string& data) {
  std::string out = {'\x1f', '\x8b', '\x08', '\0', '\0', '\0', '\0', '\0', '\0', '\xff'};
  size_t pos = 0;
  do {
    const size_t len = std::min<size_t>(65535, data.size() - pos);
    const bool last = pos + len == data.size();
    out.push_back(last ? '\x01' : '\x00');
    out.push_back(static_cast<char>(len & 0xff));
    out.push_back(static_cast<char>(len >> 8));
    out.push_back(static_cast<char>(~len & 0xff));
    out.push_back(static_cast<char>((~len >> 8) & 0xff));
    out.append(data, pos, len);
    pos += len;
  } while (pos < data.size());
  PutLe32(&out, Crc32(data));
  PutLe32(&out, static_cast<uint32_t>(data.size()));
  return out;
}

std::string IdxImages(uint32_t n, uint32_t h, uint32_t w) {
  std::string s;
  PutBe32(&s, 0x00000803);
  PutBe32(&s, n);
  PutBe32(&s, h);
  PutBe32(&s, w);
  for (uint32_t i = 0; i < n * h * w; ++i) s.push_back(static_cast<char>((i * 13) % 256));
  return s;
}

std::string IdxLabels(const std::vector<uint8_t>& labels) {
  std::string s;
  PutBe32(&s, 0x00000801);
  PutBe32(&s, static_cast<uint32_t>(labels.size()));
  for (uint8_t l : labels) s.push_back(static_cast<char>(l));
  return s;
}

// A .npy file: version 1 (or 2/3) header, padded so the data starts at a multiple of 64.
std::string Npy(const std::string& descr, const std::string& shape, const std::string& data,
                int version = 1, const std::string& fortran = "False") {
  std::string dict =
      "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + dict.size() + 1) % 64 != 0) dict.push_back(' ');
  dict.push_back('\n');
  std::string s = "\x93NUMPY";
  s.push_back(static_cast<char>(version));
  s.push_back('\0');
  if (version == 1) {
    s.push_back(static_cast<char>(dict.size() & 0xff));
    s.push_back(static_cast<char>(dict.size() >> 8));
  } else {
    PutLe32(&s, static_cast<uint32_t>(dict.size()));
  }
  return s + dict + data;
}

template <class T>
std::string Raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Reads the whole converted dataset back.
struct Loaded {
  DatasetInfo info;
  std::vector<float> images;
  std::vector<int32_t> labels;
};
Loaded Load(const std::string& path) {
  auto ds = OpenHdf5Dataset(path, OpenOptions());
  Loaded l;
  l.info = ds->info();
  const int64_t n = l.info.size;
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  l.images.resize(static_cast<size_t>(n * l.info.sample_shape.numel()));
  l.labels.resize(static_cast<size_t>(n));
  ds->Read(idx.data(), n, l.images.data(), l.labels.data());
  return l;
}

// Runs `fn` and expects an error of type E whose message contains every part.
template <class E, class Fn>
void ExpectError(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error containing " << parts[0];
  } catch (const E& e) {
    for (const std::string& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

// ---- idx ----

TEST(ConvertTest, IdxPlainAndGzipRoundTrip) {
  TempDir dir;
  const std::string img = IdxImages(5, 3, 4);
  const std::vector<uint8_t> lab = {3, 0, 9, 1, 2};
  for (bool gz : {false, true}) {
    const std::string ip = dir.File(gz ? "i.gz" : "i.idx"), lp = dir.File(gz ? "l.gz" : "l.idx");
    WriteBytes(ip, gz ? Gzip(img) : img);
    WriteBytes(lp, gz ? Gzip(IdxLabels(lab)) : IdxLabels(lab));
    const std::string out = dir.File("out.h5");
    ConvertIdx(ip, lp, out);
    const Loaded l = Load(out);
    EXPECT_EQ(l.info.size, 5);
    EXPECT_EQ(l.info.sample_shape, Shape({1, 3, 4}));
    EXPECT_EQ(l.info.image_dtype, DType::kU8);
    EXPECT_EQ(l.info.classes, 10);
    EXPECT_EQ(l.labels, (std::vector<int32_t>{3, 0, 9, 1, 2}));
    for (size_t i = 0; i < 60; ++i) {
      ASSERT_EQ(l.images[i], static_cast<float>((i * 13) % 256) / 255.0f) << "gz " << gz;
    }
  }
}

TEST(ConvertTest, IdxErrors) {
  TempDir dir;
  const std::string ip = dir.File("i"), lp = dir.File("l"), out = dir.File("o.h5");
  const std::vector<uint8_t> lab = {1, 2, 3};
  WriteBytes(lp, IdxLabels(lab));
  // Missing file.
  ExpectError<IoError>([&] { ConvertIdx(dir.File("none"), lp, out); },
                       {dir.File("none"), "no such file"});
  // Images and labels swapped.
  WriteBytes(ip, IdxImages(3, 2, 2));
  ExpectError<DataError>([&] { ConvertIdx(lp, ip, out); }, {lp, "bad magic", "labels file"});
  // Count mismatch.
  WriteBytes(ip, IdxImages(4, 2, 2));
  ExpectError<DataError>([&] { ConvertIdx(ip, lp, out); }, {lp, "3 labels", "4 images"});
  // Truncated pixels, plain and gzip.
  std::string img = IdxImages(3, 2, 2);
  img.resize(img.size() - 1);
  WriteBytes(ip, img);
  ExpectError<DataError>([&] { ConvertIdx(ip, lp, out); }, {ip, "truncated"});
  WriteBytes(ip, Gzip(img));
  ExpectError<DataError>([&] { ConvertIdx(ip, lp, out); }, {ip, "truncated"});
  // Truncated gzip stream.
  std::string gz = Gzip(IdxImages(3, 2, 2));
  gz.resize(gz.size() - 12);
  WriteBytes(ip, gz);
  ExpectError<IoError>([&] { ConvertIdx(ip, lp, out); }, {ip});
  // Bad CRC.
  gz = Gzip(IdxImages(3, 2, 2));
  gz[gz.size() - 6] ^= 0x55;
  WriteBytes(ip, gz);
  ExpectError<IoError>([&] { ConvertIdx(ip, lp, out); }, {ip});
  // Trailing data.
  WriteBytes(ip, IdxImages(3, 2, 2) + "x");
  ExpectError<DataError>([&] { ConvertIdx(ip, lp, out); }, {ip, "unexpected data"});
  // Zero and absurd dimensions.
  WriteBytes(ip, IdxImages(0, 2, 2));
  ExpectError<DataError>([&] { ConvertIdx(ip, lp, out); }, {ip, "dimensions"});
  std::string huge;
  PutBe32(&huge, 0x803);
  PutBe32(&huge, 3);
  PutBe32(&huge, 1u << 30);
  PutBe32(&huge, 1u << 30);
  WriteBytes(ip, huge);
  ExpectError<DataError>([&] { ConvertIdx(ip, lp, out); }, {ip, "dimensions"});
  // Header claims far more data than the file holds: truncated, not a huge allocation.
  std::string big;
  PutBe32(&big, 0x803);
  PutBe32(&big, 3);
  PutBe32(&big, 16000);
  PutBe32(&big, 16000);
  WriteBytes(ip, big + "abc");
  ExpectError<DataError>([&] { ConvertIdx(ip, lp, out); }, {ip, "truncated"});
  // Empty file.
  WriteBytes(ip, "");
  ExpectError<DataError>([&] { ConvertIdx(ip, lp, out); }, {ip, "truncated header"});
  EXPECT_FALSE(std::filesystem::exists(out));
}

// ---- CIFAR-10 ----

std::string CifarRecords(int n, int first_label) {
  std::string s;
  for (int r = 0; r < n; ++r) {
    s.push_back(static_cast<char>((first_label + r) % 10));
    for (int j = 0; j < 3072; ++j) s.push_back(static_cast<char>((r * 7 + j) % 251));
  }
  return s;
}

TEST(ConvertTest, Cifar10TrainAndTestRoundTrip) {
  TempDir dir;
  for (int b = 1; b <= 5; ++b) {
    WriteBytes(dir.File("data_batch_" + std::to_string(b) + ".bin"), CifarRecords(2, b));
  }
  WriteBytes(dir.File("test_batch.bin"), CifarRecords(3, 0));
  ConvertCifar10(dir.path(), "train", dir.File("train.h5"));
  const Loaded tr = Load(dir.File("train.h5"));
  EXPECT_EQ(tr.info.size, 10);
  EXPECT_EQ(tr.info.sample_shape, Shape({3, 32, 32}));
  EXPECT_EQ(tr.info.classes, 10);
  EXPECT_EQ(tr.labels, (std::vector<int32_t>{1, 2, 2, 3, 3, 4, 4, 5, 5, 6}));
  EXPECT_EQ(tr.images[3072 + 5], static_cast<float>((7 + 5) % 251) / 255.0f);  // record 1
  ConvertCifar10(dir.path(), "test", dir.File("test.h5"));
  const Loaded te = Load(dir.File("test.h5"));
  EXPECT_EQ(te.info.size, 3);
  EXPECT_EQ(te.labels, (std::vector<int32_t>{0, 1, 2}));
}

TEST(ConvertTest, Cifar10Errors) {
  TempDir dir;
  const std::string out = dir.File("o.h5");
  for (int b = 1; b <= 4; ++b) {
    WriteBytes(dir.File("data_batch_" + std::to_string(b) + ".bin"), CifarRecords(1, 0));
  }
  ExpectError<IoError>([&] { ConvertCifar10(dir.path(), "train", out); },
                       {"data_batch_5.bin", "no such file"});
  WriteBytes(dir.File("data_batch_5.bin"), CifarRecords(2, 0).substr(0, 5000));
  ExpectError<DataError>([&] { ConvertCifar10(dir.path(), "train", out); },
                         {"data_batch_5.bin", "5000", "3073"});
  std::string bad = CifarRecords(2, 0);
  bad[3073] = 10;  // label of record 1
  WriteBytes(dir.File("data_batch_5.bin"), bad);
  ExpectError<DataError>([&] { ConvertCifar10(dir.path(), "train", out); },
                         {"data_batch_5.bin", "record 1", "label 10"});
  WriteBytes(dir.File("test_batch.bin"), std::string(size_t{3074} * 2, '\0'));
  ExpectError<DataError>([&] { ConvertCifar10(dir.path(), "test", out); },
                         {"test_batch.bin", "CIFAR-100"});
  EXPECT_THROW(ConvertCifar10(dir.path(), "valid", out), ConfigError);
  ExpectError<IoError>([&] { ConvertCifar10(dir.File("nodir"), "test", out); }, {"nodir"});
  EXPECT_FALSE(std::filesystem::exists(out));
}

// ---- .npy ----

TEST(ConvertTest, NpyU8ImagesRoundTrip) {
  TempDir dir;
  std::vector<uint8_t> img(size_t{4} * 2 * 3);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>(i * 10);
  WriteBytes(dir.File("x.npy"), Npy("|u1", "(4, 2, 3)", Raw(img)));
  const std::vector<int64_t> lab = {0, 4, 2, 1};
  WriteBytes(dir.File("y.npy"), Npy("<i8", "(4,)", Raw(lab)));
  ConvertNpy(dir.File("x.npy"), dir.File("y.npy"), dir.File("o.h5"));
  const Loaded l = Load(dir.File("o.h5"));
  EXPECT_EQ(l.info.sample_shape, Shape({1, 2, 3}));
  EXPECT_EQ(l.info.classes, 5);
  EXPECT_EQ(l.labels, (std::vector<int32_t>{0, 4, 2, 1}));
  EXPECT_EQ(l.images[23], 230 / 255.0f);
}

TEST(ConvertTest, NpyF32ImagesAndLabelDtypes) {
  TempDir dir;
  std::vector<float> img(size_t{3} * 2 * 2 * 2);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<float>(i) * 0.5f - 1.0f;
  for (int version : {1, 2, 3}) {
    WriteBytes(dir.File("x.npy"), Npy("<f4", "(3, 2, 2, 2)", Raw(img), version));
    struct Case {
      std::string descr, shape, data;
    };
    const std::vector<Case> cases = {
        {"<i4", "(3,)", Raw(std::vector<int32_t>{2, 0, 1})},
        {"|u1", "(3,)", Raw(std::vector<uint8_t>{2, 0, 1})},
        {"<i2", "(3, 1)", Raw(std::vector<int16_t>{2, 0, 1})},
        {"<u8", "(3,)", Raw(std::vector<uint64_t>{2, 0, 1})},
        {">i4", "(3,)", std::string("\0\0\0\2\0\0\0\0\0\0\0\1", 12)},
    };
    for (const Case& c : cases) {
      WriteBytes(dir.File("y.npy"), Npy(c.descr, c.shape, c.data, version));
      ConvertNpy(dir.File("x.npy"), dir.File("y.npy"), dir.File("o.h5"));
      const Loaded l = Load(dir.File("o.h5"));
      EXPECT_EQ(l.info.image_dtype, DType::kF32);
      EXPECT_EQ(l.info.sample_shape, Shape({2, 2, 2}));
      EXPECT_EQ(l.labels, (std::vector<int32_t>{2, 0, 1})) << c.descr << " v" << version;
      EXPECT_EQ(l.images, img);
    }
  }
}

TEST(ConvertTest, NpyChannelsLastImagesAreTransposed) {
  TempDir dir;
  // (N, H, W, C) = (2, 2, 5, 3), each element its own index.
  std::vector<uint8_t> img(size_t{2} * 2 * 5 * 3);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>(i);
  WriteBytes(dir.File("x.npy"), Npy("|u1", "(2, 2, 5, 3)", Raw(img)));
  WriteBytes(dir.File("y.npy"), Npy("<i8", "(2,)", Raw(std::vector<int64_t>{0, 1})));
  const NpyResult r = ConvertNpy(dir.File("x.npy"), dir.File("y.npy"), dir.File("o.h5"));
  EXPECT_TRUE(r.channels_last);  // auto: the last dimension is 3, the second is not
  EXPECT_EQ(r.file_shape, (std::vector<int64_t>{2, 2, 5, 3}));
  EXPECT_EQ(r.written_shape, (std::vector<int64_t>{2, 3, 2, 5}));
  const Loaded l = Load(dir.File("o.h5"));
  EXPECT_EQ(l.info.sample_shape, Shape({3, 2, 5}));
  for (size_t n = 0; n < 2; ++n) {
    for (size_t c = 0; c < 3; ++c) {
      for (size_t h = 0; h < 2; ++h) {
        for (size_t w = 0; w < 5; ++w) {
          const size_t at = ((n * 3 + c) * 2 + h) * 5 + w;
          const uint8_t want = img[((n * 2 + h) * 5 + w) * 3 + c];
          ASSERT_EQ(l.images[at], static_cast<float>(want) / 255.0f) << n << c << h << w;
        }
      }
    }
  }
  // Told it is (N, C, H, W): read as such, not transposed.
  const NpyResult as_is =
      ConvertNpy(dir.File("x.npy"), dir.File("y.npy"), dir.File("o.h5"), NpyLayout::kNCHW);
  EXPECT_FALSE(as_is.channels_last);
  EXPECT_EQ(Load(dir.File("o.h5")).info.sample_shape, Shape({2, 5, 3}));

  // float32, told (N, H, W, C) where auto would not guess it (C = 5).
  std::vector<float> f(size_t{2} * 3 * 4 * 5);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i);
  WriteBytes(dir.File("f.npy"), Npy("<f4", "(2, 3, 4, 5)", Raw(f)));
  EXPECT_FALSE(ConvertNpy(dir.File("f.npy"), dir.File("y.npy"), dir.File("o.h5")).channels_last);
  const NpyResult forced =
      ConvertNpy(dir.File("f.npy"), dir.File("y.npy"), dir.File("o.h5"), NpyLayout::kNHWC);
  EXPECT_TRUE(forced.channels_last);
  const Loaded lf = Load(dir.File("o.h5"));
  EXPECT_EQ(lf.info.sample_shape, Shape({5, 3, 4}));
  EXPECT_EQ(lf.images[1], f[5]);         // (n0, c0, h0, w1) <- (n0, h0, w1, c0)
  EXPECT_EQ(lf.images[12], f[1]);        // (n0, c1, h0, w0) <- (n0, h0, w0, c1)
  EXPECT_EQ(lf.images[60 + 13], f[66]);  // (n1, c1, h0, w1) <- (n1, h0, w1, c1)
}

TEST(ConvertTest, LayoutOfRank3ImagesAndFifosAreErrors) {
  TempDir dir;
  WriteBytes(dir.File("x.npy"), Npy("|u1", "(2, 3, 3)", std::string(18, '\1')));
  WriteBytes(dir.File("y.npy"), Npy("<i8", "(2,)", Raw(std::vector<int64_t>{0, 1})));
  ExpectError<ConfigError>(
      [&] { ConvertNpy(dir.File("x.npy"), dir.File("y.npy"), dir.File("o.h5"), NpyLayout::kNHWC); },
      {"x.npy", "--layout applies to rank-4 images"});
  // A named pipe where a file belongs: opening it would wait for a writer.
  ASSERT_EQ(::mkfifo(dir.File("pipe").c_str(), 0600), 0);
  ExpectError<IoError>([&] { ConvertNpy(dir.File("pipe"), dir.File("y.npy"), dir.File("o.h5")); },
                       {"pipe", "is not a regular file"});
  ExpectError<IoError>([&] { ConvertIdx(dir.File("pipe"), dir.File("y.npy"), dir.File("o.h5")); },
                       {"pipe", "is not a regular file"});
}

TEST(ConvertTest, NpyErrors) {
  TempDir dir;
  const std::string x = dir.File("x.npy"), y = dir.File("y.npy"), out = dir.File("o.h5");
  const std::vector<uint8_t> img(size_t{2} * 2 * 2, 1);
  const std::string good_x = Npy("|u1", "(2, 2, 2)", Raw(img));
  const std::string good_y = Npy("<i8", "(2,)", Raw(std::vector<int64_t>{0, 1}));
  WriteBytes(x, good_x);
  WriteBytes(y, good_y);
  ASSERT_NO_THROW(ConvertNpy(x, y, out));

  auto expect_x = [&](const std::string& bytes, const std::vector<std::string>& parts) {
    WriteBytes(x, bytes);
    std::vector<std::string> all = {x};
    all.insert(all.end(), parts.begin(), parts.end());
    ExpectError<DataError>([&] { ConvertNpy(x, y, out); }, all);
    WriteBytes(x, good_x);
  };
  expect_x("PK\3\4 a zip file", {"not a .npy file"});
  expect_x(Npy("|u1", "(2, 2, 2)", Raw(img), 1, "True"), {"fortran_order"});
  expect_x(Npy("<f8", "(2, 2, 2)", std::string(64, '\0')), {"'<f8'", "not supported"});
  expect_x(Npy("|u1", "(2, 8)", Raw(std::vector<uint8_t>(16))), {"rank 2"});
  expect_x(Npy("|u1", "(2, 2, 2)", Raw(img).substr(0, 7)), {"truncated"});
  expect_x(Npy("|u1", "(2, 2, 2)", Raw(img) + "zz"), {"trailing data"});
  expect_x(Npy("|u1", "(2, 0, 2)", ""), {"zero dimension"});
  expect_x(Npy("|u1", "(99999999999, 99999999999, 99999999999)", ""), {"too large"});
  expect_x(good_x.substr(0, 40), {"truncated"});
  std::string v9 = good_x;
  v9[6] = 9;
  expect_x(v9, {"version 9"});
  std::string bad_dict = good_x;
  bad_dict[10] = '[';
  expect_x(bad_dict, {"malformed .npy header"});
  expect_x(Npy("|u1", "(2, 2, 2", Raw(img)), {"malformed .npy header"});
  std::vector<float> nan_img(8, 0.0f);
  nan_img[5] = std::numeric_limits<float>::quiet_NaN();
  expect_x(Npy("<f4", "(2, 2, 2)", Raw(nan_img)), {"non-finite", "image 1"});

  auto expect_y = [&](const std::string& bytes, const std::vector<std::string>& parts) {
    WriteBytes(y, bytes);
    std::vector<std::string> all = {y};
    all.insert(all.end(), parts.begin(), parts.end());
    ExpectError<DataError>([&] { ConvertNpy(x, y, out); }, all);
  };
  expect_y(Npy("<f4", "(2,)", Raw(std::vector<float>{0, 1})), {"not an integer type"});
  expect_y(Npy("<i8", "(3,)", Raw(std::vector<int64_t>{0, 1, 2})), {"3 labels", "2 images"});
  expect_y(Npy("<i8", "(2,)", Raw(std::vector<int64_t>{0, -3})), {"label -3 at index 1"});
  expect_y(Npy("<i8", "(2,)", Raw(std::vector<int64_t>{int64_t{1} << 33, 0})),
           {"label 8589934592 at index 0"});
  expect_y(Npy("<i8", "(2, 2)", Raw(std::vector<int64_t>{0, 1, 0, 1})), {"expected (N) or (N, 1)"});
  ExpectError<IoError>([&] { ConvertNpy(x, dir.File("none.npy"), out); }, {"none.npy"});
}

// Every prefix and many random corruptions of valid inputs either convert or raise a dptrain
// error: no crash, no std::bad_alloc, no other exception type.
template <class Convert>
void Garble(const std::string& victim, const std::string& good, Convert convert) {
  std::mt19937 rng(1234);
  auto run = [&](const std::string& bytes, const std::string& what) {
    WriteBytes(victim, bytes);
    try {
      convert();
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": non-dptrain exception: " << e.what();
    }
  };
  for (size_t len = 0; len < good.size(); len += std::max<size_t>(1, good.size() / 61)) {
    run(good.substr(0, len), "prefix " + std::to_string(len));
  }
  for (int round = 0; round < 100; ++round) {
    std::string bytes = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      // Mostly the header, where parsing happens.
      const size_t limit = std::min<size_t>(bytes.size(), rng() % 2 ? 140 : bytes.size());
      bytes[rng() % limit] = static_cast<char>(rng() % 256);
    }
    run(bytes, "round " + std::to_string(round));
  }
  WriteBytes(victim, good);
}

TEST(ConvertTest, GarbageInputsNeverCrash) {
  TempDir dir;
  const std::string out = dir.File("o.h5");
  {
    const std::string ip = dir.File("i.gz"), lp = dir.File("l.gz");
    const std::string img = Gzip(IdxImages(3, 4, 4)), lab = Gzip(IdxLabels({0, 1, 2}));
    WriteBytes(ip, img);
    WriteBytes(lp, lab);
    Garble(ip, img, [&] { ConvertIdx(ip, lp, out); });
    Garble(lp, lab, [&] { ConvertIdx(ip, lp, out); });
    const std::string plain = IdxImages(3, 4, 4);
    Garble(ip, plain, [&] { ConvertIdx(ip, lp, out); });
  }
  {
    const std::string x = dir.File("x.npy"), y = dir.File("y.npy");
    const std::string gx = Npy("<f4", "(3, 1, 2, 2)", Raw(std::vector<float>(12, 0.5f)));
    const std::string gy = Npy("<i2", "(3,)", Raw(std::vector<int16_t>{0, 1, 2}));
    WriteBytes(x, gx);
    WriteBytes(y, gy);
    Garble(x, gx, [&] { ConvertNpy(x, y, out); });
    Garble(y, gy, [&] { ConvertNpy(x, y, out); });
  }
  {
    const std::string t = dir.File("test_batch.bin");
    Garble(t, CifarRecords(2, 0), [&] { ConvertCifar10(dir.path(), "test", out); });
  }
}

}  // namespace
}  // namespace dptrain
