// `pipesgd report DIR`: a train or compare --out directory as one self-contained HTML page
// (train/html_report.h), DIR/report.html unless --out names another file.
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "pipesgd/cli/commands.h"
#include "pipesgd/train/accuracy_target.h"
#include "pipesgd/train/html_report.h"

namespace pipesgd {
namespace {

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
  // The run's timeline: --trace FILE, else DIR/trace.json if the run wrote its trace there.
  std::optional<std::filesystem::path> trace;
  if (!flags.trace.empty()) {
    trace = flags.trace;
  } else if (std::filesystem::is_regular_file(std::filesystem::path(flags.dir) / "trace.json")) {
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
                             "DIR/trace.json if it exists)");
  report.run = [flags](MpiSession*) { return run_report(*flags); };
  return report;
}

}  // namespace pipesgd
