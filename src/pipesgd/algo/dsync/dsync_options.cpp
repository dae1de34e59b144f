#include "pipesgd/algo/dsync/dsync_options.h"

#include <algorithm>

#include "pipesgd/algo/planning.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

std::int64_t DsyncOptions::steady_state_start(std::int64_t warmup_iterations) const {
  if (!layer_wise()) return warmup_iterations;
  // The profiled iterations run other plans (one bucket, one per layer) than the one measured.
  return std::max(warmup_iterations, kProfileWarmupIterations + profile_iterations);
}

std::string DsyncOptions::fingerprint() const {
  if (!layer_wise()) return "";
  return concat("buckets ", buckets, ", profile ", profile_iterations, ", replan every ", replan_every);
}

}  // namespace pipesgd
