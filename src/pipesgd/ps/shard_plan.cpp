#include "pipesgd/ps/shard_plan.h"

#include <algorithm>
#include <limits>

#include "pipesgd/core/error.h"

namespace pipesgd {

ShardPlan::ShardPlan(const Layout& layout, int servers) : total_(layout.total()) {
  if (servers < 1) throw UsageError(concat("parameter server: need >= 1 server, got ", servers));
  const std::size_t n = layout.segment_count();
  if (n == 0) throw UsageError("parameter server: the model has no parameter segments to shard");
  const auto s_count = static_cast<std::size_t>(servers);
  if (s_count > n) {
    throw UsageError(
        concat("parameter server: ", servers, " servers exceed the model's ", n,
               " parameter segments: each server must own at least one whole segment"));
  }
  // prefix[j] = elements in segments [0, j).
  std::vector<std::size_t> prefix(n + 1, 0);
  for (std::size_t j = 0; j < n; ++j) prefix[j + 1] = prefix[j] + layout.segment(j).count;

  constexpr std::size_t kInf = std::numeric_limits<std::size_t>::max();
  // best[k][j]: smallest possible largest shard when segments [0, j) go to k + 1 servers.
  // cut[k][j]: the start segment of the last of those k + 1 shards in that optimum.
  std::vector<std::vector<std::size_t>> best(s_count, std::vector<std::size_t>(n + 1, kInf));
  std::vector<std::vector<std::size_t>> cut(s_count, std::vector<std::size_t>(n + 1, 0));
  for (std::size_t j = 1; j <= n; ++j) best[0][j] = prefix[j];
  for (std::size_t k = 1; k < s_count; ++k) {
    for (std::size_t j = k + 1; j <= n; ++j) {
      for (std::size_t i = k; i < j; ++i) {  // shards 0..k-1 take [0, i), shard k takes [i, j)
        if (best[k - 1][i] == kInf) continue;
        const std::size_t value = std::max(best[k - 1][i], prefix[j] - prefix[i]);
        if (value < best[k][j]) {
          best[k][j] = value;
          cut[k][j] = i;
        }
      }
    }
  }
  shards_.resize(s_count);
  std::size_t end = n;
  for (std::size_t k = s_count; k-- > 0;) {
    const std::size_t start = k == 0 ? 0 : cut[k][end];
    Shard& shard = shards_[k];
    shard.first_segment = start;
    shard.end_segment = end;
    shard.begin = prefix[start];
    shard.end = prefix[end];
    end = start;
  }
  PIPESGD_ASSERT(end == 0);
}

std::size_t ShardPlan::largest() const {
  std::size_t result = 0;
  for (const Shard& shard : shards_) result = std::max(result, shard.count());
  return result;
}

}  // namespace pipesgd
