#pragma once
// RankSubsetTransport: the first `count` ranks of another Transport, for collectives that must involve
// only those ranks (e.g. the trainer's control allreduce among the M workers of a run whose transport
// also holds the parameter-server ranks M..M+S-1). It is the RankGroupTransport of ranks
// 0..count-1: the identity numbering, so rank() and every peer are the inner transport's own.
#include <numeric>
#include <vector>

#include "pipesgd/comm/rank_group_transport.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

using RankSubsetTransport = RankGroupTransport;

// The view of ranks 0..count-1 of `inner`. Throws UsageError if count is not in [1, inner.size()]
// or inner's rank is not below count. `inner` must outlive the view.
inline RankSubsetTransport first_ranks(Transport& inner, int count) {
  if (count < 1 || count > inner.size() || inner.rank() >= count) {
    throw UsageError(concat("rank subset of ", count, " ranks: invalid for rank ", inner.rank(), " of ", inner.size()));
  }
  std::vector<int> ranks(static_cast<std::size_t>(count));
  std::iota(ranks.begin(), ranks.end(), 0);
  return RankGroupTransport(inner, std::move(ranks));
}

}  // namespace pipesgd
