#include "pipesgd/tools/plan_prediction.h"

#include <algorithm>

#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/timing/pipe_timing_model.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {

PlanningInputs measure_planning_inputs(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data) {
  const RunSummary run = run_training(config, factory, data);
  const PlanningInputs* planned_from = run.figures.report->planning_inputs();
  PIPESGD_ASSERT(planned_from != nullptr);  // the profiling method plans within its iterations
  return *planned_from;
}

PlanPredictions predict_plans(const PlanningInputs& inputs, const std::vector<std::string>& plans,
                              const CommonOptions& common, const NetworkSpec& network, int workers) {
  PlanPredictions result;
  result.inputs = inputs;
  const LayerProfile& profile = inputs.profile;
  const LinearCost& cost = inputs.cost;
  for (double b : profile.bytes) result.gradient_bytes += b;
  for (double b : profile.backward_seconds) result.backward_seconds += b;
  const double fp32_bytes = result.gradient_bytes / bytes_per_element(*make_codec(common.codec)) * sizeof(float);
  result.algorithm = resolve_allreduce_algorithm(common, workers, fp32_bytes);
  result.cost_source = planning_cost_source(common, network, workers);
  for (const std::string& name : plans) {
    PlanPrediction& prediction = result.plans.emplace_back();
    prediction.name = name;
    prediction.plan = make_bucket_plan(name, profile, cost);
    prediction.timeline = simulate_plan(profile, cost, prediction.plan);
    prediction.iteration = prediction.timeline.iteration + inputs.update_seconds;
  }
  result.wfbp = classify_wfbp(profile, cost);

  // Pipe-SGD (K >= 2) over the same profile: Eq. 5 sends the whole gradient after backward, Eq. 6
  // sends each plan's buckets as L segments as they are ready; Eq. 7 is the scaling efficiency.
  result.link = planning_link(common, network);
  result.link_source = planning_link_source(common, network);
  const RingCostParameters ring{result.link.alpha, result.link.beta, result.link.gamma, 0.0};
  result.compute = profile.forward_seconds + result.backward_seconds + inputs.update_seconds;
  result.sequential_comm = ring_allreduce_time(workers, result.gradient_bytes, ring);
  result.sequential_iteration = predict_pipe_sequential_iteration(result.compute, result.sequential_comm);
  result.scaling_efficiency = pipe_scaling_efficiency(result.compute, result.sequential_comm);
  for (const PlanPrediction& prediction : result.plans) {
    const BucketPlan& plan = prediction.plan;
    const int segments = static_cast<int>(plan.buckets.size());
    if (segments == 0) continue;
    PipelinedPrediction& pipelined = result.pipelined.emplace_back();
    pipelined.plan = plan.name;
    pipelined.segments = segments;
    for (std::size_t l = plan.buckets.front().begin; l < plan.buckets.front().end; ++l) {
      pipelined.first_segment_backward += profile.backward_seconds[l];
    }
    pipelined.comm = ring_allreduce_time(workers, result.gradient_bytes, ring, segments);
    // The paper's Eq. 6 charges the compute thread only up + forward + the first segment's backward
    // (l_b), but that thread runs the whole backward every iteration: no iteration is shorter than
    // up + comp, so the prediction is max(Eq. 6, up + comp) = max(up + comp, comm_L).
    pipelined.iteration =
        std::max(result.compute, predict_pipe_pipelined_iteration(result.compute, result.backward_seconds,
                                                                  pipelined.first_segment_backward, pipelined.comm));
  }
  return result;
}

}  // namespace pipesgd
