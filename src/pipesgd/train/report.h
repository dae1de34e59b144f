#pragma once
// What a run reports: the tables printed at the end of `train` and `compare`, and the files written
// with --out (metrics.jsonl, summary.json, compare.json).
#include <iosfwd>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/train/trainer.h"

namespace pipesgd {

nlohmann::json summary_to_json(const RunSummary& summary);

// Writes DIR/metrics.jsonl (one record per iteration, averaged over workers, and one per epoch) and
// DIR/summary.json. Creates DIR. Throws UsageError if DIR cannot be written.
void write_run_outputs(const std::string& dir, const RunSummary& summary,
                       const std::vector<std::vector<IterationTimes>>& times_per_rank,
                       std::int64_t iterations_per_epoch);

// The end-of-run table: timing breakdown, throughput and the Pipe-SGD model's prediction.
void print_run_report(std::ostream& out, const RunSummary& summary);

// One row per method, speedup relative to the first.
void print_compare_table(std::ostream& out, const std::vector<RunSummary>& summaries);

// Writes DIR/compare.json and DIR/<index>-<method>/summary.json for each method.
void write_compare_outputs(const std::string& dir, const std::vector<RunSummary>& summaries);

// Prints rows of cells as an aligned table: the first row is the header, underlined; the first
// column left-aligned, the others right-aligned.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows);

// Seconds as milliseconds with 3 decimals, e.g. "12.345".
std::string milliseconds(double seconds);

// Creates `dir` (and parents) or throws UsageError naming it and the flag that gave it.
void ensure_directory(const std::string& dir, const std::string& flag = "--out");

}  // namespace pipesgd
