#include "pipesgd/algo/dsync/layer_wise_report.h"

#include <algorithm>
#include <ostream>

#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"

namespace pipesgd {

std::string LayerWiseReport::plan_text() const {
  if (planned) return plan;
  return concat(plan_name, ": not reached (it takes effect at iteration ", plan_start, "); the last iteration ran ",
                plan);
}

void LayerWiseReport::add_json(nlohmann::json& summary, const RunFigures& run) const {
  summary["non_overlapped_comm_s"] = run.mean.wait;
  summary["predicted_non_overlapped_comm_s"] =
      planned ? nlohmann::json(predicted_non_overlapped) : nlohmann::json(nullptr);
  summary["planned_bucket_plan"] = plan_name;
  summary["bucket_plan_reached"] = planned;
  summary["bucket_plan_start_iteration"] = plan_start;
}

void LayerWiseReport::print(std::ostream& out, const RunFigures& run) const {
  out << "\nLayer-wise communication: plan " << plan_text() << "; " << calls
      << (calls == 1 ? " allreduce" : " allreduces") << " per iteration. Non-overlapped communication t_c^no (the wait "
      << "after backward): " << milliseconds(run.mean.wait) << " ms measured";
  if (planned) {
    out << ", " << milliseconds(predicted_non_overlapped)
        << " ms predicted by the plan's timeline (MG-WFBP paper Eq. 8 / 21)";
  }
  out << "; iteration " << milliseconds(run.mean.iteration) << " ms measured, " << milliseconds(run.predicted_iteration)
      << " ms predicted" << (planned ? "" : " (Eq. 2: no plan was made)") << ".\n";
}

ComparisonTable layer_wise_table() {
  ComparisonTable table;
  table.id = "layer-wise";
  table.print = [](std::ostream& out, std::span<const RunFigures> runs) {
    const bool any = std::any_of(runs.begin(), runs.end(), [](const RunFigures& run) {
      return dynamic_cast<const LayerWiseReport*>(run.report.get()) != nullptr;
    });
    if (!any) return;
    out << "\nLayer-wise communication (MG-WFBP paper; predicted = the plan's timeline + update from the "
           "run's profile):\n";
    std::vector<std::vector<std::string>> rows = {{"method", "allreduces/iter", "iter ms", "predicted ms",
                                                   "measured/predicted", "t_c^no ms", "predicted t_c^no"}};
    std::vector<std::string> plans;  // under the table: a plan's bucket list is long
    for (const RunFigures& run : runs) {
      const auto* layer_wise = dynamic_cast<const LayerWiseReport*>(run.report.get());
      // Runs with buckets of another kind (sapipe's synchronous layers) have tables of their own.
      // Parameter-server runs allreduce nothing.
      if (layer_wise == nullptr && (!run.report->bucket_plan().empty() || run.report->allreduce_calls() == 0)) continue;
      const double ratio = run.predicted_iteration > 0 ? run.mean.iteration / run.predicted_iteration : 0;
      rows.push_back({run.method_spec, concat(run.report->allreduce_calls()), milliseconds(run.mean.iteration),
                      milliseconds(run.predicted_iteration), format_number("%.3f", ratio),
                      layer_wise ? milliseconds(run.mean.wait) : std::string("-"),
                      layer_wise && layer_wise->planned ? milliseconds(layer_wise->predicted_non_overlapped)
                                                        : std::string("-")});
      plans.push_back(concat("plan of ", run.method_spec, ": ",
                             layer_wise ? layer_wise->plan_text() : std::string("one allreduce after backward")));
    }
    print_table(out, rows);
    for (const std::string& plan : plans) out << plan << '\n';
  };
  return table;
}

}  // namespace pipesgd
