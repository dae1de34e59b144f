#pragma once
// Runs that end before their method's deferred phase (MethodOptions::deferred_phase: the warm-up's
// end, the bucket plan, the pipeline): such a run never shows the method's steady state. Rank 0
// warns on stderr when it starts; the report, summary.json and compare.json say what ran instead.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/algo/method_options.h"
#include "pipesgd/report/run_summary.h"

namespace pipesgd {

// `options`' deferred phase for a warm-up of `warmup_iterations`, if a run of `total_iterations`
// ends before it (at or before its first iteration); nullopt otherwise.
std::optional<DeferredPhase> unreached_phase(const MethodOptions& options, std::int64_t warmup_iterations,
                                             std::int64_t total_iterations);

// "the run's 5 iterations end before <event> at iteration <start> (<reason>); <before>".
std::string describe_short_run(const DeferredPhase& phase, std::int64_t total_iterations);

// The warning line (with its newline): "pipesgd: warning: <description>; a run of N or more
// iterations reaches it".
std::string short_run_warning(const DeferredPhase& phase, std::int64_t total_iterations);

// summary.json's and compare.json's "unreached_phase": {"start_iteration", "event", "reason",
// "before"}, or null.
nlohmann::json unreached_phase_json(const std::optional<DeferredPhase>& phase);

// compare: one line "<method>: <description>." per run that ended before its phase.
void print_short_runs(std::ostream& out, const std::vector<RunSummary>& summaries);

}  // namespace pipesgd
