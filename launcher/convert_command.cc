// SPDX-License-Identifier: Apache-2.0
// `dptrain convert`: checks which inputs the chosen format needs and calls its converter.
#include "launcher/convert_command.h"

#include <cstdio>

#include "core/error.h"
#include "datasets/convert/convert.h"

namespace dptrain {

int RunConvertCommand(const ConvertArgs& args) {
  const std::string& from = args.from;
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
    ConvertNpy(args.images, args.labels, args.out);
  } else {
    DPT_THROW(ConfigError) << "convert --from: unknown format '" << from << "' (idx, cifar10, npy)";
  }
  std::printf("wrote %s\n", args.out.c_str());
  return kExitOk;
}

}  // namespace dptrain
