#pragma once
// What `pipesgd report` reads: a `train --out` directory (metrics.jsonl, summary.json) or a
// `compare --out` directory (compare.json, and each method's run in DIR/<n>-<spec>/ with its
// metrics.jsonl and summary.json), as one record per method; and the moving average its loss curves
// are drawn with. Every problem with the files is one line naming the file: UsageError for a
// directory that is not an --out directory, DataError for a missing, malformed or empty file.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/algo/iteration_times.h"
#include "pipesgd/report/accuracy_target.h"
#include "pipesgd/report/run_summary.h"
#include "pipesgd/report/trace_timeline.h"

namespace pipesgd {

// An "iteration" line of metrics.jsonl.
struct IterationRecord {
  std::int64_t iteration = 0;
  double loss = 0;     // NaN if the file has null (a non-finite loss)
  double seconds = 0;  // iteration_s: the iteration's wall time (mean over the workers)
};

// The iteration and epoch lines of a metrics.jsonl, in file order (a resume line is skipped).
struct MetricsRecords {
  std::vector<IterationRecord> iterations;
  std::vector<EpochRecord> epochs;  // test_accuracy / train_accuracy -1 where not measured
};

// Reads `path` (DataError naming it if it is missing, a line is not a JSON object, or a record lacks
// a field the report uses).
MetricsRecords read_metrics_file(const std::filesystem::path& path);

// `--algo auto`'s phases, as summary.json's (and compare.json's) "auto" gives them.
struct AutoPhaseRecord {
  std::int64_t start_iteration = 0;
  std::string method;  // e.g. "pipe+int8 K=2"
  std::string kind;    // "profiling", "trial", "chosen" or "scheduled"
  std::string why;
  std::optional<double> predicted_iteration;  // seconds; chosen and trial phases
  std::optional<double> measured_iteration;   // seconds; null if none of its iterations was measured
};
struct AutoRecord {
  std::string policy;
  std::vector<AutoPhaseRecord> phases;
  double startup_cost = 0;    // seconds: the profiling and trials before the first choice
  double profiling_cost = 0;  // seconds: every profiling and trial of the run
  std::optional<double> startup_cost_fraction;  // of the run's recorded iterations
  std::optional<double> profiling_cost_fraction;
};

// One method's run: its figures (summary.json, or its compare.json record) and its metrics.
struct MethodRun {
  std::string method;
  std::filesystem::path directory;  // where its metrics.jsonl and summary.json are
  IterationTimes mean;              // means per iteration (summary.json "mean", compare.json "breakdown")
  double compute = 0;               // "compute_s": the compute thread's busy time per iteration (iteration - exposed wait)
  double throughput = 0;            // samples per second
  double predicted_iteration = 0;   // the method's timing model, seconds
  std::optional<double> speedup;    // compare only: throughput relative to the first method
  std::optional<double> final_train_accuracy;
  std::optional<double> final_test_accuracy;
  std::optional<AutoRecord> auto_phases;  // `--algo auto` only
  MetricsRecords metrics;
};

struct ReportInput {
  bool compare = false;  // a compare --out directory (else train's)
  std::string speedup_baseline;  // compare only: the method `speedup` is relative to
  // The run's set-up, from the first run's summary.json.
  std::string model;
  int workers = 0;
  std::int64_t batch_per_worker = 0;
  std::string network;
  std::vector<MethodRun> runs;  // at least one
  // The accuracy target compare.json records (compare --target-accuracy or its default); nullopt
  // for a train directory and a compare.json without one.
  std::optional<AccuracyTarget> recorded_target;
  // A few iterations of the runs' --trace file, if the report was given one (report/trace_timeline.h).
  std::vector<Timeline> timelines;
};

// Reads the --out directory `dir`.
ReportInput read_report_input(const std::filesystem::path& dir);

// Trailing moving average: element i is the mean of values[max(0, i - window + 1) .. i].
// window >= 1.
std::vector<double> moving_average(std::span<const double> values, std::size_t window);

// The window the report smooths `points` loss values with: 1/20 of them, at least 1, at most 100.
std::size_t smoothing_window(std::size_t points);

}  // namespace pipesgd
