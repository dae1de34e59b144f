#pragma once
// What a sapipe run reports: its partition and how it was chosen, its compensation, and the table
// `compare` prints in SAPipe paper Table 2's form.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipesgd/algo/method_report.h"
#include "pipesgd/algo/sapipe/stall_monitor.h"
#include "pipesgd/timing/partial_staleness.h"

namespace pipesgd {

struct SapipeFacts {
  std::size_t layers = 0;
  std::size_t stale_layers = 0;  // k
  double stale_fraction = 0;     // kappa = stale parameters / all parameters (SAPipe paper Def. 1)
  bool automatic = false;        // k from the timeline (--stale-layers auto) or given
  std::string compensation;
  bool dc_term = false;                    // dc, wp3: the fields below apply
  double lambda = 0;                       // --dc-lambda
  bool dc_bound = false;                   // --dc-bound on
  // DC terms clamped by --dc-bound on: dc's updates (the same on every rank), wp3's predictions
  // (each worker's own; rank 0's).
  std::int64_t bounded_compensations = 0;
  std::int64_t pipeline_start = 0;         // the first pipelined iteration
  // False if the run ended before pipeline_start: every iteration ran synchronously, and k and
  // kappa above are 0 (no layer was stale).
  bool pipelined = true;
  bool profiled = false;                   // the fields below are set
  std::optional<std::size_t> paper_stale_layers;  // the paper's program (Sec. 3.1) on the same profile
  double predicted_iteration = 0;          // the simulated steady-state iteration with k (without update)
  bool predicted_stall = false;            // even k stalls on the timeline
  std::size_t timeline_stale_layers = 0;   // auto: k from the timeline, before the stall checks
  std::vector<StallCheck> stall_checks;
  StalenessProfile profile;                // averaged over the workers
  LinearCost cost;
};

class SapipeReport final : public MethodReport {
 public:
  std::string plan;       // the synchronous layers' plan
  std::size_t calls = 0;  // allreduces per iteration: the buckets and the stale range
  SapipeFacts facts;

  std::string bucket_plan() const override { return plan; }
  std::size_t allreduce_calls() const override { return calls; }
  void add_json(nlohmann::json& summary, const RunFigures& run) const override;
  void print(std::ostream& out, const RunFigures& run) const override;
};

// The partition in one line: "k = 2 of 3 layers stale, kappa = ... (auto: ...), compensation wp3...",
// or "never pipelined (it would start at iteration 18): ..." for a run that ended before.
std::string describe_sapipe(const SapipeFacts& facts);

// compare's table in SAPipe paper Table 2's form: final test accuracy per method (one run, so no +-
// column), throughput against `baseline` (the method spec Table 2 compares with), k and kappa,
// and the best SAPipe variant's gain over the baseline.
ComparisonTable sapipe_table(std::string baseline);

}  // namespace pipesgd
