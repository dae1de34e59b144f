#pragma once
// The D-Sync family's schedules for the simulator (algo/simulated_method.h).
//  * dsync: after backward, one allreduce of the whole gradient on the compute thread, then the
//    update (algo/dsync/dsync.h).
//  * layer-wise (dsync+PLAN, wfbp, synceasgd, mgwfbp): the plan's buckets, each handed to the comm
//    thread when backward has finished its lowest layer and allreduced in launch order; the update
//    after the last (algo/dsync/bucketed_dsync.h). The plan is computed once from the profile's
//    per-layer backward times and the simulated network's a + b·M, as the runtime computes it from
//    what it measures in its profiling iterations (which the simulation does not replay: it
//    simulates the steady state after them).
#include <memory>

#include "pipesgd/algo/simulated_method.h"

namespace pipesgd {

std::unique_ptr<SimulatedMethod> simulate_dsync(const SimulationContext& context);

}  // namespace pipesgd
