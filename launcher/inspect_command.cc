// SPDX-License-Identifier: Apache-2.0
// `dptrain inspect`: an ONNX model (by its .onnx name), else the checkpoint or the dataset
// description by the file's content.
#include "launcher/inspect_command.h"

#include <cstdio>

#include "core/backend_registry.h"
#include "core/error.h"
#include "datasets/inspect.h"
#include "models/onnx/onnx_import.h"
#include "runtime/checkpoint/checkpoint.h"

namespace dptrain {

int RunInspectCommand(const std::string& path) {
  if (path.size() > 5 && path.compare(path.size() - 5, 5, ".onnx") == 0) {
    std::fputs(DescribeOnnx(GetBackend("cpu"), path).c_str(), stdout);
    return kExitOk;
  }
  // Checkpoints get their own description (state, tensors with checksum verdicts, config).
  std::fputs(
      IsCheckpointFile(path) ? DescribeCheckpoint(path).c_str() : DescribeHdf5File(path).c_str(),
      stdout);
  return kExitOk;
}

}  // namespace dptrain
