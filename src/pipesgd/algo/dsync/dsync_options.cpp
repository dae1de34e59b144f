#include "pipesgd/algo/dsync/dsync_options.h"

#include "pipesgd/algo/planning.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// "iteration 3" or "iterations 3-7".
std::string iteration_range(std::int64_t first, std::int64_t last) {
  return first == last ? concat("iteration ", first) : concat("iterations ", first, "-", last);
}

}  // namespace

std::optional<DeferredPhase> DsyncOptions::deferred_phase(std::int64_t) const {
  if (!layer_wise()) return std::nullopt;
  // BucketedDSync's first cycle: one bucket until the interference phase, one per layer in it.
  const std::int64_t start = kProfileWarmupIterations + profile_iterations;
  const std::int64_t per_layer = profile_iterations / 2;
  std::string before = concat("until then it allreduces the whole gradient as one bucket (",
                              iteration_range(0, start - per_layer - 1), ")");
  if (per_layer > 0) {
    before += concat(", then one bucket per layer to profile (", iteration_range(start - per_layer, start - 1), ")");
  }
  return DeferredPhase{start, concat("the ", buckets, " bucket plan takes effect"),
                       concat("it is made from ", profile_iterations,
                              profile_iterations == 1 ? " profiled iteration after " : " profiled iterations after ",
                              kProfileWarmupIterations, " start-up ones"),
                       before};
}

std::string DsyncOptions::fingerprint() const {
  if (!layer_wise()) return "";
  return concat("buckets ", buckets, ", profile ", profile_iterations, ", replan every ", replan_every);
}

}  // namespace pipesgd
