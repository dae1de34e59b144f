// Time to accuracy (report/accuracy_target.h) and its column in compare's table and compare.json:
// reached at the first epoch at or above the target, never reached, the default target (the best
// accuracy every run reached), train accuracy when a run has no test accuracy, --target-accuracy's
// validation.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/core/error.h"
#include "pipesgd/report/accuracy_target.h"
#include "pipesgd/report/report.h"
#include "temp_dir.h"

namespace pipesgd {
namespace {

EpochRecord epoch(std::int64_t number, double elapsed, double test_accuracy, double train_accuracy = 0.5) {
  EpochRecord record;
  record.epoch = number;
  record.iterations = number * 10;
  record.elapsed_seconds = elapsed;
  record.test_accuracy = test_accuracy;
  record.train_accuracy = train_accuracy;
  return record;
}

std::vector<std::span<const EpochRecord>> spans(const std::vector<std::vector<EpochRecord>>& runs) {
  return {runs.begin(), runs.end()};
}

TEST(TimeToAccuracy, IsTheElapsedTimeOfTheFirstEpochAtOrAboveTheTarget) {
  const std::vector<EpochRecord> epochs = {epoch(1, 1.5, 0.60), epoch(2, 3.0, 0.80), epoch(3, 4.5, 0.79),
                                           epoch(4, 6.0, 0.85)};
  const AccuracyTarget target{0.80, AccuracyKind::kTest, true};
  EXPECT_EQ(time_to_accuracy(epochs, target), 3.0);
  EXPECT_EQ(time_to_accuracy(epochs, AccuracyTarget{0.81, AccuracyKind::kTest, true}), 6.0);
  EXPECT_EQ(time_to_accuracy(epochs, AccuracyTarget{0.5, AccuracyKind::kTest, true}), 1.5);
}

TEST(TimeToAccuracy, NeverReachedIsNullopt) {
  const std::vector<EpochRecord> epochs = {epoch(1, 1.5, 0.60), epoch(2, 3.0, 0.70)};
  EXPECT_EQ(time_to_accuracy(epochs, AccuracyTarget{0.9, AccuracyKind::kTest, true}), std::nullopt);
  EXPECT_EQ(time_to_accuracy({}, AccuracyTarget{0.1, AccuracyKind::kTest, true}), std::nullopt);
}

TEST(TimeToAccuracy, SkipsEpochsThatMeasuredNothing) {
  // -1: not evaluated (an epoch of a run with --no-eval, or one whose evaluation was skipped).
  const std::vector<EpochRecord> epochs = {epoch(1, 1.0, -1, 0.9), epoch(2, 2.0, 0.95, -1)};
  EXPECT_EQ(time_to_accuracy(epochs, AccuracyTarget{0.5, AccuracyKind::kTest, true}), 2.0);
  EXPECT_EQ(time_to_accuracy(epochs, AccuracyTarget{0.5, AccuracyKind::kTrain, true}), 1.0);
}

TEST(AccuracyTargetDefault, IsTheBestTestAccuracyEveryRunReached) {
  const std::vector<std::vector<EpochRecord>> runs = {{epoch(1, 1, 0.70), epoch(2, 2, 0.84), epoch(3, 3, 0.82)},
                                                      {epoch(1, 1, 0.75), epoch(2, 2, 0.81)}};
  const std::optional<AccuracyTarget> target = choose_accuracy_target(spans(runs), std::nullopt);
  ASSERT_TRUE(target);
  EXPECT_EQ(target->accuracy, 0.81);
  EXPECT_EQ(target->kind, AccuracyKind::kTest);
  EXPECT_FALSE(target->given);
  // Every run reaches it: the first at epoch 2, the second at its best, epoch 2.
  EXPECT_EQ(time_to_accuracy(runs[0], *target), 2.0);
  EXPECT_EQ(time_to_accuracy(runs[1], *target), 2.0);
}

TEST(AccuracyTargetDefault, FallsBackToTrainAccuracyWhenARunHasNoTestAccuracy) {
  const std::vector<std::vector<EpochRecord>> runs = {{epoch(1, 1, 0.70, 0.60), epoch(2, 2, 0.80, 0.66)},
                                                      {epoch(1, 1, -1, 0.64), epoch(2, 2, -1, 0.72)}};
  const std::optional<AccuracyTarget> target = choose_accuracy_target(spans(runs), std::nullopt);
  ASSERT_TRUE(target);
  EXPECT_EQ(target->kind, AccuracyKind::kTrain);
  EXPECT_EQ(target->accuracy, 0.66);
}

TEST(AccuracyTargetDefault, NoneWithoutACommonAccuracyOrRuns) {
  const std::vector<std::vector<EpochRecord>> runs = {{epoch(1, 1, 0.70, -1)}, {epoch(1, 1, -1, 0.64)}};
  EXPECT_EQ(choose_accuracy_target(spans(runs), std::nullopt), std::nullopt);
  EXPECT_EQ(choose_accuracy_target(spans(runs), 0.5), std::nullopt);
  EXPECT_EQ(choose_accuracy_target({}, std::nullopt), std::nullopt);
  const std::vector<std::vector<EpochRecord>> one_without_epochs = {{epoch(1, 1, 0.70)}, {}};
  EXPECT_EQ(choose_accuracy_target(spans(one_without_epochs), std::nullopt), std::nullopt);
}

TEST(AccuracyTargetRequested, TakesTheGivenValueOnTheCommonAccuracy) {
  const std::vector<std::vector<EpochRecord>> runs = {{epoch(1, 1, 0.70)}, {epoch(1, 1, 0.60)}};
  const std::optional<AccuracyTarget> target = choose_accuracy_target(spans(runs), 0.65);
  ASSERT_TRUE(target);
  EXPECT_EQ(target->accuracy, 0.65);
  EXPECT_EQ(target->kind, AccuracyKind::kTest);
  EXPECT_TRUE(target->given);
  EXPECT_EQ(time_to_accuracy(runs[0], *target), 1.0);
  EXPECT_EQ(time_to_accuracy(runs[1], *target), std::nullopt);
}

TEST(AccuracyTargetFlag, IsAFractionInZeroToOne) {
  EXPECT_NO_THROW(check_target_accuracy(0.85));
  EXPECT_NO_THROW(check_target_accuracy(1));
  for (const double bad : {0.0, -0.5, 1.0001, 85.0, std::nan("")}) {
    try {
      check_target_accuracy(bad);
      ADD_FAILURE() << bad << " accepted";
    } catch (const UsageError& error) {
      EXPECT_NE(std::string(error.what()).find("--target-accuracy must be a fraction in (0, 1]"), std::string::npos)
          << error.what();
    }
  }
}

TEST(AccuracyTargetJson, RoundTripsAndRejectsOtherShapes) {
  const AccuracyTarget target{0.8125, AccuracyKind::kTrain, true};
  const std::optional<AccuracyTarget> read = accuracy_target_from_json(accuracy_target_to_json(target), "x");
  ASSERT_TRUE(read);
  EXPECT_EQ(read->accuracy, 0.8125);
  EXPECT_EQ(read->kind, AccuracyKind::kTrain);
  EXPECT_TRUE(read->given);
  EXPECT_EQ(accuracy_target_from_json(nullptr, "x"), std::nullopt);
  EXPECT_TRUE(accuracy_target_to_json(std::nullopt).is_null());
  EXPECT_THROW(accuracy_target_from_json(0.8, "x"), DataError);
  EXPECT_THROW(accuracy_target_from_json({{"accuracy", 2}, {"of", "test"}, {"given", false}}, "x"), DataError);
  EXPECT_THROW(accuracy_target_from_json({{"accuracy", 0.5}, {"of", "validation"}, {"given", false}}, "x"), DataError);
}

RunSummary compared(const std::string& spec, std::vector<EpochRecord> epochs) {
  RunSummary summary;
  summary.setup.method_spec = spec;
  summary.figures.method_spec = spec;
  summary.figures.throughput = 100;
  summary.figures.report = std::make_shared<AllreduceCallsReport>(1);
  summary.timing.measured_iterations = 100;  // a run that measured its figures
  summary.epochs = std::move(epochs);
  return summary;
}

TEST(CompareTimeToAccuracy, TableColumnAndCompareJson) {
  const std::vector<RunSummary> summaries = {compared("dsync", {epoch(1, 2, 0.70), epoch(2, 4, 0.82)}),
                                             compared("pipe", {epoch(1, 1.5, 0.75), epoch(2, 3, 0.80)})};
  // Default: 80.00%, the best pipe reached; dsync reaches it at its epoch 2 (4 s), pipe at 3 s.
  std::ostringstream table;
  print_compare_table(table, summaries);
  const std::string text = table.str();
  const std::string header = text.substr(0, text.find('\n'));
  EXPECT_NE(header.find("time to 80.00% test"), std::string::npos) << header;
  EXPECT_NE(text.find("4.00 s"), std::string::npos) << text;
  EXPECT_NE(text.find("3.00 s"), std::string::npos) << text;

  // Given: 81% — dsync at 4 s, pipe never.
  std::ostringstream given;
  print_compare_table(given, summaries, 0.81);
  const std::string pipe_row = given.str().substr(given.str().find("\npipe") + 1);
  EXPECT_NE(given.str().find("time to 81.00% test"), std::string::npos) << given.str();
  EXPECT_NE(pipe_row.find(" - "), std::string::npos) << pipe_row;

  TempDir dir;
  write_compare_outputs(dir.path(), summaries, 0.81);
  std::ifstream file(dir.file("compare.json"));
  const nlohmann::json records = nlohmann::json::parse(file);
  ASSERT_EQ(records.size(), 2u);
  for (const nlohmann::json& record : records) {
    EXPECT_EQ(record["target_accuracy"], (nlohmann::json{{"accuracy", 0.81}, {"of", "test"}, {"given", true}}));
  }
  EXPECT_EQ(records[0]["time_to_target_accuracy_s"], 4.0);
  EXPECT_TRUE(records[1]["time_to_target_accuracy_s"].is_null());
}

TEST(CompareTimeToAccuracy, NoAccuracyNoTarget) {
  const std::vector<RunSummary> summaries = {compared("dsync", {}), compared("pipe", {})};
  std::ostringstream table;
  print_compare_table(table, summaries);
  EXPECT_NE(table.str().find("time to target"), std::string::npos) << table.str();
  TempDir dir;
  write_compare_outputs(dir.path(), summaries);
  std::ifstream file(dir.file("compare.json"));
  const nlohmann::json records = nlohmann::json::parse(file);
  EXPECT_TRUE(records[0]["target_accuracy"].is_null());
  EXPECT_TRUE(records[0]["time_to_target_accuracy_s"].is_null());
}

}  // namespace
}  // namespace pipesgd
