#pragma once
// OD-SGD's schedule for the simulator (algo/simulated_method.h), as OneStepDelaySgd runs it
// (algo/odsgd/od_sgd.h) with N = max(warm-up, 1): iterations before N - 1 push and pull on the
// compute thread (PS-Sync); from N - 1 on, iteration t hands "push g_t, pull G_{t+1}" to the comm
// thread and computes the local update W_{t+1} from G_t, which it waits for only from N on (the
// pull of iteration t - 1's job). The servers are pssync's (synchronous). The local update costs the
// profile's update time, and once more for the dcasgd-* updaters' compensation.
#include <memory>

#include "pipesgd/algo/simulated_method.h"

namespace pipesgd {

std::unique_ptr<SimulatedMethod> simulate_od_sgd(const SimulationContext& context);

}  // namespace pipesgd
