#pragma once
// `pipesgd report`: the runs of a train or compare --out directory (report/report_data.h) as one
// self-contained HTML page: a table of the figures (throughput, speedup, time to an accuracy), and
// plots that gnuplot draws as SVG, inlined (no scripts, no other files): loss and accuracy against
// wall-clock time and iterations, each method's iteration breakdown beside its predicted and
// measured iteration, communication against computation; with a --trace file, a timeline of a few
// iterations of each run's first two workers.
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "pipesgd/report/accuracy_target.h"
#include "pipesgd/report/report_data.h"

namespace pipesgd {

// The message when gnuplot is not on PATH.
inline constexpr const char* kGnuplotMissing = "pipesgd report needs gnuplot (apt install gnuplot-nox)";
// How long gnuplot may take to draw every plot of a page.
inline constexpr std::chrono::seconds kGnuplotTimeout{60};

// The report's accuracy target: `requested` (report --target-accuracy, check_target_accuracy'd),
// else the one compare.json recorded, else the default over the runs (choose_accuracy_target).
std::optional<AccuracyTarget> report_accuracy_target(const ReportInput& input, std::optional<double> requested);

// The page for `input`, named after `source` (the directory as the user gave it). Runs gnuplot
// (kGnuplotTimeout) in a temporary directory it removes. Throws Error: kGnuplotMissing, or gnuplot's
// failure in one line.
std::string render_html_report(const ReportInput& input, const std::optional<AccuracyTarget>& target,
                               const std::string& source);

// Reads the --out directory `dir` (and the trace file `trace`, if given: a timeline section),
// renders its page and writes it to `out` atomically. Errors: read_report_input's,
// read_trace_timelines', render_html_report's, and write_file_atomically's naming `out`.
void write_html_report(const std::filesystem::path& dir, const std::filesystem::path& out,
                       std::optional<double> requested_target,
                       const std::optional<std::filesystem::path>& trace = std::nullopt);

}  // namespace pipesgd
