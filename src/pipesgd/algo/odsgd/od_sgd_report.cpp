#include "pipesgd/algo/odsgd/od_sgd_report.h"

#include <algorithm>
#include <ostream>

#include "pipesgd/core/text_table.h"

namespace pipesgd {

void OdSgdReport::measure(const RunTimings& timings, std::int64_t first_measured) {
  const std::int64_t total = timings.iterations();
  const std::int64_t switching = std::min(switching_, total);
  if (switching >= total) return;  // the run ended in its warm-up
  const IterationTimes pipelined = timings.mean(first_measured, total);
  OdSgdModel model;
  model.times.compute = pipelined.iteration - pipelined.wait;
  model.times.communication = pipelined.comm;
  // The warm-up's first iterations pay one-off costs: skip them as the measured range does. (A run
  // resumed after its warm-up measured none of it.)
  const std::int64_t start_up = std::min<std::int64_t>(10, switching / 10);
  model.sync_iterations = timings.recorded(start_up, switching);
  if (model.sync_iterations > 0) {
    const IterationTimes sync = timings.mean(start_up, switching);
    model.sync_iteration = sync.iteration;
    model.times.sync_communication = sync.comm;
  }
  model.predicted_iteration = od_sgd_iteration_time(model.times);
  model.overlap_bound = std::max(model.times.compute, model.times.communication);
  if (model.sync_iterations > 0 && sync_ps_iteration_time(model.times) > 0 && model.sync_iteration > 0) {
    model.predicted_improvement = od_sgd_improvement_rate(model.times);
    model.measured_improvement = (model.sync_iteration - pipelined.iteration) / model.sync_iteration;
  }
  model_ = model;
}

void OdSgdReport::add_json(nlohmann::json& summary, const RunFigures& run) const {
  ParameterServerReport::add_json(summary, run);
  if (!model_) {
    summary["od_sgd_model"] = nullptr;
    return;
  }
  const OdSgdModel& m = *model_;
  summary["od_sgd_model"] = {{"sync_iterations_measured", m.sync_iterations},
                             {"t_org_measured_s", m.sync_iteration},
                             {"t_cop_s", m.times.compute},
                             {"t_com_s", m.times.communication},
                             {"t_com_sync_s", m.times.sync_communication},
                             {"t_new_predicted_eq2_s", m.predicted_iteration},
                             {"t_new_overlap_bound_s", m.overlap_bound},
                             {"improvement_rate_predicted_eq3", m.predicted_improvement},
                             {"improvement_rate_measured", m.measured_improvement}};
}

void OdSgdReport::print(std::ostream& out, const RunFigures& run) const {
  ParameterServerReport::print(out, run);
  if (!model_) return;
  const OdSgdModel& r = *model_;
  out << "\nOD-SGD timing model (the paper's Eq. 1-3): T_cop = compute thread busy = " << milliseconds(r.times.compute)
      << " ms, T_com = push + pull on the comm thread = " << milliseconds(r.times.communication) << " ms";
  if (r.sync_iterations <= 0) {
    out << "\nT_org and T'_com are measured on the synchronous warm-up iterations, and this run had "
           "too few: give --warmup-iters 20 or more to see the improvement rate. Eq. 2 predicts T_new = "
        << milliseconds(r.predicted_iteration) << " ms, measured " << milliseconds(run.mean.iteration) << " ms\n";
    return;
  }
  out << ", T'_com = SSGD push + pull in the " << r.sync_iterations
      << " measured warm-up iterations = " << milliseconds(r.times.sync_communication) << " ms\n";
  const double original = sync_ps_iteration_time(r.times);
  std::vector<std::vector<std::string>> rows = {
      {"", "T_org (SSGD) ms", "T_new (OD-SGD) ms", "improvement rate"},
      {"predicted (Eq. 2, 3)", milliseconds(original), milliseconds(r.predicted_iteration),
       percent(r.predicted_improvement)},
      {"max(T_cop, T_com)", milliseconds(original), milliseconds(r.overlap_bound),
       percent(1 - r.overlap_bound / original)},
      {"measured", milliseconds(r.sync_iteration), milliseconds(run.mean.iteration), percent(r.measured_improvement)}};
  print_table(out, rows);
  out << "(Eq. 2 averages two adjacent iterations when T_com > T_cop; here the next push waits for "
         "the previous pull, as the paper's comm_buf_ dependency (Fig. 8), so an iteration takes "
         "max(T_cop, T_com).)\n";
}

ComparisonTable od_sgd_improvement_table() {
  ComparisonTable table;
  table.id = "od-sgd-improvement";
  table.print = [](std::ostream& out, std::span<const RunFigures> runs) {
    for (const RunFigures& run : runs) {
      const auto* report = dynamic_cast<const OdSgdReport*>(run.report.get());
      if (report == nullptr || !report->model() || report->model()->sync_iterations <= 0) continue;
      out << run.method_spec << ": OD-SGD improvement rate over its synchronous warm-up, predicted (Eq. 3) "
          << percent(report->model()->predicted_improvement) << ", measured "
          << percent(report->model()->measured_improvement) << "\n";
    }
  };
  return table;
}

}  // namespace pipesgd
