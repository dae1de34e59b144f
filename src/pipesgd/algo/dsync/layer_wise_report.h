#pragma once
// What a layer-wise D-Sync run reports (algo/dsync/bucketed_dsync.h): its plan, what the plan was
// computed from, and the plan's timeline beside the measurement (mg-wfbp.txt Eq. 8 / 21); and the
// layer-wise table of `compare`.
#include <string>

#include "pipesgd/algo/method_report.h"
#include "pipesgd/algo/planning.h"

namespace pipesgd {

class LayerWiseReport final : public MethodReport {
 public:
  std::string plan;       // "mgwfbp: 3 buckets ..."
  std::size_t calls = 0;  // allreduces per iteration under the chosen plan
  // Once planned: the plan's timeline + update, its t_c^no, and what it was computed from
  // (averaged over the workers).
  bool planned = false;
  double predicted = 0;
  double predicted_non_overlapped = 0;
  PlanningInputs planned_from;

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
