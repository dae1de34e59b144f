#pragma once
// What a run reports: the tables printed at the end of `train` and `compare`, and the files written
// with --out (metrics.jsonl, summary.json, compare.json). The generic figures are printed here; each
// method adds its own through its report (algo/method_report.h) and compare's tables of its family.
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/train/run_summary.h"

namespace pipesgd {

nlohmann::json summary_to_json(const RunSummary& summary);
// {"signal": "SIGINT", "at_iteration": N, "of_iterations": M, "workers_reported": W}, or null.
nlohmann::json interruption_to_json(const std::optional<Interruption>& interrupted);

// Writes DIR/summary.json atomically, durably unless the run was interrupted (metrics.jsonl:
// train/metrics_file.h). Throws UsageError / DataError naming the file.
void write_summary_file(const std::string& dir, const RunSummary& summary);

// The end-of-run table: timing breakdown, throughput and the timing models' predictions, then the
// method's own paragraph.
void print_run_report(std::ostream& out, const RunSummary& summary);

// One row per method, speedup relative to the first (the column says "speedup vs <first>"), a line
// per run that ended before its method's deferred phase; then the tables of the compared methods'
// families (registry order).
void print_compare_table(std::ostream& out, const std::vector<RunSummary>& summaries);

// Writes DIR/compare.json (atomically).
void write_compare_outputs(const std::string& dir, const std::vector<RunSummary>& summaries);

}  // namespace pipesgd
