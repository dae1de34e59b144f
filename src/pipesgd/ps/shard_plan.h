#pragma once
// ShardPlan: how the parameter servers split a Layout's flat parameter vector.
//
// Each of the S servers owns a contiguous, non-empty run of whole segments, i.e. one contiguous
// flat range [begin, end) of the parameter (and gradient) vector; shard s comes before shard s + 1
// and together the shards cover the layout without gaps.
//
// Balancing: the plan minimises the largest shard in bytes (equivalently in fp32 elements) over all
// splits into S contiguous runs of whole segments. It is computed exactly by dynamic programming,
//   best[k][j] = min over i < j of max(best[k-1][i], bytes(segments i..j-1)),
// O(S * n^2) for n segments (layouts have tens of segments). Among optimal splits the DP keeps the
// one whose earlier cut points are leftmost (first minimum found), so the plan is deterministic.
#include <cstddef>
#include <vector>

#include "pipesgd/core/layout.h"

namespace pipesgd {

struct Shard {
  std::size_t first_segment = 0;  // segments [first_segment, end_segment) of the layout
  std::size_t end_segment = 0;
  std::size_t begin = 0;  // flat elements [begin, end)
  std::size_t end = 0;
  std::size_t count() const { return end - begin; }
};

class ShardPlan {
 public:
  // Throws UsageError if servers < 1, the layout has no segments, or servers exceeds the number of
  // segments (a server without a whole segment would own nothing).
  ShardPlan(const Layout& layout, int servers);

  int servers() const { return static_cast<int>(shards_.size()); }
  const Shard& shard(int server) const { return shards_.at(static_cast<std::size_t>(server)); }
  const std::vector<Shard>& shards() const { return shards_; }
  std::size_t total() const { return total_; }
  // Elements in the largest shard (what the balancing minimises).
  std::size_t largest() const;

 private:
  std::vector<Shard> shards_;
  std::size_t total_ = 0;
};

}  // namespace pipesgd
