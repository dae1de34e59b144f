#include "pipesgd/report/report_data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "pipesgd/core/error.h"
#include "pipesgd/core/json_file.h"

namespace pipesgd {
namespace {

using nlohmann::json;

[[noreturn]] void malformed(const std::string& source, const std::string& problem) {
  throw DataError(concat(source, ": ", problem));
}

const json& field(const json& object, const char* key, const std::string& source) {
  if (!object.is_object()) malformed(source, "expected a JSON object");
  const auto found = object.find(key);
  if (found == object.end()) malformed(source, concat("no \"", key, "\""));
  return *found;
}

double number(const json& object, const char* key, const std::string& source) {
  const json& value = field(object, key, source);
  if (!value.is_number()) malformed(source, concat("\"", key, "\" is not a number (", value.dump(), ")"));
  return value.get<double>();
}

// A number that may be null (or absent): not measured.
std::optional<double> optional_number(const json& object, const char* key, const std::string& source) {
  const auto found = object.find(key);
  if (found == object.end() || found->is_null()) return std::nullopt;
  if (!found->is_number()) malformed(source, concat("\"", key, "\" is not a number or null (", found->dump(), ")"));
  return found->get<double>();
}

std::string text(const json& object, const char* key, const std::string& source) {
  const json& value = field(object, key, source);
  if (!value.is_string()) malformed(source, concat("\"", key, "\" is not a string (", value.dump(), ")"));
  return value.get<std::string>();
}

std::int64_t integer(const json& object, const char* key, const std::string& source) {
  const json& value = field(object, key, source);
  if (!value.is_number_integer()) malformed(source, concat("\"", key, "\" is not an integer (", value.dump(), ")"));
  return value.get<std::int64_t>();
}

// An accuracy as EpochRecord holds it: -1 when not measured (null, absent or negative).
double accuracy_or_minus_one(const json& object, const char* key, const std::string& source) {
  const std::optional<double> value = optional_number(object, key, source);
  return value && *value >= 0 ? *value : -1;
}

// The inverse of times_to_json (report/metrics_file.h) for the stages the report draws.
IterationTimes iteration_times(const json& object, const std::string& source) {
  IterationTimes times;
  times.update = number(object, "update_s", source);
  times.compensation = number(object, "compensation_s", source);
  times.forward = number(object, "forward_s", source);
  times.backward = number(object, "backward_s", source);
  times.wait = number(object, "wait_s", source);
  times.comm = number(object, "comm_s", source);
  times.iteration = number(object, "iteration_s", source);
  times.data = optional_number(object, "data_s", source).value_or(0);
  times.checkpoint = optional_number(object, "checkpoint_s", source).value_or(0);
  times.loss = optional_number(object, "loss", source).value_or(std::numeric_limits<double>::quiet_NaN());
  return times;
}

std::string quoted(const std::filesystem::path& path) { return concat("'", path.string(), "'"); }

// The compute thread's busy time per iteration ("compute_s", as train and compare print "compute");
// a file written before it had the field: iteration - exposed wait, its definition.
double compute_seconds(const json& object, const IterationTimes& mean, const std::string& source) {
  return optional_number(object, "compute_s", source).value_or(mean.iteration - mean.wait);
}

// A run stopped before its first measured iteration has no figures (null in its files).
bool unmeasured(const json& object, const char* means_key) {
  const auto found = object.find(means_key);
  return found != object.end() && found->is_null();
}

// `record`'s "auto" (summary.json or a compare.json record), if it has one.
std::optional<AutoRecord> auto_record(const json& record, const std::string& source) {
  const auto found = record.find("auto");
  if (found == record.end() || found->is_null()) return std::nullopt;
  const std::string auto_source = source + " \"auto\"";
  AutoRecord out;
  out.policy = text(*found, "policy", auto_source);
  const json& phases = field(*found, "phases", auto_source);
  if (!phases.is_array()) malformed(auto_source, "\"phases\" is not a list");
  for (std::size_t i = 0; i < phases.size(); ++i) {
    const std::string phase_source = concat(auto_source, " phase ", i + 1);
    out.phases.push_back({integer(phases[i], "start_iteration", phase_source), text(phases[i], "method", phase_source),
                          text(phases[i], "kind", phase_source), text(phases[i], "why", phase_source),
                          optional_number(phases[i], "predicted_iteration_s", phase_source),
                          optional_number(phases[i], "measured_iteration_s", phase_source)});
  }
  out.startup_cost = number(*found, "startup_cost_s", auto_source);
  out.profiling_cost = number(*found, "profiling_cost_s", auto_source);
  out.startup_cost_fraction = optional_number(*found, "startup_cost_fraction", auto_source);
  out.profiling_cost_fraction = optional_number(*found, "profiling_cost_fraction", auto_source);
  return out;
}

// The figures summary.json gives every run.
void read_summary_figures(const json& summary, const std::string& source, MethodRun& run) {
  run.method = text(summary, "method", source);
  if (unmeasured(summary, "mean")) {
    malformed(source, "the run was interrupted before its first measured iteration: no figures to report");
  }
  run.mean = iteration_times(field(summary, "mean", source), source + " \"mean\"");
  run.compute = compute_seconds(summary, run.mean, source);
  run.throughput = number(summary, "throughput_samples_per_s", source);
  run.predicted_iteration = number(summary, "predicted_iteration_s", source);
  run.final_train_accuracy = optional_number(summary, "final_train_accuracy", source);
  run.final_test_accuracy = optional_number(summary, "final_test_accuracy", source);
  run.auto_phases = auto_record(summary, source);
}

void read_setup(const json& summary, const std::string& source, ReportInput& input) {
  input.model = text(summary, "model", source);
  input.workers = static_cast<int>(integer(summary, "workers", source));
  input.batch_per_worker = integer(summary, "batch_per_worker", source);
  input.network = text(summary, "network", source);
}

ReportInput read_compare_directory(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "compare.json";
  const std::string source = concat("compare results ", quoted(path));
  const json records = read_json_file(path.string(), source);
  if (!records.is_array() || records.empty()) malformed(source, "expected a non-empty list of method records");
  ReportInput input;
  input.compare = true;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const json& record = records[i];
    const std::string record_source = concat(source, " record ", i + 1);
    MethodRun run;
    run.method = text(record, "method", record_source);
    run.directory = dir / concat(i + 1, "-", run.method);
    if (unmeasured(record, "breakdown")) continue;  // interrupted before its first measured iteration
    run.mean = iteration_times(field(record, "breakdown", record_source), record_source + " \"breakdown\"");
    run.compute = compute_seconds(record, run.mean, record_source);
    run.throughput = number(record, "throughput_samples_per_s", record_source);
    run.predicted_iteration = number(record, "predicted_iteration_s", record_source);
    run.speedup = optional_number(record, "speedup", record_source);  // null: no baseline measured
    run.final_train_accuracy = optional_number(record, "final_train_accuracy", record_source);
    run.final_test_accuracy = optional_number(record, "final_test_accuracy", record_source);
    run.auto_phases = auto_record(record, record_source);
    if (input.runs.empty()) {
      input.speedup_baseline = text(record, "speedup_baseline", record_source);
      if (const auto target = record.find("target_accuracy"); target != record.end()) {
        input.recorded_target = accuracy_target_from_json(*target, record_source);
      }
      const std::filesystem::path summary_path = run.directory / "summary.json";
      const std::string summary_source = concat("summary ", quoted(summary_path));
      read_setup(read_json_file(summary_path.string(), summary_source), summary_source, input);
    }
    run.metrics = read_metrics_file(run.directory / "metrics.jsonl");
    input.runs.push_back(std::move(run));
  }
  if (input.runs.empty()) {
    malformed(source, "every method was interrupted before its first measured iteration: no figures to report");
  }
  return input;
}

ReportInput read_train_directory(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "summary.json";
  const std::string source = concat("summary ", quoted(path));
  const json summary = read_json_file(path.string(), source);
  ReportInput input;
  read_setup(summary, source, input);
  MethodRun run;
  run.directory = dir;
  read_summary_figures(summary, source, run);
  run.metrics = read_metrics_file(dir / "metrics.jsonl");
  input.runs.push_back(std::move(run));
  return input;
}

}  // namespace

MetricsRecords read_metrics_file(const std::filesystem::path& path) {
  const std::string file_source = concat("metrics ", quoted(path));
  std::ifstream file(path);
  if (!file.is_open()) malformed(file_source, concat("cannot open (", std::strerror(errno), ")"));
  MetricsRecords records;
  std::string line;
  for (std::int64_t number_of_line = 1; std::getline(file, line); ++number_of_line) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string source = concat(file_source, " line ", number_of_line);
    json record;
    try {
      record = json::parse(line);
    } catch (const json::exception& error) {
      const auto* parse_error = dynamic_cast<const json::parse_error*>(&error);
      malformed(source, parse_error != nullptr ? concat("not valid JSON (parse error at byte ", parse_error->byte, ")")
                                               : std::string("not valid JSON"));
    }
    const std::string type = text(record, "type", source);
    if (type == "iteration") {
      IterationRecord iteration;
      iteration.iteration = integer(record, "iteration", source);
      iteration.seconds = number(record, "iteration_s", source);
      iteration.loss = optional_number(record, "loss", source).value_or(std::numeric_limits<double>::quiet_NaN());
      records.iterations.push_back(iteration);
    } else if (type == "epoch") {
      EpochRecord epoch;
      epoch.epoch = integer(record, "epoch", source);
      epoch.iterations = integer(record, "iterations", source);
      epoch.elapsed_seconds = number(record, "elapsed_s", source);
      epoch.train_accuracy = accuracy_or_minus_one(record, "train_accuracy", source);
      epoch.test_accuracy = accuracy_or_minus_one(record, "test_accuracy", source);
      epoch.train_loss = optional_number(record, "train_loss", source).value_or(std::numeric_limits<double>::quiet_NaN());
      epoch.test_loss = optional_number(record, "test_loss", source).value_or(-1);
      records.epochs.push_back(epoch);
    }
    // "resume" and any later kind of record: nothing to draw.
  }
  if (file.bad()) malformed(file_source, "cannot read");
  return records;
}

ReportInput read_report_input(const std::filesystem::path& dir) {
  std::error_code error;
  if (!std::filesystem::exists(dir, error)) throw UsageError(concat("report: ", quoted(dir), ": no such directory"));
  if (!std::filesystem::is_directory(dir, error)) throw UsageError(concat("report: ", quoted(dir), " is not a directory"));
  ReportInput input;
  if (std::filesystem::exists(dir / "compare.json", error)) {
    input = read_compare_directory(dir);
  } else if (std::filesystem::exists(dir / "summary.json", error)) {
    input = read_train_directory(dir);
  } else {
    throw UsageError(concat("report: ", quoted(dir),
                            " holds neither compare.json (a compare --out directory) nor summary.json (a train --out "
                            "directory)"));
  }
  const bool any_iterations = std::any_of(input.runs.begin(), input.runs.end(),
                                          [](const MethodRun& run) { return !run.metrics.iterations.empty(); });
  if (!any_iterations) {
    malformed(concat("metrics ", quoted(input.runs.front().directory / "metrics.jsonl")), "no iteration records");
  }
  return input;
}

std::vector<double> moving_average(std::span<const double> values, std::size_t window) {
  PIPESGD_ASSERT(window >= 1);
  std::vector<double> averages;
  averages.reserve(values.size());
  double sum = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    sum += values[i];
    if (i >= window) sum -= values[i - window];
    averages.push_back(sum / static_cast<double>(std::min(i + 1, window)));
  }
  return averages;
}

std::size_t smoothing_window(std::size_t points) { return std::clamp<std::size_t>(points / 20, 1, 100); }

}  // namespace pipesgd
