// SPDX-License-Identifier: Apache-2.0
// `dptrain convert`: checks which inputs the chosen format needs and calls its converter; for
// imagefolder also parses --shard-size and draws the progress line.
#include "launcher/convert_command.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "core/memory/caching_allocator.h"
#include "core/tensor.h"
#include "datasets/convert/convert.h"

namespace dptrain {
namespace {

// "1h02m", "3m05s", "42s" as the trainer's progress line (runtime's FormatDuration is private
// to runtime/).
std::string Duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(std::llround(s));
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t % 3600) / 60);
  } else if (t >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%llds", t);
  }
  return buf;
}

// Images done / total, images/s and ETA on stderr: redrawn at most 10 times a second on a
// terminal (as the trainer's line on stdout), else one plain line per 10%.
class Progress {
 public:
  Progress() : tty_(isatty(STDERR_FILENO) != 0), start_(Clock::now()), last_(start_) {}
  ~Progress() {
    if (drawn_) std::fputc('\n', stderr);
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void Update(int64_t done, int64_t total) {
    const auto now = Clock::now();
    if (tty_) {
      if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
    } else {
      const int64_t decile = total > 0 ? done * 10 / total : 10;
      if (decile == decile_) return;
      decile_ = decile;
    }
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double rate = s > 0 ? static_cast<double>(done) / s : 0;
    const double eta = rate > 0 ? static_cast<double>(total - done) / rate : NAN;
    std::fprintf(stderr, "%sconvert: %lld/%lld images (%.0f%%) %.0f images/s eta %s%s",
                 tty_ ? "\r\033[K" : "", static_cast<long long>(done),
                 static_cast<long long>(total),
                 total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
                 rate, Duration(eta).c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
    drawn_ = tty_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool tty_;
  Clock::time_point start_, last_;
  int64_t decile_ = 0;
  bool drawn_ = false;
};

int ConvertImageFolderCommand(const ConvertArgs& args) {
  if (args.input.empty() || args.size <= 0) {
    DPT_THROW(ConfigError) << "convert --from imagefolder needs --input DIR and --size S (S >= 1)";
  }
  if (args.threads < 0) DPT_THROW(ConfigError) << "--threads " << args.threads << ": expected >= 0";
  ImageFolderOptions opts;
  opts.size = args.size;
  if (!args.shard_size.empty()) {
    opts.shard_bytes = static_cast<int64_t>(ParseByteSize(args.shard_size, "--shard-size"));
  }
  opts.skip_bad = args.skip_bad;
  opts.threads = args.threads;
  opts.note = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  ImageFolderResult r;
  {
    Progress progress;
    opts.progress = [&](int64_t done, int64_t total) { progress.Update(done, total); };
    std::fflush(stdout);
    r = ConvertImageFolder(args.input, args.out, opts);
  }
  for (const std::string& f : r.written) std::printf("wrote %s\n", f.c_str());
  if (!r.skipped.empty()) {
    std::string list;
    for (const std::string& s : r.skipped) list += (list.empty() ? "" : ", ") + s;
    std::printf("skipped %zu unreadable image%s: %s\n", r.skipped.size(),
                r.skipped.size() == 1 ? "" : "s", list.c_str());
  }
  std::printf("%lld images, %lld classes, %zu file%s (%zu written, %zu kept)\n",
              static_cast<long long>(r.images), static_cast<long long>(r.classes),
              r.written.size() + r.kept.size(), r.written.size() + r.kept.size() == 1 ? "" : "s",
              r.written.size(), r.kept.size());
  return kExitOk;
}

}  // namespace

int RunConvertCommand(const ConvertArgs& args) {
  const std::string& from = args.from;
  if (from != "imagefolder" &&
      (args.size != 0 || !args.shard_size.empty() || args.skip_bad || args.threads != 0)) {
    DPT_THROW(ConfigError) << "--size, --shard-size, --skip-bad and --threads are options of "
                           << "convert --from imagefolder, not --from " << from;
  }
  if (from != "npy" && args.layout != "auto") {
    DPT_THROW(ConfigError) << "--layout is an option of convert --from npy, not --from " << from;
  }
  if (from == "idx") {
    if (args.images.empty() || args.labels.empty()) {
      DPT_THROW(ConfigError) << "convert --from idx needs --images and --labels";
    }
    ConvertIdx(args.images, args.labels, args.out);
  } else if (from == "cifar10") {
    if (args.input.empty()) DPT_THROW(ConfigError) << "convert --from cifar10 needs --input DIR";
    ConvertCifar10(args.input, args.split, args.out);
  } else if (from == "npy") {
    if (args.images.empty() || args.labels.empty()) {
      DPT_THROW(ConfigError) << "convert --from npy needs --images and --labels";
    }
    NpyLayout layout = NpyLayout::kAuto;
    if (args.layout == "nchw") {
      layout = NpyLayout::kNCHW;
    } else if (args.layout == "nhwc") {
      layout = NpyLayout::kNHWC;
    } else if (args.layout != "auto") {
      DPT_THROW(ConfigError) << "convert --layout: unknown layout '" << args.layout
                             << "' (auto, nchw, nhwc)";
    }
    const NpyResult r = ConvertNpy(args.images, args.labels, args.out, layout);
    // Say how the images were read, so a wrong guess is seen before a run trains on it.
    std::printf("%s: images %s read as %s, written as %s%s\n", args.images.c_str(),
                Shape(r.file_shape).ToString().c_str(),
                r.file_shape.size() == 3 ? "(N, H, W)"
                : r.channels_last        ? "(N, H, W, C)"
                                         : "(N, C, H, W)",
                Shape(r.written_shape).ToString().c_str(),
                r.file_shape.size() != 4 ? ""
                : r.channels_last        ? " (--layout nchw reads them as (N, C, H, W))"
                                         : " (--layout nhwc reads them as (N, H, W, C))");
  } else if (from == "imagefolder") {
    return ConvertImageFolderCommand(args);
  } else {
    DPT_THROW(ConfigError) << "convert --from: unknown format '" << from
                           << "' (idx, cifar10, npy, imagefolder)";
  }
  std::printf("wrote %s\n", args.out.c_str());
  return kExitOk;
}

}  // namespace dptrain
