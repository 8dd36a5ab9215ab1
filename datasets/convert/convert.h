// SPDX-License-Identifier: Apache-2.0
// Converters behind `dptrain convert` (DESIGN.md section 7): MNIST/Fashion-MNIST idx, CIFAR-10
// binary, NumPy .npy files and JPEG/PNG class folders to the dataset HDF5 layout. Inputs are
// untrusted: every malformed file gives an IoError/DataError naming the file and what is wrong
// (never a crash, never an allocation sized by an unchecked header).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

// How a rank-4 images array is laid out: kAuto reads (N, H, W, C) when C is 1, 3 or 4 and the
// second dimension is not (NumPy/TensorFlow/PIL-style channels-last images), else (N, C, H, W).
enum class NpyLayout { kAuto, kNCHW, kNHWC };

struct NpyResult {
  std::vector<int64_t> file_shape;     // the images array as the file has it
  std::vector<int64_t> written_shape;  // (N, C, H, W) as /images holds it
  bool channels_last = false;          // read as (N, H, W, C) and transposed
};

// NumPy .npy (format versions 1, 2, 3; C order only). images: '|u1' (uint8) or '<f4' (float32,
// must be finite), shape (N, H, W), or (N, C, H, W) / (N, H, W, C) as `layout` says. labels:
// any integer dtype ('|u1', '|i1', '<i2', '<u2', '<i4', '<u4', '<i8', '<u8'; big-endian '>'
// too), shape (N) or (N, 1), values in [0, 2^31). classes = max label + 1. Errors name the file
// and the problem (bad magic or header, unsupported dtype, fortran_order True, wrong rank, N
// mismatch, truncated data).
NpyResult ConvertNpy(const std::string& images, const std::string& labels, const std::string& out,
                     NpyLayout layout = NpyLayout::kAuto);

// ---- ImageFolder: DIR/<class>/<image>, as torchvision.datasets.ImageFolder reads it ----

struct ImageFolderOptions {
  int64_t size = 0;         // S: every image becomes S x S (required, 1..16384)
  int64_t shard_bytes = 0;  // > 0: shards of at most this many pixel bytes; 0: one file
  bool skip_bad = false;    // leave unreadable images out (listed) instead of failing
  int threads = 0;          // decode + resize workers; <= 0: std::thread::hardware_concurrency
  // Called on the calling thread after each image is stored or skipped: (done, total) over the
  // images this run converts (shards kept from an earlier run are not counted). May be empty.
  std::function<void(int64_t done, int64_t total)> progress;
  // Called on the calling thread with one line of news (a shard kept from an earlier run) before
  // the conversion starts. May be empty.
  std::function<void(const std::string& line)> note;
};

struct ImageFolderResult {
  std::vector<std::string> written;  // shard files written by this run, in order
  std::vector<std::string> kept;     // complete shard files of an earlier run, left alone
  // Images left out (--skip-bad), "class/file.jpg (reason)", in sample order; those of kept
  // shards included (each shard records its own in the attribute `skipped`).
  std::vector<std::string> skipped;
  int64_t images = 0;   // samples stored in all shards (written and kept)
  int64_t classes = 0;  // number of classes
};

// Converts the image folder `dir` to `out` (one file), or to `<out minus .h5>-00000.h5`, ...
// when opts.shard_bytes > 0 (ImageFolderShardPath). Classes are the sorted (byte order)
// subfolders of `dir`, label = index; samples are in torchvision's order: by class, then each
// class folder walked (subfolders followed) with directories and file names sorted. Files whose
// lower-cased name ends with .jpg, .jpeg or .png are decoded (libjpeg-turbo, libpng; the format
// is taken from the content) and become RGB as PIL's convert("RGB") (greyscale replicated,
// palette looked up, alpha dropped, CMYK as Adobe-inverted CMYK); torchvision's other image
// extensions (.bmp .ppm .pgm .tif .tiff .webp) are samples dptrain cannot decode (unreadable);
// other files are ignored. Each image is resized with libvips as PIL's resize(BILINEAR,
// reducing_gap=None) resizes (vips_reduce, linear kernel; vips_affine, bilinear, to enlarge) so
// its shorter side is S (the longer int(S * long / short), torchvision Resize(S)) and
// centre-cropped to S x S (offset round((side - S) / 2), half to even, torchvision CenterCrop).
// Each shard holds
//   /images uint8 [N, 3, S, S], one sample per chunk; /labels int32 [N];
//   root attributes classes (int64), class_names (one UTF-8 string, names joined by "\n"),
//   source_count (input files the shard covers), source_digest (hash of their names and sizes
//   and S), skipped (the shard's left-out images, when any),
// and is written to `<file>.tmp`, fsynced and renamed. A shard whose file already exists and
// matches (opens, N, shape, class names, source_digest) is kept, not redone (resume).
// Errors: DataError (exit 3) naming the file or folder: no class folders, a class folder without
// images, a class name with "\n" or not UTF-8, an unreadable / corrupt / truncated image
// (libjpeg-turbo warnings included) unless opts.skip_bad (then left out; a shard left empty is
// not written; no image left at all is an error). ConfigError for bad options; UnsupportedError
// (exit 2) when libvips cannot be loaded (it is loaded on first use, not linked). No final file
// of a shard is written unless the whole shard is; its .tmp is removed on error.
ImageFolderResult ConvertImageFolder(const std::string& dir, const std::string& out,
                                     const ImageFolderOptions& opts);

// The pieces of ConvertImageFolder that are pure logic, exposed for unit tests.

// The image folder's classes and samples (no decoding). files are relative to the folder
// ("cat/sub/x.jpg"), with their sizes in bytes and labels; same order as ConvertImageFolder.
struct ImageFolderListing {
  std::vector<std::string> classes;
  std::vector<std::string> files;
  std::vector<int64_t> bytes;
  std::vector<int32_t> labels;
};
ImageFolderListing ListImageFolder(const std::string& dir);

// torchvision Resize(S) + CenterCrop(S) for a w x h image: the resized size and the top-left
// corner of the S x S crop in it. w, h, size >= 1.
struct ImageFolderGeometry {
  int64_t resized_w = 0, resized_h = 0;
  int64_t crop_x = 0, crop_y = 0;
};
ImageFolderGeometry ResizeCropGeometry(int64_t w, int64_t h, int64_t size);

// Splits n samples of sample_bytes each into consecutive shards of at most shard_bytes
// (shard_bytes <= 0: one shard of all n). ConfigError when one sample does not fit.
struct ShardRange {
  int64_t first = 0, count = 0;
};
std::vector<ShardRange> PlanShards(int64_t n, int64_t sample_bytes, int64_t shard_bytes);

// The file of shard `index`: `out` itself when not sharded, else `out` without a trailing
// ".h5" + "-%05d.h5" ("train.h5", 3 -> "train-00003.h5").
std::string ImageFolderShardPath(const std::string& out, int64_t index, bool sharded);

// libvips' version for `dptrain info` ("8.14.1"), or "not loadable (<why>)".
std::string VipsLibraryVersion();

}  // namespace dptrain
