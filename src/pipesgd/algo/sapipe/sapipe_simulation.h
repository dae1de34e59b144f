#pragma once
// SAPipe's schedule for the simulator (algo/simulated_method.h), as SaPipe runs it
// (algo/sapipe/sapipe.h) in its steady state: the partition (k stale layers, the synchronous
// layers' buckets) is the runtime's own SapipePartition planned from the profile (auto: the least k
// whose timeline does not stall). Iteration t: begins with the stale range's update from G(t-2) and
// its compensation; before the forward of a synchronous layer applies the bucket of iteration t-1
// that holds it (waiting for its allreduce); backward hands each synchronous bucket to the comm
// thread when its lowest layer is done and the stale range after layer 0. The first warm-up
// iterations run synchronously (one allreduce after backward, applied at once).
// Compensation cost (an assumption, per element of the stale range, in SGD updates of the same
// elements): none 0, dc 1, wp1 1, wp2 1, wp3 2.
#include <memory>

#include "pipesgd/algo/simulated_method.h"

namespace pipesgd {

std::unique_ptr<SimulatedMethod> simulate_sapipe(const SimulationContext& context);

}  // namespace pipesgd
