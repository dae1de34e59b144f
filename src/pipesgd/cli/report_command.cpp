// `pipesgd report DIR`: a train or compare --out directory as one self-contained HTML page
// (report/html_report.h), DIR/report.html unless --out names another file.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/cli/commands.h"
#include "pipesgd/report/accuracy_target.h"
#include "pipesgd/report/html_report.h"

namespace pipesgd {
namespace {

// Where the run in `dir` recorded its --trace (summary.json's configuration.trace; a compare's in its
// methods' summary.json files), or nothing: no run there recorded one (or its files cannot be read,
// which the report itself then says).
std::optional<std::filesystem::path> recorded_trace(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> summaries = {dir / "summary.json"};
  std::error_code error;
  std::vector<std::filesystem::path> methods;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.is_directory(error)) methods.push_back(entry.path() / "summary.json");
  }
  std::sort(methods.begin(), methods.end());
  summaries.insert(summaries.end(), methods.begin(), methods.end());
  for (const std::filesystem::path& summary : summaries) {
    std::ifstream file(summary);
    if (!file) continue;
    const nlohmann::json json = nlohmann::json::parse(file, nullptr, false);
    if (json.is_discarded() || !json.is_object()) continue;
    const auto configuration = json.find("configuration");
    if (configuration == json.end() || !configuration->is_object()) continue;
    const auto trace = configuration->find("trace");
    if (trace != configuration->end() && trace->is_string() && !trace->get<std::string>().empty()) {
      return std::filesystem::path(trace->get<std::string>());
    }
  }
  return std::nullopt;
}

struct ReportFlags {
  std::string dir;
  std::string out;
  std::optional<double> target_accuracy;
  std::string trace;
};

int run_report(const ReportFlags& flags) {
  if (flags.target_accuracy) check_target_accuracy(*flags.target_accuracy);
  const std::filesystem::path out =
      flags.out.empty() ? std::filesystem::path(flags.dir) / "report.html" : std::filesystem::path(flags.out);
  // The run's timeline: --trace FILE, else the file the run recorded writing (summary.json), else
  // DIR/trace.json if there is one.
  std::optional<std::filesystem::path> trace;
  std::error_code error;
  if (!flags.trace.empty()) {
    trace = flags.trace;
  } else if (const std::optional<std::filesystem::path> recorded = recorded_trace(flags.dir)) {
    if (std::filesystem::is_regular_file(*recorded, error)) {
      trace = *recorded;
    } else {
      std::cerr << "pipesgd: warning: the run wrote its trace to " << recorded->string()
                << ", which is gone: no timeline (give --trace FILE where it is now)" << std::endl;
    }
  }
  if (!trace && flags.trace.empty() && std::filesystem::is_regular_file(std::filesystem::path(flags.dir) / "trace.json", error)) {
    trace = std::filesystem::path(flags.dir) / "trace.json";
  }
  write_html_report(flags.dir, out, flags.target_accuracy, trace);
  std::cout << "wrote " << out.string() << "\n";
  return 0;
}

}  // namespace

Subcommand add_report_command(CLI::App& app) {
  auto flags = std::make_shared<ReportFlags>();
  Subcommand report;
  report.command = app.add_subcommand(
      "report", "Turn a train or compare --out directory into one HTML page of plots and tables (needs gnuplot)");
  report.command->add_option("DIR", flags->dir, "The --out directory of a train or compare run")->required();
  report.command->add_option("--out", flags->out, "The HTML file to write (default: DIR/report.html)");
  report.command->add_option("--target-accuracy", flags->target_accuracy,
                             "The accuracy whose time to reach the table shows per method, as a fraction in (0, 1], "
                             "e.g. 0.85 (test accuracy, or train accuracy if a run has no test accuracy). Default: "
                             "the target compare recorded, else the best accuracy every method reached");
  report.command->add_option("--trace", flags->trace,
                             "The runs' --trace file: the page gets a timeline of a few iterations (default: "
                             "the file the run recorded writing its trace to, in summary.json, wherever it is; else "
                             "DIR/trace.json if it exists)");
  report.run = [flags](MpiSession*) { return run_report(*flags); };
  return report;
}

}  // namespace pipesgd
