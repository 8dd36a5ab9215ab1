// SPDX-License-Identifier: Apache-2.0
// `dptrain inspect`: picks the checkpoint or the dataset description by the file's content.
#include "launcher/inspect_command.h"

#include <cstdio>

#include "core/error.h"
#include "datasets/inspect.h"
#include "runtime/checkpoint/checkpoint.h"

namespace dptrain {

int RunInspectCommand(const std::string& path) {
  // Checkpoints get their own description (state, tensors with checksum verdicts, config).
  std::fputs(
      IsCheckpointFile(path) ? DescribeCheckpoint(path).c_str() : DescribeHdf5File(path).c_str(),
      stdout);
  return kExitOk;
}

}  // namespace dptrain
