// SPDX-License-Identifier: Apache-2.0
// InputFileProblem: the one check every reader makes before opening an input file. A FIFO is
// refused without being opened (opening it would wait for a writer). ReadInputFile: the same
// checks, and the bytes read from the descriptor they ran on; OpenInputFile hands that descriptor
// over.
#include "core/util/input_file.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace dptrain {
namespace {

using ::testing::StartsWith;

TEST(InputFileTest, ReadableRegularFileHasNoProblem) {
  testing::TempDir dir;
  std::ofstream(dir.File("a.h5")) << "x";
  EXPECT_EQ(InputFileProblem(dir.File("a.h5"), "an HDF5 file"), "");
  std::ofstream(dir.File("empty.h5")).close();  // empty: readable; the reader says what is wrong
  EXPECT_EQ(InputFileProblem(dir.File("empty.h5"), "an HDF5 file"), "");
}

TEST(InputFileTest, MissingFileAndMissingDirectory) {
  testing::TempDir dir;
  EXPECT_EQ(InputFileProblem(dir.File("none.h5"), "an HDF5 file"), "no such file");
  std::ofstream(dir.File("plain")) << "x";
  EXPECT_EQ(InputFileProblem(dir.File("plain") + "/x.h5", "an HDF5 file"), "no such file");
}

TEST(InputFileTest, DirectoryNamesWhatWasExpected) {
  testing::TempDir dir;
  EXPECT_EQ(InputFileProblem(dir.path(), "an idx file"), "is a directory, expected an idx file");
}

TEST(InputFileTest, FifoIsRefusedWithoutWaiting) {
  testing::TempDir dir;
  const std::string fifo = dir.File("pipe.h5");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  // Returns at once: a blocking open would hang this test until ctest's timeout.
  EXPECT_EQ(InputFileProblem(fifo, "an HDF5 file"),
            "cannot read the file: it is not a regular file (a FIFO, socket or device); give an "
            "HDF5 file");
}

TEST(InputFileTest, SocketAndDeviceAreRefused) {
  testing::TempDir dir;
  const std::string sock = dir.File("s");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (sock.size() < sizeof(addr.sun_path)) {  // else the temporary directory's path is too long
    std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    const int bound = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    const int err = errno;
    if (bound == 0) {
      EXPECT_THAT(InputFileProblem(sock, "a .npy file"),
                  StartsWith("cannot read the file: it is not a regular file"));
    }
    ::close(fd);
    EXPECT_EQ(bound, 0) << std::strerror(err);
  }
  EXPECT_THAT(InputFileProblem("/dev/null", "a .npy file"),
              StartsWith("cannot read the file: it is not a regular file"));
}

TEST(InputFileTest, ReadInputFileReadsEveryByte) {
  testing::TempDir dir;
  // Larger than one read and than the 64 KiB tail buffer, with every byte value.
  std::string data(300000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 % 251);
  std::ofstream(dir.File("a.png"), std::ios::binary) << data;
  std::vector<uint8_t> bytes{1, 2, 3};
  ASSERT_EQ(ReadInputFile(dir.File("a.png"), "a JPEG or PNG file", &bytes), "");
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), data);
  EXPECT_EQ(ReadInputFile(dir.File("a.png"), "a JPEG or PNG file", &bytes, 299999),
            "is 300000 bytes, more than the 299999 bytes a JPEG or PNG file can be");
  ASSERT_EQ(ReadInputFile(dir.File("a.png"), "a JPEG or PNG file", &bytes, 300000), "");
  EXPECT_EQ(bytes.size(), 300000U);
  std::ofstream(dir.File("empty.png")).close();
  ASSERT_EQ(ReadInputFile(dir.File("empty.png"), "a JPEG or PNG file", &bytes), "");
  EXPECT_TRUE(bytes.empty());
}

TEST(InputFileTest, ReadInputFileRefusesAsInputFileProblemDoes) {
  testing::TempDir dir;
  std::vector<uint8_t> bytes;
  EXPECT_EQ(ReadInputFile(dir.File("none.onnx"), "an ONNX model", &bytes), "no such file");
  EXPECT_EQ(ReadInputFile(dir.path(), "an ONNX model", &bytes),
            "is a directory, expected an ONNX model");
  const std::string fifo = dir.File("pipe.onnx");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  EXPECT_EQ(ReadInputFile(fifo, "an ONNX model", &bytes),  // at once, no writer needed
            "cannot read the file: it is not a regular file (a FIFO, socket or device); give an "
            "ONNX model");
  EXPECT_THAT(ReadInputFile("/dev/zero", "an ONNX model", &bytes),  // never ends: refused
              StartsWith("cannot read the file: it is not a regular file"));
}

TEST(InputFileTest, OpenInputFileHandsOverTheCheckedDescriptor) {
  testing::TempDir dir;
  std::ofstream(dir.File("t10k-images-idx3-ubyte"), std::ios::binary) << "abc";
  std::string why = "stale";
  const int fd = OpenInputFile(dir.File("t10k-images-idx3-ubyte"), "an idx file", &why);
  ASSERT_GE(fd, 0) << why;
  EXPECT_EQ(why, "");
  EXPECT_EQ(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);  // reads block as usual
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  char buf[8] = {};
  EXPECT_EQ(::read(fd, buf, sizeof buf), 3);
  EXPECT_STREQ(buf, "abc");
  ::close(fd);
  const std::string fifo = dir.File("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  EXPECT_EQ(OpenInputFile(fifo, "an idx file", &why), -1);  // at once, no writer needed
  EXPECT_THAT(why, StartsWith("cannot read the file: it is not a regular file"));
  EXPECT_EQ(OpenInputFile(dir.File("none"), "an idx file", &why), -1);
  EXPECT_EQ(why, "no such file");
}

}  // namespace
}  // namespace dptrain
