// compare's table and compare.json name the baseline of their speedup (the first method compared),
// and the table is followed by a line per run that ended before its method's deferred phase; the
// compute stretch and the comm CPU per byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/report/report.h"
#include "temp_dir.h"

namespace pipesgd {
namespace {

RunSummary compared(const std::string& spec, double throughput) {
  RunSummary summary;
  summary.setup.method_spec = spec;
  summary.figures.method_spec = spec;
  summary.figures.throughput = throughput;
  summary.figures.report = std::make_shared<AllreduceCallsReport>(1);
  summary.timing.measured_iterations = 100;  // a run that measured its figures
  return summary;
}

TEST(CompareSpeedup, NamesItsBaseline) {
  const std::vector<RunSummary> summaries = {compared("pipe", 100), compared("dsync", 250)};
  std::ostringstream table;
  print_compare_table(table, summaries);
  const std::string header = table.str().substr(0, table.str().find('\n'));
  EXPECT_NE(header.find("speedup vs pipe"), std::string::npos) << header;
  EXPECT_NE(table.str().find("1.00x"), std::string::npos) << table.str();
  EXPECT_NE(table.str().find("2.50x"), std::string::npos) << table.str();
  TempDir dir;
  write_compare_outputs(dir.path(), summaries);
  std::ifstream file(dir.file("compare.json"));
  const nlohmann::json records = nlohmann::json::parse(file);
  ASSERT_EQ(records.size(), 2u);
  for (const nlohmann::json& record : records) EXPECT_EQ(record["speedup_baseline"], "pipe");
  EXPECT_DOUBLE_EQ(records[1]["speedup"].get<double>(), 2.5);
}

TEST(CompareShortRuns, EachIsNamedBelowTheTable) {
  std::vector<RunSummary> summaries = {compared("dsync", 100), compared("mgwfbp", 100)};
  summaries[1].timing.iterations = 5;
  summaries[1].unreached_phase = DeferredPhase{18, "the plan takes effect", "after profiling", "until then B"};
  std::ostringstream table;
  print_compare_table(table, summaries);
  EXPECT_NE(table.str().find("\nmgwfbp: the run's 5 iterations end before the plan takes effect at iteration 18 (after "
                             "profiling); until then B.\n"),
            std::string::npos)
      << table.str();
  EXPECT_EQ(table.str().find("dsync: the run's"), std::string::npos) << table.str();
  TempDir dir;
  write_compare_outputs(dir.path(), summaries);
  std::ifstream file(dir.file("compare.json"));
  const nlohmann::json records = nlohmann::json::parse(file);
  EXPECT_TRUE(records[0]["unreached_phase"].is_null());
  EXPECT_EQ(records[1]["unreached_phase"]["start_iteration"], 18);
}


// compare's compute stretch (compute over that of nocomm in the same compare) and comm CPU ns/B (the
// allreduces' CPU seconds over their fp32 bytes), in the table and in compare.json; null, and "-",
// where there is no nocomm entry or nothing was allreduced.
RunSummary timed(const std::string& spec, double forward_seconds, double comm_cpu_seconds, double comm_bytes) {
  RunSummary summary = compared(spec, 100);
  summary.timing.stages.forward = forward_seconds;
  summary.timing.stages.update = 0.001;
  summary.figures.mean.comm_cpu = comm_cpu_seconds;
  summary.figures.mean.comm_bytes = comm_bytes;
  return summary;
}

nlohmann::json compare_json(const std::vector<RunSummary>& summaries) {
  TempDir dir;
  write_compare_outputs(dir.path(), summaries);
  std::ifstream file(dir.file("compare.json"));
  return nlohmann::json::parse(file);
}

// The cells of compare's table (columns set apart by two spaces or more), by method and heading.
std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::size_t at = line.find_first_not_of(' ');
  while (at != std::string::npos) {
    std::size_t end = line.find("  ", at);
    cells.push_back(line.substr(at, end == std::string::npos ? std::string::npos : end - at));
    at = end == std::string::npos ? end : line.find_first_not_of(' ', end);
  }
  return cells;
}

// A cell of the --wide table (the stretch and comm CPU columns are not in the default one).
std::string table_cell(const std::vector<RunSummary>& summaries, const std::string& method, const std::string& heading) {
  std::ostringstream table;
  print_compare_table(table, summaries, std::nullopt, /*wide=*/true);
  std::istringstream lines(table.str());
  std::string line;
  std::getline(lines, line);
  const std::vector<std::string> headings = cells_of(line);
  const auto column = std::find(headings.begin(), headings.end(), heading);
  if (column == headings.end()) return "no column '" + heading + "' in: " + line;
  while (std::getline(lines, line)) {
    const std::vector<std::string> cells = cells_of(line);
    if (!cells.empty() && cells[0] == method && cells.size() == headings.size()) {
      return cells[static_cast<std::size_t>(column - headings.begin())];
    }
  }
  return "no row for " + method + " in:\n" + table.str();
}

TEST(CompareCommPath, StretchIsComputeOverNocommsAndCpuPerByteIsCommCpuOverBytes) {
  // compute = update + forward: nocomm 0.004 s, dsync 0.005 s (1.25x), pipe 0.007 s (1.75x).
  const std::vector<RunSummary> summaries = {timed("dsync", 0.004, 0.002, 4e6), timed("nocomm", 0.003, 0, 0),
                                             timed("pipe", 0.006, 0.0005, 2e6)};
  const nlohmann::json records = compare_json(summaries);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_DOUBLE_EQ(records[0]["compute_s"].get<double>(), 0.005);
  EXPECT_DOUBLE_EQ(records[0]["compute_stretch"].get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(records[0]["comm_cpu_ns_per_byte"].get<double>(), 0.5);  // 2 ms / 4 MB
  EXPECT_DOUBLE_EQ(records[1]["compute_stretch"].get<double>(), 1.0);
  EXPECT_TRUE(records[1]["comm_cpu_ns_per_byte"].is_null()) << records[1];
  EXPECT_DOUBLE_EQ(records[2]["compute_stretch"].get<double>(), 1.75);
  EXPECT_DOUBLE_EQ(records[2]["comm_cpu_ns_per_byte"].get<double>(), 0.25);

  EXPECT_EQ(table_cell(summaries, "dsync", "stretch"), "1.25x");
  EXPECT_EQ(table_cell(summaries, "nocomm", "stretch"), "1.00x");
  EXPECT_EQ(table_cell(summaries, "pipe", "stretch"), "1.75x");
  EXPECT_EQ(table_cell(summaries, "dsync", "comm CPU ns/B"), "0.50");
  EXPECT_EQ(table_cell(summaries, "nocomm", "comm CPU ns/B"), "-");
  EXPECT_EQ(table_cell(summaries, "pipe", "comm CPU ns/B"), "0.25");
}

TEST(CompareCommPath, WithoutNocommTheStretchIsNull) {
  const std::vector<RunSummary> summaries = {timed("dsync", 0.004, 0.002, 4e6), timed("pipe", 0.006, 0.0005, 2e6)};
  const nlohmann::json records = compare_json(summaries);
  for (const nlohmann::json& record : records) {
    EXPECT_TRUE(record.contains("compute_stretch")) << record;
    EXPECT_TRUE(record["compute_stretch"].is_null()) << record;
    EXPECT_GT(record["comm_cpu_ns_per_byte"].get<double>(), 0.0);
  }
  EXPECT_EQ(table_cell(summaries, "dsync", "stretch"), "-");
  EXPECT_EQ(table_cell(summaries, "pipe", "stretch"), "-");
  EXPECT_EQ(table_cell(summaries, "pipe", "comm CPU ns/B"), "0.25");
}

TEST(CompareUnmeasured, ARunWithoutMeasuredIterationsShowsNoFiguresAndSaysWhy) {
  std::vector<RunSummary> summaries = {compared("dsync", 100), compared("pipe", 0), compared("sapipe", 0)};
  summaries[1].timing.measured_iterations = 0;
  summaries[1].interrupted = Interruption{2, 3, 100, 2};
  summaries[2].timing.measured_iterations = 0;
  std::ostringstream table;
  print_compare_table(table, summaries);
  const std::string text = table.str();
  EXPECT_EQ(table_cell(summaries, "pipe", "samples/s"), "interrupted") << text;
  EXPECT_EQ(table_cell(summaries, "sapipe", "samples/s"), "not measured") << text;
  EXPECT_EQ(table_cell(summaries, "pipe", "speedup vs dsync"), "-") << text;
  EXPECT_EQ(text.find("0.00x"), std::string::npos) << text;
  const nlohmann::json records = compare_json(summaries);
  EXPECT_TRUE(records[1]["speedup"].is_null()) << records[1];
  EXPECT_TRUE(records[2]["throughput_samples_per_s"].is_null()) << records[2];
}

}  // namespace
}  // namespace pipesgd
