// SPDX-License-Identifier: Apache-2.0
// dist.shard (ZeRO stages 1 and 2): which floats of the model's flat buffers each rank owns. The
// flat buffer is cut into groups (consecutive layers, padded so each group is `size` equal
// chunks); rank r owns chunk r of every group. Its optimizer state (and with `gradients` its
// reduced gradients) is the concatenation of its chunks: the rank's shard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace dptrain {

// dist.shard
enum class ShardMode : uint8_t { kNone, kOptimizer, kGradients };

struct ShardLayout {
  struct Group {
    int64_t begin = 0, end = 0;  // [begin, end) in the flat buffer, end - begin == size * chunk
    int64_t chunk = 0;           // floats each rank owns
    int64_t shard_offset = 0;    // where this rank's chunk lies in its shard
  };
  int rank = 0, size = 1;
  std::vector<Group> groups;
  int64_t shard_floats = 0;  // sum of the chunks: flat length / size

  // Groups [begin, end) as the Model laid them out (each a multiple of `size`).
  static ShardLayout Make(const std::vector<std::pair<int64_t, int64_t>>& bounds, int rank,
                          int size);
  // The first float of this rank's chunk of group g in the flat buffer.
  int64_t OwnBegin(size_t g) const {
    return groups[g].begin + static_cast<int64_t>(rank) * groups[g].chunk;
  }
};

}  // namespace dptrain
