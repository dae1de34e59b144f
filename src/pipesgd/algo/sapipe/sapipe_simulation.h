#pragma once
// SAPipe's schedule for the simulator (algo/simulated_method.h), as SaPipe runs it
// (algo/sapipe/sapipe.h) in its steady state: the partition (k stale layers, the synchronous
// layers' buckets) is the runtime's own SapipePartition planned from the profile (auto: the least k
// whose timeline does not stall). Iteration t: begins with the stale range's update from G(t-2) and
// its compensation; before the forward of a synchronous layer applies the bucket of iteration t-1
// that holds it (waiting for its allreduce); backward hands each synchronous bucket to the comm
// thread when its lowest layer is done and the stale range after layer 0. The first warm-up
// iterations run synchronously (one allreduce after backward, applied at once).
// The stale range's update and compensation cost: the profile's measured seconds per element for
// the compensation (method_costs "sapipe:<compensation>", measured by `pipesgd profile` with the
// runtime's StaleCompensation: the update and compensation together, charged as the trainer times
// them: "update" for none, "compensation" otherwise). A profile without it (the shipped paper
// profiles) gets an estimate in SGD updates of the stale range: the update, plus none 0, dc 1,
// wp1 1, wp2 1, wp3 2 more.
#include <memory>
#include <string>

#include "pipesgd/algo/sapipe/sapipe_options.h"
#include "pipesgd/algo/simulated_method.h"

namespace pipesgd {

// The profile's method_costs key for `compensation`: "sapipe:none", "sapipe:wp3", ...
std::string sapipe_compensation_cost_name(Compensation compensation);

std::unique_ptr<SimulatedMethod> simulate_sapipe(const SimulationContext& context);

}  // namespace pipesgd
