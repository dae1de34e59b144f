#pragma once
// The cost model a + b·M the bucket plans (timing/bucket_plan.h) start from before a layer-wise run
// measures its own (algo/bucketed_dsync.h), and the one they keep when a calibration file is given.
#include <string>

#include "pipesgd/algo/training_method.h"
#include "pipesgd/comm/network_spec.h"

namespace pipesgd {

// a + b·M of one allreduce of the method's algorithm over `workers` ranks (for the whole gradient of
// `gradient_bytes`, which `auto` is resolved for), from, in this order: the calibration's measured
// a + b·M at this world size; its link parameters through Table II; the emulated network (its
// latency and bandwidth added to default_link_parameters(), which stand for the software cost of a
// message); default_link_parameters().
LinearCost planning_cost(const MethodConfig& config, const NetworkSpec& network, int workers,
                         double gradient_bytes);

// Where planning_cost() took its numbers from, for reports ("calibration file", "emulated network
// bw=1Gbit,lat=200us", "default link parameters").
std::string planning_cost_source(const MethodConfig& config, const NetworkSpec& network, int workers);

}  // namespace pipesgd
