// compare's table and compare.json name the baseline of their speedup (the first method compared),
// and the table is followed by a line per run that ended before its method's deferred phase.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/train/report.h"
#include "temp_dir.h"

namespace pipesgd {
namespace {

RunSummary compared(const std::string& spec, double throughput) {
  RunSummary summary;
  summary.setup.method_spec = spec;
  summary.figures.method_spec = spec;
  summary.figures.throughput = throughput;
  summary.figures.report = std::make_shared<AllreduceCallsReport>(1);
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

}  // namespace
}  // namespace pipesgd
