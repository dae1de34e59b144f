#include "pipesgd/algo/method_report.h"

#include <algorithm>

namespace pipesgd {

IterationTimes RunTimings::mean(std::int64_t first, std::int64_t end) const {
  IterationTimes mean;
  first = std::max(first, first_);
  end = std::min(end, end_);
  const double n = static_cast<double>(per_worker_.size()) * static_cast<double>(end - first);
  if (n <= 0) return mean;
  for (const auto& per_rank : per_worker_) {
    for (std::int64_t t = first; t < end; ++t) mean.add_scaled(per_rank[static_cast<std::size_t>(t)], 1.0 / n);
  }
  return mean;
}

}  // namespace pipesgd
