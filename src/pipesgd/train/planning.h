#pragma once
// What the bucket plans (timing/bucket_plan.h) are computed from, outside a training run: the cost
// model a + b·M of one allreduce, and a per-layer profile of the model measured by running it. Used
// by the trainer (MethodConfig::bucket_cost) and by `pipesgd plan`, so both predict alike.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/algo/training_method.h"
#include "pipesgd/collective/allreduce.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/timing/bucket_plan.h"

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

// The cost a + b·M of `config`'s allreduce measured on `workers` threads over an emulated `network`
// (LocalFabric), at cost_probe_sizes(profile): what a layer-wise run measures in its planning step.
LinearCost measure_local_allreduce_cost(const MethodConfig& config, const NetworkSpec& network,
                                        int workers, const LayerProfile& profile);

struct MeasuredProfile {
  LayerProfile layers;        // t_f = data + forward (+ bookkeeping), per-layer backward times
  double update_seconds = 0;  // one SGD step over the flat buffer
  std::int64_t iterations = 0;
};

// Runs `workers` replicas at once (threads, as the trainer's workers share the cores), each for
// `iterations` + 1 forward/backward passes of `batch` examples on its shard of `data` (the first
// pass is not counted), with readiness reports, and an SGD step after each; returns the means over
// workers and counted iterations. `bytes_per_element` sets LayerProfile::bytes (4 for fp32; a
// codec's encoded size). Throws UsageError for workers < 1, iterations < 1 or too small a data set.
MeasuredProfile measure_layer_profile(const ModelFactory& factory, const DataSplits& data, int workers,
                                      std::size_t batch, std::int64_t iterations, std::uint64_t seed,
                                      double bytes_per_element);

}  // namespace pipesgd
