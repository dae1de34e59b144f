#pragma once
// What a run reports: the tables printed at the end of `train` and `compare`, and the files written
// with --out (metrics.jsonl, summary.json, compare.json). The generic figures are printed here; each
// method adds its own through its report (algo/method_report.h) and compare's tables of its family.
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/report/accuracy_target.h"
#include "pipesgd/report/run_summary.h"

namespace pipesgd {

nlohmann::json summary_to_json(const RunSummary& summary);
// {"signal": "SIGINT", "at_iteration": N, "of_iterations": M, "workers_reported": W}, or null.
nlohmann::json interruption_to_json(const std::optional<Interruption>& interrupted);

// Writes DIR/summary.json atomically, durably unless the run was interrupted (metrics.jsonl:
// report/metrics_file.h). Throws UsageError / DataError naming the file.
void write_summary_file(const std::string& dir, const RunSummary& summary);

// The end-of-run table: timing breakdown, throughput and the timing models' predictions, then the
// method's own paragraph.
void print_run_report(std::ostream& out, const RunSummary& summary);

// compare's accuracy target (report/accuracy_target.h): `requested` (--target-accuracy) or the
// default, the best accuracy every method reached; nullopt if the runs share no measured accuracy.
std::optional<AccuracyTarget> compare_accuracy_target(const std::vector<RunSummary>& summaries,
                                                      std::optional<double> requested);

// One row per method, with the time each took to reach compare_accuracy_target(summaries,
// requested_target) and speedup relative to the first (the column says "speedup vs <first>"), a
// line per run that ended before its method's deferred phase; then the tables of the compared
// methods' families (registry order). Not `wide`: the columns that fit 100 characters (method,
// samples/s, iter ms, exposed wait, the accuracy, the time to the target, the speedup); `wide`: every
// column (the stage times, comm, stretch, comm CPU ns/B, the prediction, both accuracies).
void print_compare_table(std::ostream& out, const std::vector<RunSummary>& summaries,
                         std::optional<double> requested_target = std::nullopt, bool wide = false);

// Writes DIR/compare.json (atomically); each record has the accuracy target as print_compare_table
// chooses it ("target_accuracy", accuracy_target_to_json) and "time_to_target_accuracy_s" (null if
// not reached).
void write_compare_outputs(const std::string& dir, const std::vector<RunSummary>& summaries,
                           std::optional<double> requested_target = std::nullopt);

}  // namespace pipesgd
