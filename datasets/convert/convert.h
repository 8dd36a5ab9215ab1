// SPDX-License-Identifier: Apache-2.0
// Converters behind `dptrain convert` (DESIGN.md section 7): MNIST/Fashion-MNIST idx, CIFAR-10
// binary and NumPy .npy files to the dataset HDF5 layout (WriteHdf5Dataset). Inputs are
// untrusted: every malformed file gives an IoError/DataError naming the file and what is wrong
// (never a crash, never an allocation sized by an unchecked header).
#pragma once

#include <string>

namespace dptrain {

// idx3-ubyte images (magic 0x00000803, N x H x W) and idx1-ubyte labels (magic 0x00000801, N),
// gzip-compressed or plain (detected from the content). Writes /images uint8 [N, 1, H, W],
// /labels, classes = max label + 1. Errors: missing file, bad magic, zero or absurd dims, count
// mismatch, truncated or trailing data, corrupt gzip stream.
void ConvertIdx(const std::string& images, const std::string& labels, const std::string& out);

// CIFAR-10 binary version in `dir`: split "train" reads data_batch_1.bin .. data_batch_5.bin,
// "test" reads test_batch.bin. Each record is 1 label byte (0..9) + 3072 pixel bytes
// (3 x 32 x 32, CHW). Writes /images uint8 [N, 3, 32, 32], classes = 10. Errors name the missing
// or malformed file (size not a multiple of 3073, label > 9); an unknown split is a ConfigError.
void ConvertCifar10(const std::string& dir, const std::string& split, const std::string& out);

// NumPy .npy (format versions 1, 2, 3; C order only). images: '|u1' (uint8) or '<f4' (float32,
// must be finite), shape (N, H, W) or (N, C, H, W). labels: any integer dtype ('|u1', '|i1',
// '<i2', '<u2', '<i4', '<u4', '<i8', '<u8'; big-endian '>' too), shape (N) or (N, 1), values
// in [0, 2^31). classes = max label + 1. Errors name the file and the problem (bad magic or
// header, unsupported dtype, fortran_order True, wrong rank, N mismatch, truncated data).
void ConvertNpy(const std::string& images, const std::string& labels, const std::string& out);

}  // namespace dptrain
