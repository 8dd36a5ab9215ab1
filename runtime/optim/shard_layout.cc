// SPDX-License-Identifier: Apache-2.0
// ShardLayout::Make: chunk sizes and shard offsets from the Model's group bounds.
#include "runtime/optim/shard_layout.h"

#include "core/error.h"

namespace dptrain {

ShardLayout ShardLayout::Make(const std::vector<std::pair<int64_t, int64_t>>& bounds, int rank,
                              int size) {
  DPT_CHECK(size >= 1 && rank >= 0 && rank < size) << "rank " << rank << " of " << size;
  ShardLayout l;
  l.rank = rank;
  l.size = size;
  int64_t expect = 0;
  for (const auto& [begin, end] : bounds) {
    DPT_CHECK(begin == expect && end > begin && (end - begin) % size == 0)
        << "shard group [" << begin << ", " << end << ") after " << expect << " for " << size
        << " ranks";
    Group g;
    g.begin = begin;
    g.end = end;
    g.chunk = (end - begin) / size;
    g.shard_offset = l.shard_floats;
    l.shard_floats += g.chunk;
    l.groups.push_back(g);
    expect = end;
  }
  return l;
}

}  // namespace dptrain
