#include "pipesgd/algo/ps_methods/parameter_server_report.h"

#include <ostream>

#include "pipesgd/core/text_table.h"

namespace pipesgd {

void ParameterServerReport::add_json(nlohmann::json& summary, const RunFigures&) const {
  if (settings_.async_scale) summary["async_scale"] = async_scale_name(*settings_.async_scale);
  if (const auto& c = settings_.compensation) {
    nlohmann::json compensation = {{"by", settings_.compensated_by}, {"variant", variant_name(c->variant)}, {"lambda", c->lambda}};
    if (c->variant == DelayCompensationVariant::kAdaptive) compensation["momentum"] = c->mean_square_decay;
    summary["delay_compensation"] = compensation;
  }
}

void ParameterServerReport::print(std::ostream& out, const RunFigures&) const {
  if (!settings_.async_scale && !settings_.compensation) return;
  out << "\nUpdate rule:";
  if (settings_.async_scale) {
    out << " the servers apply each push as it arrives with gradient scale " << async_scale_name(*settings_.async_scale)
        << " (--async-scale)" << (settings_.compensation ? ";" : ".");
  }
  if (const auto& c = settings_.compensation) {
    out << " DC-ASGD-" << variant_name(c->variant) << " delay compensation by the " << settings_.compensated_by
        << ", lambda " << c->lambda;
    if (c->variant == DelayCompensationVariant::kAdaptive) out << ", m " << c->mean_square_decay;
    out << ".";
  }
  out << "\n";
}

ComparisonTable parameter_server_table() {
  ComparisonTable table;
  table.id = "parameter-server";
  table.print = [](std::ostream& out, std::span<const RunFigures> runs) {
    bool any = false;
    for (const RunFigures& run : runs) any = any || dynamic_cast<const ParameterServerReport*>(run.report.get());
    if (!any) return;
    out << "\nTraining speed and accuracy (the form of the OD-SGD paper's Table 1):\n";
    std::vector<std::vector<std::string>> rows = {{"Algorithms", "Speed (samples/s)", "Train Acc (%)", "Test Acc (%)"}};
    for (const RunFigures& run : runs) {
      rows.push_back({run.method_spec, format_number("%.1f", run.throughput),
                      run.final_train_accuracy < 0 ? std::string("-") : format_number("%.3f", run.final_train_accuracy * 100),
                      run.final_test_accuracy < 0 ? std::string("-") : format_number("%.3f", run.final_test_accuracy * 100)});
    }
    print_table(out, rows);
  };
  return table;
}

}  // namespace pipesgd
