#pragma once
// What a layer-wise D-Sync run reports (algo/dsync/bucketed_dsync.h): its plan, what the plan was
// computed from, and the plan's timeline beside the measurement (MG-WFBP paper Eq. 8 / 21); and the
// layer-wise table of `compare`.
#include <string>

#include "pipesgd/algo/method_report.h"
#include "pipesgd/algo/planning.h"

namespace pipesgd {

class LayerWiseReport final : public MethodReport {
 public:
  std::string plan_name;         // the plan asked for: "mgwfbp"
  std::int64_t plan_start = 0;   // the first iteration the first plan made takes effect
  // The plan that ran: the one made ("mgwfbp: 3 buckets ..."), or in a run that ended before it
  // the one of the last iteration ("single: 1 bucket: [2..0]", "wfbp: ..." while profiling).
  std::string plan;
  std::size_t calls = 0;  // allreduces per iteration under `plan`
  // Once planned: the plan's timeline + update, its t_c^no, and what it was computed from
  // (averaged over the workers).
  bool planned = false;
  double predicted = 0;
  double predicted_non_overlapped = 0;
  PlanningInputs planned_from;

  // `plan`, or "mgwfbp: not reached (it takes effect at iteration 18); the last iteration ran <plan>".
  std::string plan_text() const;
  std::string bucket_plan() const override { return plan; }
  std::size_t allreduce_calls() const override { return calls; }
  double predicted_iteration() const override { return planned ? predicted : 0; }
  const PlanningInputs* planning_inputs() const override { return planned ? &planned_from : nullptr; }
  // The measured t_c^no is the compute thread's wait after backward (IterationTimes::wait).
  void add_json(nlohmann::json& summary, const RunFigures& run) const override;
  void print(std::ostream& out, const RunFigures& run) const override;
};

// compare's layer-wise table: every layer-wise run and every run without buckets (the baselines).
ComparisonTable layer_wise_table();

}  // namespace pipesgd
