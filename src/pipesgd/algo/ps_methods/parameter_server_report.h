#pragma once
// What a parameter-server run reports (pssync, asgd, dcasgd; odsgd's report extends it), and the
// table `compare` prints when one was compared: OD-SGD paper Table 1's form, speed and accuracy.
#include "pipesgd/algo/method_report.h"
#include "pipesgd/algo/ps_methods/ps_methods.h"

namespace pipesgd {

// summary.json: "async_scale" ("1" | "1/M") if set; "delay_compensation" {"by", "variant",
// "lambda", "momentum" (DC-ASGD-a only)} if set. train's report: one line saying the same.
class ParameterServerReport : public MethodReport {
 public:
  explicit ParameterServerReport(ServerUpdateSettings settings) : settings_(std::move(settings)) {}
  void add_json(nlohmann::json& summary, const RunFigures& run) const override;
  void print(std::ostream& out, const RunFigures& run) const override;

 private:
  ServerUpdateSettings settings_;
};

ComparisonTable parameter_server_table();

}  // namespace pipesgd
