#pragma once
// What an odsgd run reports: OD-SGD's performance model (OD-SGD paper Eq. 1-3) beside the
// measurement. T_org and T'_com come from the synchronous warm-up iterations (SSGD on the same
// servers), T_cop and T_com from the measured pipelined iterations.
#include <cstdint>
#include <optional>

#include "pipesgd/algo/ps_methods/parameter_server_report.h"
#include "pipesgd/timing/od_sgd_timing_model.h"

namespace pipesgd {

struct OdSgdModel {
  std::int64_t sync_iterations = 0;  // warm-up iterations measured (0: T_org, T'_com unknown)
  double sync_iteration = 0;         // measured T_org (mean warm-up iteration), seconds
  OdSgdTimes times;                  // T_cop = compute thread busy, T_com = comm thread, T'_com
  double predicted_iteration = 0;    // Eq. 2: T_new
  // max(T_cop, T_com): the iteration time of this implementation's pipeline, whose next push waits
  // for the previous pull (as the paper's comm_buf_ dependency, Fig. 8), so that when T_com > T_cop
  // an iteration takes T_com rather than Eq. 2's average (T_com + T_cop) / 2.
  double overlap_bound = 0;
  double predicted_improvement = 0;  // Eq. 3 (0 if sync_iterations == 0)
  double measured_improvement = 0;   // (T_org - measured T_new) / T_org (0 if sync_iterations == 0)
};

class OdSgdReport final : public ParameterServerReport {
 public:
  // `switching`: the switching iteration max(N, 1) - 1 (algo/odsgd/od_sgd.h).
  OdSgdReport(std::int64_t switching, ServerUpdateSettings settings)
      : ParameterServerReport(std::move(settings)), switching_(switching) {}
  // The model, once measure() saw pipelined iterations (none if the run ended in its warm-up).
  const std::optional<OdSgdModel>& model() const { return model_; }

  void measure(const RunTimings& timings, std::int64_t first_measured) override;
  double predicted_iteration() const override { return model_ ? model_->predicted_iteration : 0; }
  std::string timing_model() const override { return model_ ? "OD-SGD's Eq. 2" : ""; }
  void add_json(nlohmann::json& summary, const RunFigures& run) const override;
  void print(std::ostream& out, const RunFigures& run) const override;

 private:
  std::int64_t switching_;
  std::optional<OdSgdModel> model_;
};

// compare's lines of OD-SGD's improvement rate over its warm-up (predicted by Eq. 3, measured).
ComparisonTable od_sgd_improvement_table();

}  // namespace pipesgd
