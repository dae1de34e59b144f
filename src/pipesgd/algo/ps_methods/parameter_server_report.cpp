#include "pipesgd/algo/ps_methods/parameter_server_report.h"

#include <ostream>

#include "pipesgd/core/text_table.h"

namespace pipesgd {

ComparisonTable parameter_server_table() {
  ComparisonTable table;
  table.id = "parameter-server";
  table.print = [](std::ostream& out, std::span<const RunFigures> runs) {
    bool any = false;
    for (const RunFigures& run : runs) any = any || dynamic_cast<const ParameterServerReport*>(run.report.get());
    if (!any) return;
    out << "\nTraining speed and accuracy (the form of od-sgd.txt Table 1):\n";
    std::vector<std::vector<std::string>> rows = {{"Algorithms", "Speed (samples/s)", "Train Acc (%)", "Test Acc (%)"}};
    for (const RunFigures& run : runs) {
      rows.push_back({run.method_spec, format_number("%.1f", run.throughput),
                      format_number("%.3f", run.final_train_accuracy * 100),
                      run.final_test_accuracy < 0 ? std::string("-") : format_number("%.3f", run.final_test_accuracy * 100)});
    }
    print_table(out, rows);
  };
  return table;
}

}  // namespace pipesgd
