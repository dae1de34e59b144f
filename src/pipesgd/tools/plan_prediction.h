#pragma once
// `pipesgd plan`: each bucket plan's buckets and predicted iteration (MG-WFBP's timeline,
// timing/bucket_plan.h) and Pipe-SGD's Eq. 5-7 over the same profile (timing/pipe_timing_model.h),
// from a profile measured exactly as a layer-wise run measures it: a run of the registry's
// profiling method to the end of its planning step (algo/planning.h's PlanningInputs).
#include <string>
#include <vector>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/timing/allreduce_cost_model.h"
#include "pipesgd/timing/bucket_plan.h"
#include "pipesgd/train/run_config.h"

namespace pipesgd {

// Runs `config` (cli_common.h's layer_wise_profiling_config: the profiling method on config.workers
// threads over config.network) on `data` and returns what its planning step measured: the
// per-layer profile, kappa, the update and the cost a + b·M, averaged over the workers.
PlanningInputs measure_planning_inputs(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data);

// One bucket plan's MG-WFBP timeline.
struct PlanPrediction {
  std::string name;  // as asked ("fixed:25")
  BucketPlan plan;
  PlanTimeline timeline;
  double iteration = 0;  // timeline.iteration + the update
};

// Pipe-SGD's Eq. 6 with one plan's buckets as its L segments (a plan with buckets only).
struct PipelinedPrediction {
  std::string plan;
  int segments = 0;
  double first_segment_backward = 0;  // l_b: the backward of the first bucket's layers
  double comm = 0;                    // ring_allreduce_time(workers, gradient bytes, L segments)
  // max(Eq. 6, up + comp): no iteration is shorter than the compute thread's whole work.
  double iteration = 0;
};

struct PlanPredictions {
  PlanningInputs inputs;
  double gradient_bytes = 0;    // on the wire, with the codec
  double backward_seconds = 0;  // the layers' t_b summed
  std::string algorithm;        // the allreduce whose cost the plans use (auto resolved)
  std::string cost_source;      // planning_cost_source
  std::vector<PlanPrediction> plans;  // in the order asked
  WfbpCase wfbp;                      // MG-WFBP Sec. III-A's case of WFBP
  // Pipe-SGD (K >= 2, ring allreduce, S = 0) from planning_link.
  LinkParameters link;
  std::string link_source;             // planning_link_source
  double compute = 0;                  // up + comp = t_f + t_b + update
  double sequential_comm = 0;          // Eq. 5's comm: the whole gradient after backward
  double sequential_iteration = 0;     // Eq. 5
  double scaling_efficiency = 0;       // Eq. 7 with sequential communication
  std::vector<PipelinedPrediction> pipelined;  // per plan with buckets, in the order of `plans`
};

// The predictions of the bucket plans named `plans` (make_bucket_plan's names; UsageError for
// another) over `inputs`, for `workers` ranks allreducing with `common`'s codec and algorithm over
// `network` (the cost's and the link's sources, as planning_cost and planning_link take them).
PlanPredictions predict_plans(const PlanningInputs& inputs, const std::vector<std::string>& plans,
                              const CommonOptions& common, const NetworkSpec& network, int workers);

}  // namespace pipesgd
