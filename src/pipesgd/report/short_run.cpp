#include "pipesgd/report/short_run.h"

#include <ostream>

#include "pipesgd/core/error.h"

namespace pipesgd {

std::optional<DeferredPhase> unreached_phase(const MethodOptions& options, std::int64_t warmup_iterations,
                                             std::int64_t total_iterations) {
  std::optional<DeferredPhase> phase = options.deferred_phase(warmup_iterations);
  if (!phase || phase->start < total_iterations) return std::nullopt;
  return phase;
}

std::string describe_short_run(const DeferredPhase& phase, std::int64_t total_iterations) {
  return concat("the run's ", total_iterations, total_iterations == 1 ? " iteration ends" : " iterations end",
                " before ", phase.event, " at iteration ", phase.start, " (", phase.reason, "); ", phase.before);
}

std::string short_run_warning(const DeferredPhase& phase, std::int64_t total_iterations) {
  return concat("pipesgd: warning: ", describe_short_run(phase, total_iterations), "; a run of ", phase.start + 1,
                " or more iterations reaches it\n");
}

nlohmann::json unreached_phase_json(const std::optional<DeferredPhase>& phase) {
  if (!phase) return nullptr;
  return {{"start_iteration", phase->start},
          {"event", phase->event},
          {"reason", phase->reason},
          {"before", phase->before}};
}

void print_short_runs(std::ostream& out, const std::vector<RunSummary>& summaries) {
  for (const RunSummary& summary : summaries) {
    if (!summary.unreached_phase) continue;
    out << summary.setup.method_spec << ": " << describe_short_run(*summary.unreached_phase, summary.timing.iterations)
        << ".\n";
  }
}

}  // namespace pipesgd
