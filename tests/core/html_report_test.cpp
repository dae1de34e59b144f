// `pipesgd report`'s parts (report/report_data.h, report/html_report.h): the moving average, reading
// train and compare --out directories (and the one-line errors naming the file), the accuracy
// target a report uses, and the page gnuplot draws (needs gnuplot, as the build does:
// scripts/install-deps.sh).
#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/core/error.h"
#include "pipesgd/report/html_report.h"
#include "pipesgd/report/report_data.h"
#include "temp_dir.h"

namespace pipesgd {
namespace {

using nlohmann::json;

TEST(MovingAverage, TrailingMeanOverTheWindow) {
  const std::vector<double> values = {1, 2, 3, 4, 10};
  EXPECT_EQ(moving_average(values, 1), values);
  EXPECT_EQ(moving_average(values, 2), (std::vector<double>{1, 1.5, 2.5, 3.5, 7}));
  EXPECT_EQ(moving_average(values, 3), (std::vector<double>{1, 1.5, 2, 3, 17.0 / 3}));
  EXPECT_EQ(moving_average(values, 100), (std::vector<double>{1, 1.5, 2, 2.5, 4}));
  EXPECT_TRUE(moving_average({}, 5).empty());
}

TEST(MovingAverage, WindowIsATwentiethOfTheRunBetweenOneAndAHundred) {
  EXPECT_EQ(smoothing_window(0), 1u);
  EXPECT_EQ(smoothing_window(30), 1u);
  EXPECT_EQ(smoothing_window(600), 30u);
  EXPECT_EQ(smoothing_window(100000), 100u);
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

json iteration_line(std::int64_t t, double loss, double seconds) {
  return {{"type", "iteration"}, {"iteration", t}, {"epoch", 1},     {"loss", loss},       {"iteration_s", seconds},
          {"update_s", 0.001},   {"forward_s", 0.002}, {"backward_s", 0.003}, {"wait_s", 0.001}, {"comm_s", 0.004}};
}

json epoch_line(std::int64_t epoch, std::int64_t iterations, double elapsed, json test_accuracy, json train_accuracy) {
  return {{"type", "epoch"},       {"epoch", epoch},        {"iterations", iterations},         {"train_loss", 1.0},
          {"test_loss", 1.0},      {"elapsed_s", elapsed},  {"test_accuracy", test_accuracy},   {"train_accuracy", train_accuracy}};
}

// A metrics.jsonl of `iterations` iterations (10 per epoch, 0.01 s each) whose losses fall, and its
// epoch records with test accuracy `base` + 0.125 per epoch (or none: -1) and train accuracy `base` +
// 0.0625 per epoch (binary fractions: the sums are exact).
std::string metrics_text(int iterations, double base, bool evaluated) {
  std::string text;
  for (int t = 0; t < iterations; ++t) {
    text += iteration_line(t, 2.0 / (1 + t), 0.01).dump() + "\n";
    if ((t + 1) % 10 == 0) {
      const int epoch = (t + 1) / 10;
      text += epoch_line(epoch, t + 1, 0.01 * (t + 1), evaluated ? json(base + 0.125 * epoch) : json(-1),
                         base + 0.0625 * epoch)
                  .dump() +
              "\n";
    }
  }
  return text;
}

json mean_times() {
  return {{"update_s", 0.001}, {"compensation_s", 0.0}, {"data_s", 0.0005}, {"forward_s", 0.002}, {"backward_s", 0.003},
          {"wait_s", 0.001},   {"comm_s", 0.004},       {"iteration_s", 0.0075}, {"checkpoint_s", 0.0}, {"loss", 0.5}};
}

json summary_json(const std::string& method) {
  return {{"method", method},
          {"model", "mlp"},
          {"workers", 2},
          {"batch_per_worker", 25},
          {"network", "10gbe"},
          {"mean", mean_times()},
          {"throughput_samples_per_s", 6000.0},
          {"predicted_iteration_s", 0.007},
          {"final_train_accuracy", 0.7},
          {"final_test_accuracy", nullptr}};
}

// A compare --out directory of `methods`, each run 30 iterations; the first method's test accuracy
// is 0.625, 0.75, 0.875 at the ends of its 3 epochs, the others' 0.5, 0.625, 0.75.
void write_compare_directory(const std::filesystem::path& dir, const std::vector<std::string>& methods,
                             json target = nullptr) {
  json records = json::array();
  for (std::size_t i = 0; i < methods.size(); ++i) {
    const std::filesystem::path run = dir / (std::to_string(i + 1) + "-" + methods[i]);
    write_text(run / "metrics.jsonl", metrics_text(30, i == 0 ? 0.5 : 0.375, true));
    write_text(run / "summary.json", summary_json(methods[i]).dump());
    records.push_back({{"method", methods[i]},
                       {"throughput_samples_per_s", 6000.0 + 1000.0 * static_cast<double>(i)},
                       {"iteration_s", 0.0075},
                       {"breakdown", mean_times()},
                       {"predicted_iteration_s", 0.007},
                       {"final_train_accuracy", 0.7},
                       {"final_test_accuracy", 0.8},
                       {"speedup", 1.0 + static_cast<double>(i) / 6},
                       {"speedup_baseline", methods[0]},
                       {"target_accuracy", target},
                       {"time_to_target_accuracy_s", nullptr}});
  }
  write_text(dir / "compare.json", records.dump(2));
}

template <typename ErrorType>
std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const ErrorType& error) {
    return error.what();
  } catch (const std::exception& error) {
    return std::string("wrong error type: ") + error.what();
  }
  return "no error";
}

TEST(ReadMetricsFile, IterationAndEpochLinesInOrder) {
  TempDir dir;
  const std::filesystem::path path = dir.file("metrics.jsonl");
  write_text(path, json{{"type", "resume"}, {"from_iteration", 10}}.dump() + "\n" +
                       iteration_line(10, 1.5, 0.02).dump() + "\n" +
                       json{{"type", "iteration"}, {"iteration", 11}, {"loss", nullptr}, {"iteration_s", 0.03}}.dump() +
                       "\n\n" + epoch_line(2, 12, 0.5, -1, nullptr).dump() + "\n" +
                       epoch_line(3, 18, 0.9, 0.75, 0.7).dump() + "\n" + json{{"type", "trace"}}.dump() + "\n");
  const MetricsRecords records = read_metrics_file(path);
  ASSERT_EQ(records.iterations.size(), 2u);
  EXPECT_EQ(records.iterations[0].iteration, 10);
  EXPECT_EQ(records.iterations[0].loss, 1.5);
  EXPECT_EQ(records.iterations[0].seconds, 0.02);
  EXPECT_TRUE(std::isnan(records.iterations[1].loss));
  ASSERT_EQ(records.epochs.size(), 2u);
  EXPECT_EQ(records.epochs[0].test_accuracy, -1);   // -1: not evaluated
  EXPECT_EQ(records.epochs[0].train_accuracy, -1);  // null: no accuracy
  EXPECT_EQ(records.epochs[1].epoch, 3);
  EXPECT_EQ(records.epochs[1].iterations, 18);
  EXPECT_EQ(records.epochs[1].elapsed_seconds, 0.9);
  EXPECT_EQ(records.epochs[1].test_accuracy, 0.75);
  EXPECT_EQ(records.epochs[1].train_accuracy, 0.7);
}

TEST(ReadMetricsFile, ErrorsNameTheFileAndLine) {
  TempDir dir;
  const std::filesystem::path path = dir.file("metrics.jsonl");
  EXPECT_EQ(error_of<DataError>([&] { read_metrics_file(path); }),
            "metrics '" + path.string() + "': cannot open (No such file or directory)");
  write_text(path, iteration_line(0, 1, 0.1).dump() + "\n{\"type\": \"iteration\", \"iter\n");
  EXPECT_EQ(error_of<DataError>([&] { read_metrics_file(path); }).rfind("metrics '" + path.string() + "' line 2: not valid JSON", 0),
            0u);
  write_text(path, json{{"type", "iteration"}, {"iteration", 0}, {"loss", 1}}.dump() + "\n");
  EXPECT_EQ(error_of<DataError>([&] { read_metrics_file(path); }),
            "metrics '" + path.string() + "' line 1: no \"iteration_s\"");
  write_text(path, "[1, 2]\n");
  EXPECT_EQ(error_of<DataError>([&] { read_metrics_file(path); }),
            "metrics '" + path.string() + "' line 1: expected a JSON object");
}

TEST(ReadReportInput, CompareDirectory) {
  TempDir dir;
  write_compare_directory(dir.path(), {"dsync", "pipe+int8"}, {{"accuracy", 0.7}, {"of", "test"}, {"given", true}});
  const ReportInput input = read_report_input(dir.path());
  EXPECT_TRUE(input.compare);
  EXPECT_EQ(input.speedup_baseline, "dsync");
  EXPECT_EQ(input.model, "mlp");
  EXPECT_EQ(input.workers, 2);
  EXPECT_EQ(input.batch_per_worker, 25);
  EXPECT_EQ(input.network, "10gbe");
  ASSERT_EQ(input.runs.size(), 2u);
  EXPECT_EQ(input.runs[1].method, "pipe+int8");
  EXPECT_EQ(input.runs[1].directory, std::filesystem::path(dir.path()) / "2-pipe+int8");
  EXPECT_EQ(input.runs[1].throughput, 7000);
  EXPECT_EQ(input.runs[1].speedup, 1.0 + 1.0 / 6);
  EXPECT_EQ(input.runs[1].mean.comm, 0.004);
  EXPECT_EQ(input.runs[1].predicted_iteration, 0.007);
  EXPECT_EQ(input.runs[1].final_test_accuracy, 0.8);
  EXPECT_EQ(input.runs[1].metrics.iterations.size(), 30u);
  EXPECT_EQ(input.runs[1].metrics.epochs.size(), 3u);
  ASSERT_TRUE(input.recorded_target);
  EXPECT_EQ(input.recorded_target->accuracy, 0.7);

  // The recorded target is the report's default; --target-accuracy replaces it.
  EXPECT_EQ(report_accuracy_target(input, std::nullopt)->accuracy, 0.7);
  EXPECT_EQ(report_accuracy_target(input, 0.55)->accuracy, 0.55);
}

TEST(ReadReportInput, TrainDirectoryWithoutTestAccuracy) {
  TempDir dir;
  write_text(dir.file("summary.json"), summary_json("pipe").dump());
  write_text(dir.file("metrics.jsonl"), metrics_text(20, 0.5, false));
  const ReportInput input = read_report_input(dir.path());
  EXPECT_FALSE(input.compare);
  ASSERT_EQ(input.runs.size(), 1u);
  EXPECT_EQ(input.runs[0].method, "pipe");
  EXPECT_EQ(input.runs[0].mean.iteration, 0.0075);
  EXPECT_FALSE(input.runs[0].speedup);
  EXPECT_FALSE(input.runs[0].final_test_accuracy);
  EXPECT_FALSE(input.recorded_target);
  // No test accuracy: the default target is the best train accuracy, 0.5 + 0.0625 x 2.
  const std::optional<AccuracyTarget> target = report_accuracy_target(input, std::nullopt);
  ASSERT_TRUE(target);
  EXPECT_EQ(target->kind, AccuracyKind::kTrain);
  EXPECT_EQ(target->accuracy, 0.625);
}

TEST(ReadReportInput, OneLineErrorsNamingTheDirectoryOrFile) {
  TempDir dir;
  const std::string missing = dir.file("none");
  EXPECT_EQ(error_of<UsageError>([&] { read_report_input(missing); }), "report: '" + missing + "': no such directory");
  write_text(dir.file("file"), "x");
  EXPECT_EQ(error_of<UsageError>([&] { read_report_input(dir.file("file")); }),
            "report: '" + dir.file("file") + "' is not a directory");
  std::filesystem::create_directories(dir.file("empty"));
  EXPECT_NE(error_of<UsageError>([&] { read_report_input(dir.file("empty")); }).find("holds neither compare.json"),
            std::string::npos);

  const std::filesystem::path broken = dir.file("broken");
  write_text(broken / "compare.json", "[{\"method\": ");
  EXPECT_EQ(error_of<DataError>([&] { read_report_input(broken); }).rfind("compare results '" + (broken / "compare.json").string() + "': not valid JSON", 0),
            0u);
  write_text(broken / "compare.json", "{}");
  EXPECT_NE(error_of<DataError>([&] { read_report_input(broken); }).find("expected a non-empty list of method records"),
            std::string::npos);

  const std::filesystem::path no_metrics = dir.file("no-metrics");
  write_compare_directory(no_metrics, {"dsync"});
  std::filesystem::remove(no_metrics / "1-dsync" / "metrics.jsonl");
  EXPECT_EQ(error_of<DataError>([&] { read_report_input(no_metrics); }),
            "metrics '" + (no_metrics / "1-dsync" / "metrics.jsonl").string() + "': cannot open (No such file or directory)");

  const std::filesystem::path no_iterations = dir.file("no-iterations");
  write_text(no_iterations / "summary.json", summary_json("dsync").dump());
  write_text(no_iterations / "metrics.jsonl", "");
  EXPECT_EQ(error_of<DataError>([&] { read_report_input(no_iterations); }),
            "metrics '" + (no_iterations / "metrics.jsonl").string() + "': no iteration records");

  const std::filesystem::path no_mean = dir.file("no-mean");
  json summary = summary_json("dsync");
  summary.erase("mean");
  write_text(no_mean / "summary.json", summary.dump());
  write_text(no_mean / "metrics.jsonl", metrics_text(10, 0.5, true));
  EXPECT_EQ(error_of<DataError>([&] { read_report_input(no_mean); }),
            "summary '" + (no_mean / "summary.json").string() + "': no \"mean\"");
}

// The number of times `pattern` occurs in `text`.
std::size_t count(const std::string& text, const std::string& pattern) {
  std::size_t n = 0;
  for (std::size_t at = text.find(pattern); at != std::string::npos; at = text.find(pattern, at + 1)) ++n;
  return n;
}

TEST(HtmlReport, OnePageOfInlineSvgPlotsAndTables) {
  TempDir dir;
  write_compare_directory(dir.path(), {"dsync", "pipe"});
  const std::filesystem::path out = dir.file("report.html");
  write_html_report(dir.path(), out, std::nullopt);
  std::ifstream file(out);
  const std::string html((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  // Loss and accuracy against time and iterations, the breakdown, communication against computation.
  EXPECT_EQ(count(html, "<svg"), 6u);
  EXPECT_EQ(count(html, "</svg>"), 6u);
  for (const char* figure : {"loss-time", "loss-iterations", "accuracy-time", "accuracy-iterations", "breakdown",
                             "comm-compute"}) {
    EXPECT_NE(html.find(std::string("<figure id=\"") + figure + "\">"), std::string::npos) << figure;
  }
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<?xml"), std::string::npos);
  // Self-contained: no reference to another file.
  EXPECT_EQ(std::regex_search(html, std::regex(R"((src|href)=["'](?!#))")), false);
  // No id twice on the page.
  std::map<std::string, int> ids;
  const std::regex id_pattern(R"( id=["']([^"']+)["'])");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), id_pattern); it != std::sregex_iterator(); ++it) {
    ++ids[(*it)[1].str()];
  }
  EXPECT_GT(ids.size(), 6u);
  for (const auto& [id, times] : ids) EXPECT_EQ(times, 1) << id;
  // The table: the speedup and the default target, 75% (the best test accuracy of pipe), which dsync
  // reaches at epoch 2 (0.2 s) and pipe at epoch 3 (0.3 s).
  EXPECT_NE(html.find("<th>speedup vs dsync</th>"), std::string::npos);
  EXPECT_NE(html.find("<td>1.17x</td>"), std::string::npos);
  EXPECT_NE(html.find("<th>time to 75.00% test</th>"), std::string::npos);
  EXPECT_NE(html.find("<td>0.20 s</td>"), std::string::npos);
  EXPECT_NE(html.find("<td>0.30 s</td>"), std::string::npos);
  EXPECT_NE(html.find("moving average over 1 iterations"), std::string::npos);
}

TEST(HtmlReport, SaysNotEvaluatedWithoutAccuracy) {
  TempDir dir;
  write_text(dir.file("summary.json"), summary_json("dsync").dump());
  std::string metrics;
  for (int t = 0; t < 40; ++t) metrics += iteration_line(t, 1.0, 0.01).dump() + "\n";
  metrics += epoch_line(1, 40, 0.4, -1, nullptr).dump() + "\n";
  write_text(dir.file("metrics.jsonl"), metrics);
  const ReportInput input = read_report_input(dir.path());
  const std::string html = render_html_report(input, report_accuracy_target(input, std::nullopt), dir.path());
  EXPECT_EQ(count(html, "<svg"), 4u);
  EXPECT_NE(html.find("Accuracy: not evaluated"), std::string::npos);
  EXPECT_NE(html.find("<th>time to target</th>"), std::string::npos);
  EXPECT_NE(html.find("moving average over 2 iterations"), std::string::npos);
}

// `--algo auto`'s phases, as its summary.json gives them: a table of the phases and the costs.
TEST(HtmlReport, ShowsAutosPhases) {
  TempDir dir;
  json summary = summary_json("auto:any");
  summary["auto"] = {
      {"policy", "any"},
      {"candidates", {"dsync", "pipe K=2"}},
      {"phases",
       {{{"start_iteration", 0}, {"method", "dsync+optimal"}, {"kind", "profiling"}, {"why", "profiling"},
         {"predicted_iteration_s", nullptr}, {"measured_iteration_s", 0.0051}, {"drift_window_iterations", nullptr}},
        {{"start_iteration", 18}, {"method", "pipe K=2"}, {"kind", "chosen"}, {"why", "measured compute <4 ms>"},
         {"predicted_iteration_s", 0.004}, {"measured_iteration_s", 0.0045}, {"drift_window_iterations", 500}},
        {{"start_iteration", 600}, {"method", "dsync+optimal"}, {"kind", "profiling"},
         {"why", "profiling again: the allreduce moved"}, {"predicted_iteration_s", nullptr},
         {"measured_iteration_s", nullptr}, {"drift_window_iterations", nullptr}}}},
      {"startup_cost_s", 0.0125},
      {"startup_cost_fraction", 0.0123},
      {"profiling_cost_s", 0.025},
      {"profiling_cost_fraction", 0.0246}};
  write_text(dir.file("summary.json"), summary.dump());
  write_text(dir.file("metrics.jsonl"), metrics_text(20, 0.5, false));
  const ReportInput input = read_report_input(dir.path());
  ASSERT_TRUE(input.runs[0].auto_phases);
  EXPECT_EQ(input.runs[0].auto_phases->phases.size(), 3u);
  const std::string html = render_html_report(input, report_accuracy_target(input, std::nullopt), dir.path());
  EXPECT_NE(html.find("<h2>auto:any: auto's phases (policy any)</h2>"), std::string::npos) << html;
  EXPECT_NE(html.find("<tr><td>18</td><td>pipe K=2</td><td>chosen</td><td>4.000</td><td>4.500</td><td>measured "
                      "compute &lt;4 ms&gt;</td></tr>"),
            std::string::npos);
  EXPECT_NE(html.find("<tr><td>600</td><td>dsync+optimal</td><td>profiling</td><td>-</td><td>-</td>"),
            std::string::npos);
  EXPECT_NE(html.find("0.013 s (1.23% of the run)"), std::string::npos);
  EXPECT_NE(html.find("0.025 s (2.46% of the run)"), std::string::npos);
  // A run of another method has no such section.
  write_text(dir.file("summary.json"), summary_json("dsync").dump());
  const ReportInput plain = read_report_input(dir.path());
  EXPECT_EQ(render_html_report(plain, std::nullopt, dir.path()).find("auto's phases"), std::string::npos);
  // A malformed phase is one line naming the file and the phase.
  summary["auto"]["phases"][1].erase("kind");
  write_text(dir.file("summary.json"), summary.dump());
  EXPECT_EQ(error_of<DataError>([&] { read_report_input(dir.path()); }),
            concat("summary '", dir.file("summary.json"), "' \"auto\" phase 2: no \"kind\""));
}

TEST(HtmlReport, NeedsGnuplot) {
  TempDir dir;
  write_compare_directory(dir.path(), {"dsync"});
  const ReportInput input = read_report_input(dir.path());
  const char* path = std::getenv("PATH");
  const std::string saved = path != nullptr ? path : "";
  ::setenv("PATH", dir.path().c_str(), 1);
  const std::string error = error_of<Error>([&] { render_html_report(input, std::nullopt, dir.path()); });
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_EQ(error, kGnuplotMissing);
}

}  // namespace
}  // namespace pipesgd
