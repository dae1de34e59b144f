#include "pipesgd/report/html_report.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/subprocess.h"
#include "pipesgd/core/text_table.h"

namespace pipesgd {
namespace {

// Plots are drawn with at most this many points per line (every k-th point of a longer series).
constexpr std::size_t kMaxPointsPerLine = 2000;

// A fresh directory for gnuplot's files, removed with them at the end of its scope.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    std::string pattern = (std::filesystem::temp_directory_path() / "pipesgd-report-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw DataError(concat("cannot create a temporary directory '", pattern, "' (", std::strerror(errno), ")"));
    }
    path_ = pattern;
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::string html_escape(const std::string& text) {
  std::string escaped;
  for (const char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&#39;"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

// A gnuplot string literal: single quotes, a quote inside doubled.
std::string gnuplot_string(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  return quoted + "'";
}

std::string number_text(double value) { return format_number("%.9g", value); }

// One color per method, the same in every plot.
std::string method_color(std::size_t index) {
  static const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                        "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
  return kColors[index % (sizeof kColors / sizeof kColors[0])];
}

// A run's loss curve: the iterations with a finite loss, at the wall-clock time the run had spent
// by their end (the cumulative sum of iteration_s), the loss smoothed.
struct LossCurve {
  std::vector<double> iterations;
  std::vector<double> seconds;
  std::vector<double> smoothed_loss;
  std::size_t window = 1;
};

LossCurve loss_curve(const MetricsRecords& metrics) {
  LossCurve curve;
  std::vector<double> losses;
  double clock = 0;
  for (const IterationRecord& record : metrics.iterations) {
    clock += record.seconds;
    if (!std::isfinite(record.loss)) continue;
    curve.iterations.push_back(static_cast<double>(record.iteration));
    curve.seconds.push_back(clock);
    losses.push_back(record.loss);
  }
  curve.window = smoothing_window(losses.size());
  curve.smoothed_loss = moving_average(losses, curve.window);
  return curve;
}

// The gnuplot script that draws a page's plots, each into DIR/<name>.svg, and its data files in DIR.
class PlotScript {
 public:
  explicit PlotScript(std::filesystem::path dir) : dir_(std::move(dir)) {}

  // Writes `rows` as the data file `name`; returns its path as a gnuplot string.
  std::string data(const std::string& name, const std::string& rows) {
    const std::filesystem::path path = dir_ / name;
    std::ofstream file(path);
    file << rows;
    file.close();
    if (!file) throw DataError(concat("cannot write '", path.string(), "' (", std::strerror(errno), ")"));
    return gnuplot_string(path.string());
  }

  // Starts the plot drawn into `name`.svg with these axis labels.
  void begin(const std::string& name, const std::string& x_label, const std::string& y_label) {
    script_ += "reset\n";
    script_ += "set terminal svg size 900,420 font 'sans,12' noenhanced background rgb 'white'\n";
    script_ += concat("set output ", gnuplot_string((dir_ / (name + ".svg")).string()), "\n");
    script_ += "set grid back lc rgb '#e4e4e4' lt 1\n";
    script_ += "set border 3 lc rgb '#555555'\n";
    script_ += "set tics nomirror\n";
    script_ += "set key outside right top\n";
    script_ += concat("set xlabel ", gnuplot_string(x_label), "\n");
    script_ += concat("set ylabel ", gnuplot_string(y_label), "\n");
  }
  void set(const std::string& line) { script_ += line + "\n"; }
  // The plot command of the plot begun last, from its clauses.
  void plot(const std::vector<std::string>& clauses) {
    PIPESGD_ASSERT(!clauses.empty());
    script_ += "plot " + join(clauses, ", \\\n     ") + "\n";
    script_ += "unset output\n";
  }

  const std::string& script() const { return script_; }

 private:
  std::filesystem::path dir_;
  std::string script_;
};

// Every k-th index of n points (k such that at most kMaxPointsPerLine remain), and the last.
bool kept(std::size_t index, std::size_t count) {
  const std::size_t stride = (count + kMaxPointsPerLine - 1) / kMaxPointsPerLine;
  return stride <= 1 || index % stride == 0 || index + 1 == count;
}

// The figures of a page: an inline SVG and what it shows.
struct Figure {
  std::string name;  // the SVG's file stem, and its id prefix in the page
  std::string caption;
};

struct Section {
  std::string heading;
  std::string text;  // HTML (a paragraph), before the figures
  std::vector<Figure> figures;
};

std::string window_caption(const ReportInput& input, const std::vector<LossCurve>& curves) {
  bool same = true;
  for (const LossCurve& curve : curves) same = same && curve.window == curves.front().window;
  if (same) return concat("a trailing moving average over ", curves.front().window, " iterations");
  std::vector<std::string> windows;
  for (std::size_t i = 0; i < curves.size(); ++i) windows.push_back(concat(curves[i].window, " (", input.runs[i].method, ")"));
  return concat("a trailing moving average over ", join(windows), " iterations");
}

Section loss_section(const ReportInput& input, PlotScript& script) {
  Section section{"Training loss", "", {}};
  std::vector<LossCurve> curves;
  std::vector<std::string> by_time, by_iteration;
  for (std::size_t i = 0; i < input.runs.size(); ++i) {
    curves.push_back(loss_curve(input.runs[i].metrics));
    const LossCurve& curve = curves.back();
    if (curve.smoothed_loss.empty()) continue;
    std::string rows;
    for (std::size_t k = 0; k < curve.smoothed_loss.size(); ++k) {
      if (!kept(k, curve.smoothed_loss.size())) continue;
      rows += concat(number_text(curve.iterations[k]), " ", number_text(curve.seconds[k]), " ",
                     number_text(curve.smoothed_loss[k]), "\n");
    }
    const std::string file = script.data(concat("loss-", i + 1, ".dat"), rows);
    const std::string style = concat("with lines lw 2 lc rgb ", gnuplot_string(method_color(i)), " title ",
                                     gnuplot_string(input.runs[i].method));
    by_time.push_back(concat(file, " using 2:3 ", style));
    by_iteration.push_back(concat(file, " using 1:3 ", style));
  }
  if (by_time.empty()) {
    section.text = "<p>No finite training loss was recorded.</p>";
    return section;
  }
  const std::string smoothing = window_caption(input, curves);
  script.begin("loss-time", "wall-clock training time (s)", "training loss");
  script.plot(by_time);
  section.figures.push_back(
      {"loss-time", concat("Training loss (the mean over the workers) against wall-clock time, the cumulative sum of "
                           "the iterations' times (evaluation excluded); each line is ",
                           smoothing, ".")});
  script.begin("loss-iterations", "iteration", "training loss");
  script.plot(by_iteration);
  section.figures.push_back(
      {"loss-iterations", concat("Training loss against iterations, ", smoothing, ".")});
  return section;
}

Section accuracy_section(const ReportInput& input, const std::optional<AccuracyTarget>& target, PlotScript& script) {
  Section section{"Accuracy", "", {}};
  std::vector<std::string> by_time, by_iteration;
  bool any_test = false;
  bool any_train = false;
  for (std::size_t i = 0; i < input.runs.size(); ++i) {
    for (const AccuracyKind kind : {AccuracyKind::kTest, AccuracyKind::kTrain}) {
      std::string rows;
      for (const EpochRecord& epoch : input.runs[i].metrics.epochs) {
        if (const std::optional<double> accuracy = measured_accuracy(epoch, kind)) {
          rows += concat(epoch.iterations, " ", number_text(epoch.elapsed_seconds), " ", number_text(*accuracy * 100), "\n");
        }
      }
      if (rows.empty()) continue;
      (kind == AccuracyKind::kTest ? any_test : any_train) = true;
      const std::string name = accuracy_kind_name(kind);
      const std::string file = script.data(concat("accuracy-", name, "-", i + 1, ".dat"), rows);
      const std::string style =
          concat("with linespoints lw 2 ", kind == AccuracyKind::kTest ? "dt 1 pt 7" : "dt 2 pt 6", " ps 0.9 lc rgb ",
                 gnuplot_string(method_color(i)), " title ", gnuplot_string(concat(input.runs[i].method, " ", name)));
      by_time.push_back(concat(file, " using 2:3 ", style));
      by_iteration.push_back(concat(file, " using 1:3 ", style));
    }
  }
  if (!any_test && !any_train) {
    section.text = "<p>Accuracy: not evaluated (no epoch recorded a test or train accuracy).</p>";
    return section;
  }
  if (target) {
    const std::string line = concat(number_text(target->accuracy * 100), " with lines dt 3 lw 1.5 lc rgb '#555555' title ",
                                    gnuplot_string(concat("target ", format_number("%.2f%%", target->accuracy * 100),
                                                          " ", accuracy_kind_name(target->kind))));
    by_time.push_back(line);
    by_iteration.push_back(line);
  }
  const std::string measured =
      any_test && any_train ? "Test accuracy (solid lines, filled dots) and train accuracy (dashed, open circles)"
      : any_test            ? "Test accuracy (train accuracy not recorded)"
                            : "Train accuracy (dashed, open circles; test accuracy not evaluated)";
  const std::string target_text =
      target ? concat("; the dotted line is the target, ", describe_accuracy_target(*target)) : std::string();
  script.begin("accuracy-time", "wall-clock training time (s)", "accuracy (%)");
  script.plot(by_time);
  section.figures.push_back(
      {"accuracy-time", concat(measured, " at the end of each epoch, against the training time elapsed by then "
                                         "(evaluation excluded)",
                               target_text, ".")});
  script.begin("accuracy-iterations", "iteration", "accuracy (%)");
  script.plot(by_iteration);
  section.figures.push_back({"accuracy-iterations", concat(measured, " at the end of each epoch, against iterations",
                                                           target_text, ".")});
  return section;
}

// A box from (x - 0.4, low) to (x + 0.4, high), as boxxyerror reads it: x y xlow xhigh ylow yhigh.
std::string box_row(double x, double low, double high) {
  return concat(number_text(x), " ", number_text((low + high) / 2), " ", number_text(x - 0.4), " ", number_text(x + 0.4),
                " ", number_text(low), " ", number_text(high), "\n");
}

std::string box_style(const std::string& color, const std::string& title) {
  return concat("using 1:2:3:4:5:6 with boxxyerror fc rgb ", gnuplot_string(color),
                " fs solid 0.9 border lc rgb '#333333' title ", gnuplot_string(title));
}

// xtics naming each method at its group of bars (the first bar at `first`, groups `spacing` apart).
std::string method_tics(const ReportInput& input, double first, double spacing) {
  std::vector<std::string> tics;
  for (std::size_t i = 0; i < input.runs.size(); ++i) {
    tics.push_back(concat(gnuplot_string(input.runs[i].method), " ", number_text(first + spacing * static_cast<double>(i))));
  }
  return concat("set xtics (", join(tics), ") scale 0", input.runs.size() > 5 ? " rotate by -25" : "");
}

Section time_section(const ReportInput& input, PlotScript& script) {
  Section section{"Where an iteration's time goes", "", {}};
  const std::size_t methods = input.runs.size();
  struct Component {
    const char* title;
    const char* data_file;
    double IterationTimes::*stage;
    const char* color;
  };
  const Component components[] = {{"forward", "breakdown-forward.dat", &IterationTimes::forward, "#4e79a7"},
                                  {"backward", "breakdown-backward.dat", &IterationTimes::backward, "#a0cbe8"},
                                  {"update", "breakdown-update.dat", &IterationTimes::update, "#59a14f"},
                                  {"compensation", "breakdown-compensation.dat", &IterationTimes::compensation, "#b07aa1"},
                                  {"exposed wait", "breakdown-wait.dat", &IterationTimes::wait, "#e15759"}};
  // Iteration breakdown: the stack at 4i, the predicted iteration at 4i + 1, the measured at 4i + 2.
  std::vector<std::string> clauses;
  std::vector<double> stacked(methods, 0.0);
  for (const Component& component : components) {
    const bool present = std::any_of(input.runs.begin(), input.runs.end(),
                                     [&](const MethodRun& run) { return run.mean.*component.stage > 0; });
    if (!present) continue;
    std::string rows;
    for (std::size_t i = 0; i < methods; ++i) {
      const double value = input.runs[i].mean.*component.stage * 1e3;
      rows += box_row(4.0 * static_cast<double>(i), stacked[i], stacked[i] + value);
      stacked[i] += value;
    }
    clauses.push_back(concat(script.data(component.data_file, rows), " ", box_style(component.color, component.title)));
  }
  std::string predicted, measured;
  for (std::size_t i = 0; i < methods; ++i) {
    predicted += box_row(4.0 * static_cast<double>(i) + 1, 0, input.runs[i].predicted_iteration * 1e3);
    measured += box_row(4.0 * static_cast<double>(i) + 2, 0, input.runs[i].mean.iteration * 1e3);
  }
  clauses.push_back(concat(script.data("breakdown-predicted.dat", predicted), " ",
                           box_style("#c7c7c7", "predicted iteration")));
  clauses.push_back(concat(script.data("breakdown-measured.dat", measured), " ",
                           box_style("#555555", "measured iteration")));
  script.begin("breakdown", "", "ms per iteration");
  script.set(method_tics(input, 1, 4));
  script.set(concat("set xrange [-1:", 4 * methods - 1, "]"));
  script.set("set yrange [0:*]");
  script.plot(clauses);
  section.figures.push_back(
      {"breakdown",
       "Each method's iteration (means over the workers and the measured iterations): the compute thread's forward, "
       "backward, update and compensation and its exposed wait for communication, stacked; beside them the "
       "iteration its timing model predicts and the measured one. The stack leaves out data loading and the compute "
       "thread's other time (hooks, bookkeeping), so it may fall a little short of the measured bar."});

  // Communication against compute: compute at 3i, communication at 3i + 1.
  std::string compute_rows, comm_rows;
  for (std::size_t i = 0; i < methods; ++i) {
    compute_rows += box_row(3.0 * static_cast<double>(i), 0, input.runs[i].compute * 1e3);
    comm_rows += box_row(3.0 * static_cast<double>(i) + 1, 0, input.runs[i].mean.comm * 1e3);
  }
  script.begin("comm-compute", "", "ms per iteration");
  script.set(method_tics(input, 0.5, 3));
  script.set(concat("set xrange [-1:", 3 * methods - 1, "]"));
  script.set("set yrange [0:*]");
  script.plot({concat(script.data("compute.dat", compute_rows), " ", box_style("#4e79a7", "compute")),
               concat(script.data("communication.dat", comm_rows), " ", box_style("#f28e2b", "communication"))});
  section.figures.push_back(
      {"comm-compute",
       "Communication (comm_s: the allreduce, or the pushes and pulls, on the thread that ran them) against "
       "compute (the compute thread's busy time: iteration - exposed wait, the \"compute\" train and compare print), "
       "per iteration. A method that overlaps them "
       "exposes less wait than its communication takes."});
  return section;
}

// The colour of a timeline span by name.
std::string timeline_color(const std::string& name) {
  static const std::map<std::string, std::string> colors = {
      {"data", "#bab0ac"},         {"forward", "#4e79a7"}, {"backward", "#a0cbe8"}, {"update", "#59a14f"},
      {"compensation", "#b07aa1"}, {"wait", "#e15759"},    {"checkpoint", "#9c755f"}, {"allreduce", "#f28e2b"},
      {"push", "#f28e2b"},         {"pull", "#edc948"}};
  const auto found = colors.find(name);
  return found != colors.end() ? found->second : std::string("#79706e");
}

// Each traced run's timeline: its tracks top to bottom, a box per span coloured by its name, the
// iteration written on every forward (compute) and every allreduce, push or pull (comm).
Section timeline_section(const ReportInput& input, PlotScript& script) {
  Section section{"Timeline (from the trace)",
                  "<p>A few consecutive iterations of the trace, each run's first two workers: the compute thread's "
                  "stages and the comm thread's transfers. The number on a forward span is its iteration; on an "
                  "allreduce (push, pull), the iteration whose gradient it moves. Where communication is hidden, the "
                  "allreduce of iteration t runs under the forward and backward of t + 1 (Pipe-SGD) or under the "
                  "backward of t (the layer-wise methods); D-Sync's waits for it.</p>\n",
                  {}};
  for (std::size_t i = 0; i < input.timelines.size(); ++i) {
    const Timeline& timeline = input.timelines[i];
    const auto rows = static_cast<double>(timeline.tracks.size());
    std::map<std::string, std::string> boxes_by_name;
    std::string labels;
    for (const TimelineBox& box : timeline.boxes) {
      const double y = rows - 1 - static_cast<double>(box.track);
      boxes_by_name[box.name] += concat(number_text((box.start_ms + box.end_ms) / 2), " ", number_text(y), " ",
                                        number_text(box.start_ms), " ", number_text(box.end_ms), " ",
                                        number_text(y - 0.35), " ", number_text(y + 0.35), "\n");
      const bool labelled = box.name == "forward" || box.name == "allreduce" || box.name == "push" || box.name == "pull";
      if (labelled && box.iteration >= 0) {
        labels += concat(number_text((box.start_ms + box.end_ms) / 2), " ", number_text(y), " \"", box.iteration, "\"\n");
      }
    }
    const std::string stem = concat("timeline-", i);
    std::vector<std::string> clauses;
    for (const auto& [name, rows_text] : boxes_by_name) {
      clauses.push_back(concat(script.data(concat(stem, "-", name, ".dat"), rows_text),
                               " using 1:2:3:4:5:6 with boxxyerror fc rgb ", gnuplot_string(timeline_color(name)),
                               " fs solid 0.85 border lc rgb '#333333' title ", gnuplot_string(name)));
    }
    if (!labels.empty()) {
      clauses.push_back(concat(script.data(stem + "-labels.dat", labels),
                               " using 1:2:3 with labels font ',9' textcolor rgb '#111111' notitle"));
    }
    std::vector<std::string> tics;
    for (std::size_t t = 0; t < timeline.tracks.size(); ++t) {
      tics.push_back(concat(gnuplot_string(timeline.tracks[t]), " ", number_text(rows - 1 - static_cast<double>(t))));
    }
    script.begin(stem, "ms", "");
    script.set(concat("set ytics (", join(tics), ") scale 0"));
    script.set(concat("set yrange [-0.6:", number_text(rows - 0.4), "]"));
    script.set("set xrange [0:*]");
    script.set("set grid xtics noytics");
    script.plot(clauses);
    const std::string run = timeline.run.empty() ? std::string("the run") : timeline.run;
    section.figures.push_back(
        {stem, concat(run, ": iterations ", timeline.first_iteration, " to ",
                      timeline.first_iteration + timeline.iterations - 1, " of worker 0's compute thread, and what every "
                      "shown thread did meanwhile (ms from the window's start).")});
  }
  return section;
}

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

// `svg` (a file gnuplot wrote) as an element of the page: from its <svg> tag on, every id and every
// reference to one prefixed with `prefix`, so that the plots of one page share no id.
std::string inline_svg(const std::string& svg, const std::string& prefix, const std::filesystem::path& path) {
  const std::size_t start = svg.find("<svg");
  if (start == std::string::npos) throw Error(concat("gnuplot wrote no SVG to '", path.string(), "'"));
  std::string element = svg.substr(start);
  for (const char* quote : {"\"", "'"}) {
    replace_all(element, concat(" id=", quote), concat(" id=", quote, prefix, "-"));
    replace_all(element, concat("href=", quote, "#"), concat("href=", quote, "#", prefix, "-"));  // href, xlink:href
  }
  replace_all(element, "url(#", concat("url(#", prefix, "-"));
  return element;
}

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file.is_open()) throw Error(concat("gnuplot wrote no '", path.string(), "'"));
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

std::string html_table(const std::vector<std::vector<std::string>>& rows) {
  std::string html = "<table>\n";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const char* cell = r == 0 ? "th" : "td";
    html += "<tr>";
    for (const std::string& text : rows[r]) html += concat("<", cell, ">", html_escape(text), "</", cell, ">");
    html += "</tr>\n";
  }
  return html + "</table>\n";
}

std::string accuracy_cell(const std::optional<double>& fraction) {
  return fraction ? format_number("%.2f%%", *fraction * 100) : std::string("-");
}

std::string summary_section(const ReportInput& input, const std::optional<AccuracyTarget>& target) {
  std::vector<std::string> header = {"method", "samples/s", "iteration ms", "predicted ms", "compute ms",
                                     "comm ms", "exposed wait ms"};
  if (input.compare) header.push_back(concat("speedup vs ", input.speedup_baseline));
  header.insert(header.end(), {"train acc", "test acc", time_to_accuracy_heading(target)});
  std::vector<std::vector<std::string>> rows = {header};
  for (const MethodRun& run : input.runs) {
    std::vector<std::string> row = {run.method,
                                    format_number("%.0f", run.throughput),
                                    milliseconds(run.mean.iteration),
                                    milliseconds(run.predicted_iteration),
                                    milliseconds(run.compute),
                                    milliseconds(run.mean.comm),
                                    milliseconds(run.mean.wait)};
    if (input.compare) row.push_back(run.speedup ? format_number("%.2fx", *run.speedup) : std::string("-"));
    const std::optional<double> reached = target ? time_to_accuracy(run.metrics.epochs, *target) : std::nullopt;
    row.insert(row.end(), {accuracy_cell(run.final_train_accuracy), accuracy_cell(run.final_test_accuracy),
                           time_to_accuracy_cell(reached)});
    rows.push_back(std::move(row));
  }
  std::string html = "<h2>Summary</h2>\n" + html_table(rows);
  html += "<p>Times are means per iteration over the workers and the measured iterations; compute is the compute "
          "thread's busy time (iteration - exposed wait), as train and compare print it; throughput is samples per "
          "second over all workers";
  if (input.compare) html += concat("; speedup is throughput relative to ", html_escape(input.speedup_baseline));
  html += ". ";
  if (target) {
    const std::string origin = target->given    ? "given by --target-accuracy"
                               : input.compare ? "the best accuracy every method reached"
                                               : "the best accuracy the run reached";
    html += concat("Time to target: the training time elapsed (evaluation excluded) at the end of the first epoch whose ",
                   accuracy_kind_name(target->kind), " accuracy reached ",
                   format_number("%.2f%%", target->accuracy * 100), " (", origin, "); - if it never did.");
  } else {
    html += "Time to target: no accuracy was recorded by every run.";
  }
  return html + "</p>\n";
}

// `--algo auto`'s runs: each phase (from which iteration, which method and why, predicted and
// measured iteration) and what choosing cost. Empty if no run is auto's.
std::string auto_section(const ReportInput& input) {
  std::string html;
  const auto cost = [](double seconds, const std::optional<double>& fraction) {
    return concat(format_number("%.3f", seconds), " s", fraction ? format_number(" (%.2f%% of the run)", 100 * *fraction) : "");
  };
  for (const MethodRun& run : input.runs) {
    if (!run.auto_phases) continue;
    const AutoRecord& record = *run.auto_phases;
    std::vector<std::vector<std::string>> rows = {
        {"from iteration", "method", "phase", "predicted ms", "measured ms", "why"}};
    for (const AutoPhaseRecord& phase : record.phases) {
      const auto ms_or_dash = [](const std::optional<double>& seconds) {
        return seconds ? milliseconds(*seconds) : std::string("-");
      };
      rows.push_back({std::to_string(phase.start_iteration), phase.method, phase.kind,
                      ms_or_dash(phase.predicted_iteration), ms_or_dash(phase.measured_iteration), phase.why});
    }
    html += concat("<h2>", html_escape(run.method), ": auto's phases (policy ", html_escape(record.policy), ")</h2>\n",
                   "<div class=\"phases\">\n", html_table(rows), "</div>\n");
    html += concat("<p>Start-up cost (the profiling and trials before the first choice, each iteration less one of "
                   "the method chosen): ",
                   cost(record.startup_cost, record.startup_cost_fraction),
                   "; every profiling and trial of the run: ", cost(record.profiling_cost, record.profiling_cost_fraction),
                   ".</p>\n");
  }
  return html;
}

std::string run_title(const ReportInput& input) {
  std::vector<std::string> methods;
  for (const MethodRun& run : input.runs) methods.push_back(run.method);
  return concat(input.compare ? "compare of " : "train run of ", join(methods));
}

}  // namespace

std::optional<AccuracyTarget> report_accuracy_target(const ReportInput& input, std::optional<double> requested) {
  if (!requested && input.recorded_target) return input.recorded_target;
  std::vector<std::span<const EpochRecord>> runs;
  for (const MethodRun& run : input.runs) runs.emplace_back(run.metrics.epochs);
  return choose_accuracy_target(runs, requested);
}

std::string render_html_report(const ReportInput& input, const std::optional<AccuracyTarget>& target,
                               const std::string& source) {
  PIPESGD_ASSERT(!input.runs.empty());
  const std::optional<std::filesystem::path> gnuplot = find_program("gnuplot");
  if (!gnuplot) throw Error(kGnuplotMissing);
  ScratchDirectory scratch;
  PlotScript script(scratch.path());
  std::vector<Section> sections = {loss_section(input, script), accuracy_section(input, target, script),
                                   time_section(input, script)};
  if (!input.timelines.empty()) sections.push_back(timeline_section(input, script));
  const std::filesystem::path script_path = scratch.path() / "report.gp";
  {
    std::ofstream file(script_path);
    file << script.script();
    file.close();
    if (!file) throw DataError(concat("cannot write '", script_path.string(), "' (", std::strerror(errno), ")"));
  }
  const ProgramResult result =
      run_program({gnuplot->string(), script_path.string()}, std::chrono::duration_cast<std::chrono::milliseconds>(kGnuplotTimeout));
  if (!result.succeeded()) throw Error(describe_program_failure("gnuplot", result));

  const std::string title = concat("pipesgd report: ", run_title(input));
  std::string html = concat("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>",
                            html_escape(title), "</title>\n");
  html += "<style>\n"
          "body { font-family: sans-serif; color: #222; max-width: 1100px; margin: 1.5em auto; padding: 0 1em; }\n"
          "table { border-collapse: collapse; margin: 0.5em 0; }\n"
          "th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }\n"
          "th:first-child, td:first-child { text-align: left; }\n"
          "th { background: #f2f2f2; }\n"
          ".phases td { text-align: left; }\n"
          "figure { margin: 1.2em 0; }\n"
          "figure svg { display: block; max-width: 100%; height: auto; }\n"
          "figcaption { font-size: 0.9em; color: #444; max-width: 900px; }\n"
          "</style>\n</head>\n<body>\n";
  html += concat("<h1>", html_escape(title), "</h1>\n");
  html += concat("<p>Model ", html_escape(input.model), ", ", input.workers, " workers x batch ", input.batch_per_worker,
                 ", network ", html_escape(input.network), ". From <code>", html_escape(source), "</code>.</p>\n");
  html += summary_section(input, target);
  html += auto_section(input);
  for (const Section& section : sections) {
    html += concat("<h2>", html_escape(section.heading), "</h2>\n", section.text);
    for (const Figure& figure : section.figures) {
      const std::filesystem::path svg_path = scratch.path() / (figure.name + ".svg");
      html += concat("<figure id=\"", figure.name, "\">\n", inline_svg(read_text_file(svg_path), figure.name, svg_path),
                     "\n<figcaption>", html_escape(figure.caption), "</figcaption>\n</figure>\n");
    }
  }
  return html + "</body>\n</html>\n";
}

void write_html_report(const std::filesystem::path& dir, const std::filesystem::path& out,
                       std::optional<double> requested_target, const std::optional<std::filesystem::path>& trace) {
  ReportInput input = read_report_input(dir);
  if (trace) input.timelines = read_trace_timelines(*trace);
  const std::string html = render_html_report(input, report_accuracy_target(input, requested_target), dir.string());
  write_file_atomically(out, html, "report");
}

}  // namespace pipesgd
