#include "pipesgd/report/report.h"

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <set>

#include "pipesgd/algo/registry.h"
#include "pipesgd/core/json_file.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/interrupt.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/report/short_run.h"
#include "pipesgd/report/metrics_file.h"

namespace pipesgd {
namespace {

// "speedup vs dsync": the speedup column is relative to the first method compared.
std::string speedup_heading(const std::vector<RunSummary>& summaries) {
  return summaries.empty() ? std::string("speedup") : concat("speedup vs ", summaries.front().figures.method_spec);
}

std::string accuracy(double fraction) { return fraction < 0 ? std::string("-") : format_number("%.2f%%", fraction * 100); }

std::optional<double> time_to_target(const RunSummary& summary, const std::optional<AccuracyTarget>& target) {
  return target ? time_to_accuracy(summary.epochs, *target) : std::nullopt;
}

// CPU nanoseconds per allreduced byte, null for a run that allreduced nothing (parameter servers).
nlohmann::json cpu_per_byte_json(const IterationTimes& mean) {
  if (mean.comm_bytes <= 0) return nullptr;
  return mean.comm_cpu_per_byte() * 1e9;
}

// The name of the compute-alone method (MethodTraits::compute_alone: nocomm), for the table's note.
std::string compute_alone_method_name() {
  for (const MethodDescriptor* method : method_registry()) {
    if (method->traits.compute_alone) return method->name;
  }
  PIPESGD_ASSERT(false && "the registry has a compute-alone method");
  return "";
}

// The compute thread's busy time of `run` over that of the compare's compute-alone run
// (MethodTraits::compute_alone), if it has one: how much communication running beside it stretched
// the compute.
std::optional<double> compute_stretch(const RunSummary& run, const std::vector<RunSummary>& summaries) {
  for (const RunSummary& other : summaries) {
    if (!method_of_spec(other.setup.method_spec)->traits.compute_alone) continue;
    const double alone = other.timing.stages.compute();
    if (alone > 0) return run.timing.stages.compute() / alone;
  }
  return std::nullopt;
}

// "0.42", or "-" for a run that allreduced nothing.
std::string cpu_per_byte_cell(const IterationTimes& mean) {
  return mean.comm_bytes > 0 ? format_number("%.2f", mean.comm_cpu_per_byte() * 1e9) : std::string("-");
}

std::string stretch_cell(const RunSummary& run, const std::vector<RunSummary>& summaries) {
  const std::optional<double> stretch = compute_stretch(run, summaries);
  return stretch ? format_number("%.2fx", *stretch) : std::string("-");
}

// A run stopped (by a signal) before its first measured iteration has no timings: its means are
// zeros that measured nothing, never to be shown or written as figures.
bool measured(const RunSummary& s) { return s.timing.measured_iterations > 0; }

// A figure of a measured run, null for one that measured nothing.
nlohmann::json measured_json(const RunSummary& s, const nlohmann::json& value) {
  return measured(s) ? value : nlohmann::json(nullptr);
}

// "interrupted by SIGINT after iteration 3 of 100000"
std::string interruption_phrase(const Interruption& interrupted) {
  return concat("interrupted by ", signal_name(interrupted.signal), " after iteration ", interrupted.at_iteration,
                " of ", interrupted.of_iterations);
}

// The sentence on the method's timing model: which model applies, and whether this run follows it,
// that is whether the measured iteration is within kModelAgreement of the model's prediction.
constexpr double kModelAgreement = 0.15;

std::string timing_model_sentence(const RunSummary& s) {
  const RunFigures& f = s.figures;
  const RunTiming& timing = s.timing;
  const std::string model = f.report->timing_model();
  const bool follows_eq4 = f.predicted_iteration == timing.predicted_pipe_iteration &&
                           timing.predicted_pipe_iteration != timing.predicted_sync_iteration;
  const std::string name = !model.empty() ? model : follows_eq4 ? std::string("Eq. 4") : std::string("Eq. 2");
  std::string sentence = concat("This method's timing model is ", name, "; ");
  if (!measured(s) || f.predicted_iteration <= 0) return sentence + "no measured iterations to compare with it.";
  const double ratio = f.mean.iteration / f.predicted_iteration;
  const std::string tolerance = format_number("%.0f%%", kModelAgreement * 100);
  if (ratio >= 1 - kModelAgreement && ratio <= 1 + kModelAgreement) {
    return concat(sentence, "the run follows it: measured ", format_number("%.2f", ratio), "x its prediction (within ",
                  tolerance, ").");
  }
  return concat(sentence, "the run does not follow it: measured ", format_number("%.2f", ratio), "x the ", name,
                " prediction (more than ", tolerance, " off).");
}

// The accuracies the run measured: those of its last epoch record (the evaluation at an epoch's
// end, or at the run's end when --iters ends it inside an epoch), none if no epoch ended.
std::string accuracy_sentence(const RunSummary& s) {
  const RunFigures& f = s.figures;
  if (s.epochs.empty()) {
    return s.interrupted ? " Accuracy: not measured (interrupted before the first epoch ended)."
                         : " Accuracy: not measured (no epoch ended).";
  }
  const std::string values =
      concat("train accuracy: ", accuracy(f.final_train_accuracy), ", test accuracy: ", accuracy(f.final_test_accuracy));
  if (s.interrupted) {
    return concat(" At the end of epoch ", s.epochs.back().epoch, ", the last before the interrupt, ", values, ".");
  }
  return concat(" Final ", values, ".");
}

// The measured stage times and the Pipe-SGD timing models' predictions from them.
void print_run_timings(std::ostream& out, const RunSummary& s) {
  const RunFigures& f = s.figures;
  const RunTiming& timing = s.timing;
  const IterationTimes& m = f.mean;
  std::vector<std::vector<std::string>> rows = {
      {"per iteration (ms)", "update", "compensation", "data", "forward", "backward", "other", "compute",
       "exposed wait", "comm thread", "iteration", "samples/s", "comm CPU ns/B"},
      {"measured", milliseconds(m.update), milliseconds(m.compensation), milliseconds(m.data), milliseconds(m.forward),
       milliseconds(m.backward), milliseconds(timing.stages.other), milliseconds(timing.stages.compute()),
       milliseconds(m.wait), milliseconds(m.comm), milliseconds(m.iteration), format_number("%.0f", f.throughput),
       cpu_per_byte_cell(m)}};
  print_table(out, rows);
  out << "compute = the compute thread's busy time (iteration - exposed wait) = update + compensation + "
         "data + forward + backward + other (hooks, bookkeeping, descheduling); comm CPU ns/B = the gradient "
         "allreduces' CPU time on the threads that ran them (their CPU clocks) per allreduced fp32 byte\n";
  out << "\nPipe-SGD timing model from the measured stage times (l_up + l_comp = compute = "
      << milliseconds(timing.stages.compute()) << " ms, l_comm = comm thread = " << milliseconds(timing.stages.comm)
      << " ms):\n";
  auto ratio = [&](double predicted) { return format_number("%.3f", predicted > 0 ? m.iteration / predicted : 0); };
  std::vector<std::vector<std::string>> model_rows = {
      {"model", "predicted ms", "measured ms", "measured / predicted"},
      {"Eq. 2 (D-Sync: up + comp + comm)", milliseconds(timing.predicted_sync_iteration), milliseconds(m.iteration),
       ratio(timing.predicted_sync_iteration)},
      {"Eq. 4 (Pipe-SGD: max(up + comp, comm))", milliseconds(timing.predicted_pipe_iteration),
       milliseconds(m.iteration), ratio(timing.predicted_pipe_iteration)}};
  if (!timing.link_model_source.empty()) {
    model_rows.push_back({"Eq. 5 (Pipe-SGD, sequential comm: max(up + comp, Eq. 5 comm))",
                          milliseconds(timing.predicted_pipe_sequential_iteration), milliseconds(m.iteration),
                          ratio(timing.predicted_pipe_sequential_iteration)});
  }
  print_table(out, model_rows);
  if (!timing.link_model_source.empty()) {
    out << "Eq. 5 comm term (alpha " << timing.link_model.alpha * 1e6 << " us, beta " << timing.link_model.beta * 1e9
        << " ns/byte, gamma " << timing.link_model.gamma * 1e9 << " ns/byte, S = 0; " << timing.link_model_source
        << "): " << milliseconds(timing.link_model_comm) << " ms per allreduce\n";
  }
  out << "Eq. 7 scaling efficiency (up + comp) / max(up + comp, comm) = "
      << format_number("%.3f", timing.scaling_efficiency) << "\n";
}

}  // namespace

std::optional<AccuracyTarget> compare_accuracy_target(const std::vector<RunSummary>& summaries,
                                                      std::optional<double> requested) {
  std::vector<std::span<const EpochRecord>> runs;
  for (const RunSummary& summary : summaries) runs.emplace_back(summary.epochs);
  return choose_accuracy_target(runs, requested);
}

// summary.json's "recoveries" (--restarts): each failure, and the iterations redone and seconds lost.
nlohmann::json recoveries_to_json(const std::vector<Recovery>& recoveries) {
  nlohmann::json list = nlohmann::json::array();
  auto seconds = [](double value) { return value < 0 ? nlohmann::json(nullptr) : nlohmann::json(value); };
  double lost = 0;
  std::int64_t redone = 0;
  for (const Recovery& recovery : recoveries) {
    list.push_back({{"attempt", recovery.attempt},
                    {"failure", recovery.failure},
                    {"reached_iteration", recovery.reached},
                    {"rolled_back_to", recovery.rolled_back_to < 0 ? nlohmann::json(nullptr)
                                                                   : nlohmann::json(recovery.rolled_back_to)},
                    {"iterations_redone", recovery.iterations_redone()},
                    {"detection_s", seconds(recovery.detection_seconds)},
                    {"recovery_s", seconds(recovery.recovery_seconds)},
                    {"seconds_lost", seconds(recovery.seconds_lost)},
                    {"failed_at_unix_s", recovery.failed_at_unix_s},
                    {"resumed_at_unix_s", recovery.resumed_at_unix_s}});
    lost += std::max(0.0, recovery.seconds_lost);
    redone += recovery.iterations_redone();
  }
  return {{"count", recoveries.size()}, {"iterations_redone", redone}, {"seconds_lost", lost}, {"failures", list}};
}

nlohmann::json summary_to_json(const RunSummary& s) {
  nlohmann::json epochs = nlohmann::json::array();
  for (const EpochRecord& e : s.epochs) epochs.push_back(epoch_to_json(e));
  const RunFigures& f = s.figures;
  nlohmann::json json = {{"method", s.setup.method_spec},
                         {"model", s.setup.model},
                         {"workers", s.setup.workers},
                         {"servers", s.setup.servers},
                         {"batch_per_worker", s.setup.batch},
                         {"network", s.setup.network},
                         {"codec", s.setup.codec},
                         {"allreduce_segments", s.setup.segmenting},
                         {"allreduce", s.setup.allreduce},
                         {"staleness_k", s.setup.staleness},
                         {"bucket_plan", f.report->bucket_plan()},
                         {"allreduce_calls_per_iteration", f.report->allreduce_calls()},
                         {"iterations", s.timing.iterations},
                         {"interrupted", interruption_to_json(s.interrupted)},
                         {"timing_iterations", {s.timing.first_timed, s.timing.iterations}},
                         {"measured_iterations", s.timing.measured_iterations},
                         {"mean", measured_json(s, times_to_json(f.mean))},
                         {"compute_s", measured_json(s, s.timing.stages.compute())},
                         {"other_compute_thread_s", measured_json(s, s.timing.stages.other)},
                         {"throughput_samples_per_s", measured_json(s, f.throughput)},
                         {"iteration_s", measured_json(s, f.mean.iteration)},
                         {"train_s", s.timing.train_seconds},
                         {"predicted_iteration_s", measured_json(s, f.predicted_iteration)},
                         {"predicted_dsync_eq2_s", measured_json(s, s.timing.predicted_sync_iteration)},
                         {"predicted_pipe_eq4_s", measured_json(s, s.timing.predicted_pipe_iteration)},
                         {"link_model_comm_eq5_s", s.timing.link_model_comm},
                         {"link_model_gamma_s_per_byte", s.timing.link_model.gamma},
                         {"predicted_pipe_eq5_s", s.timing.predicted_pipe_sequential_iteration},
                         {"scaling_efficiency_eq7", measured_json(s, s.timing.scaling_efficiency)},
                         {"bytes_sent_per_iteration", s.timing.bytes_sent_per_iteration},
                         {"comm_cpu_ns_per_byte", measured_json(s, cpu_per_byte_json(f.mean))},
                         {"weights_checksum", concat(std::hex, s.weights_checksum)},
                         {"nonfinite_gradients_skipped", s.reliability.nonfinite_skipped},
                         {"consistency_checks_passed", s.reliability.consistency_checks},
                         {"resumed_from_iteration", s.reliability.resumed_from},
                         {"resumed_from_workers", s.reliability.resumed_from_workers > 0
                                                      ? nlohmann::json(s.reliability.resumed_from_workers)
                                                      : nlohmann::json(nullptr)},
                         {"learning_rate_scale", s.reliability.learning_rate_scale},
                         {"recoveries", recoveries_to_json(s.recoveries)},
                         {"final_train_accuracy", f.final_train_accuracy < 0 ? nlohmann::json(nullptr) : nlohmann::json(f.final_train_accuracy)},
                         {"final_test_accuracy", f.final_test_accuracy < 0 ? nlohmann::json(nullptr) : nlohmann::json(f.final_test_accuracy)},
                         {"epochs", epochs},
                         {"configuration", s.configuration}};
  json["unreached_phase"] = unreached_phase_json(s.unreached_phase);
  f.report->add_json(json, f);
  return json;
}

nlohmann::json interruption_to_json(const std::optional<Interruption>& interrupted) {
  if (!interrupted) return nullptr;
  return {{"signal", signal_name(interrupted->signal)},
          {"at_iteration", interrupted->at_iteration},
          {"of_iterations", interrupted->of_iterations},
          {"workers_reported", interrupted->workers_reported}};
}

void write_summary_file(const std::string& dir, const RunSummary& summary) {
  // A run stopped by a signal may be killed soon (mpirun: 1 s after its SIGTERM): no disk wait.
  write_json_file(std::filesystem::path(dir) / "summary.json", summary_to_json(summary), "summary",
                        summary.interrupted ? AtomicWrite::kProcessCrash : AtomicWrite::kDurable);
}

void print_run_report(std::ostream& out, const RunSummary& s) {
  const RunSetup& setup = s.setup;
  const RunFigures& f = s.figures;
  const RunTiming& timing = s.timing;
  out << "\n" << setup.method_spec << ": " << setup.model << ", " << setup.workers << " workers";
  if (setup.servers > 0) out << " + " << setup.servers << (setup.servers == 1 ? " server" : " servers");
  out << " x batch " << setup.batch << ", codec " << setup.codec;
  if (setup.servers > 0) {
    out << ", parameter server";
  } else {
    out << ", allreduce " << setup.allreduce << " (segments " << setup.segmenting << ")";
  }
  if (setup.lr_schedule != "constant") out << ", lr schedule " << setup.lr_schedule;
  out << ", network " << setup.network << ", " << timing.iterations << " iterations (means over the last "
      << timing.measured_iterations << ")\n\n";
  if (s.unreached_phase) out << "Short run: " << describe_short_run(*s.unreached_phase, timing.iterations) << ".\n\n";
  if (measured(s)) {
    print_run_timings(out, s);
  } else {
    out << "No timings: the run stopped after " << timing.iterations
        << " iterations, before its first measured iteration (the means leave out the start-up).\n";
  }
  f.report->print(out, f);
  out << timing_model_sentence(s);
  if (!s.recoveries.empty()) {
    std::int64_t redone = 0;
    double lost = 0;
    for (const Recovery& recovery : s.recoveries) {
      redone += recovery.iterations_redone();
      lost += std::max(0.0, recovery.seconds_lost);
    }
    out << " Recovered from " << s.recoveries.size() << (s.recoveries.size() == 1 ? " failure" : " failures")
        << " by rolling back to a commit: " << redone << " iterations redone, " << std::fixed << std::setprecision(1)
        << lost << " s lost (each iteration is counted once above).";
  } else if (s.reliability.resumed_from >= 0) {
    out << " Resumed at iteration " << s.reliability.resumed_from << " from its checkpoint.";
  }
  if (s.reliability.resumed_from_workers > 0) {
    out << concat(" Continued a commit of ", s.reliability.resumed_from_workers, " workers with ", s.setup.workers,
                  "; the learning rate is x", std::setprecision(4), s.reliability.learning_rate_scale,
                  " of the configured (it follows the global batch).");
  }
  if (s.interrupted) {
    out << " Interrupted by " << signal_name(s.interrupted->signal) << " after iteration " << s.interrupted->at_iteration
        << " of " << s.interrupted->of_iterations << ".";
  }
  if (s.reliability.consistency_checks > 0) {
    out << " Replica consistency: " << s.reliability.consistency_checks << " checks, every replica identical.";
  }
  if (s.reliability.nonfinite_skipped > 0) {
    out << " Non-finite gradients skipped (layers zeroed): " << s.reliability.nonfinite_skipped << ".";
  }
  out << accuracy_sentence(s) << "\n";
}

void print_compare_table(std::ostream& out, const std::vector<RunSummary>& summaries,
                         std::optional<double> requested_target, bool wide) {
  const std::optional<AccuracyTarget> target = compare_accuracy_target(summaries, requested_target);
  std::vector<std::vector<std::string>> rows = {{"method", "samples/s", "iter ms", "update", "comp", "forward",
                                                 "backward", "compute", "stretch", "exposed wait", "comm",
                                                 "comm CPU ns/B", "predicted ms",
                                                 "train acc", "test acc", time_to_accuracy_heading(target),
                                                 speedup_heading(summaries)}};
  const double base = summaries.empty() ? 0 : summaries.front().figures.throughput;
  std::vector<RunFigures> runs;
  for (const RunSummary& s : summaries) {
    const RunFigures& f = s.figures;
    const IterationTimes& m = f.mean;
    if (!measured(s)) {  // stopped before its first measured iteration: no figures, not zeros
      std::vector<std::string> row(rows.front().size(), "-");
      row.front() = f.method_spec;
      row[1] = s.interrupted ? "interrupted" : "not measured";
      rows.push_back(row);
      continue;
    }
    rows.push_back({f.method_spec, format_number("%.0f", f.throughput), milliseconds(m.iteration),
                    milliseconds(m.update), milliseconds(m.compensation), milliseconds(m.forward),
                    milliseconds(m.backward), milliseconds(s.timing.stages.compute()), stretch_cell(s, summaries),
                    milliseconds(m.wait), milliseconds(m.comm), cpu_per_byte_cell(m), milliseconds(f.predicted_iteration), accuracy(f.final_train_accuracy),
                    accuracy(f.final_test_accuracy), time_to_accuracy_cell(time_to_target(s, target)),
                    base > 0 ? format_number("%.2fx", f.throughput / base) : std::string("-")});
    runs.push_back(f);
  }
  if (wide) {
    print_table(out, rows);
    out << "stretch = compute over that of " << compute_alone_method_name()
        << " (compute alone) in this compare (\"-\" without it); comm CPU ns/B = "
           "the gradient allreduces' CPU time on the threads that ran them per allreduced fp32 byte\n";
  } else {
    // The accuracy of the target's kind (test, or train when no run was evaluated).
    const bool evaluated = std::any_of(summaries.begin(), summaries.end(),
                                       [](const RunSummary& s) { return s.figures.final_test_accuracy >= 0; });
    print_table(out, select_columns(rows, {"method", "samples/s", "iter ms", "exposed wait",
                                           evaluated ? "test acc" : "train acc", rows.front()[rows.front().size() - 2],
                                           rows.front().back()}));
    out << "(more columns with --wide: stage times, comm, stretch, comm CPU ns/B, prediction, both accuracies)\n";
  }
  print_short_runs(out, summaries);
  for (const RunSummary& s : summaries) {
    if (!s.interrupted) continue;
    out << s.setup.method_spec << ": " << interruption_phrase(*s.interrupted)
        << (measured(s) ? "; its figures cover the iterations it ran"
                        : ", before its first measured iteration: no figures")
        << (s.epochs.empty() ? ", no accuracy (no epoch ended)" : "") << ".\n";
  }
  // The tables of the compared methods' families, each once, in registry order.
  std::set<std::string> printed;
  for (const MethodDescriptor* method : method_registry()) {
    const bool compared = std::any_of(summaries.begin(), summaries.end(), [&](const RunSummary& s) {
      return method_of_spec(s.setup.method_spec) == method;
    });
    if (!compared) continue;
    for (const ComparisonTable& table : method->tables) {
      if (printed.insert(table.id).second) table.print(out, runs);
    }
  }
}

void write_compare_outputs(const std::string& dir, const std::vector<RunSummary>& summaries,
                           std::optional<double> requested_target) {
  const std::optional<AccuracyTarget> target = compare_accuracy_target(summaries, requested_target);
  nlohmann::json records = nlohmann::json::array();
  const double base = summaries.empty() ? 0 : summaries.front().figures.throughput;
  for (const RunSummary& s : summaries) {
    const RunFigures& f = s.figures;
    nlohmann::json record = {{"method", f.method_spec},
                             {"throughput_samples_per_s", measured_json(s, f.throughput)},
                             {"iteration_s", measured_json(s, f.mean.iteration)},
                             {"breakdown", measured_json(s, times_to_json(f.mean))},
                             {"compute_s", measured_json(s, s.timing.stages.compute())},
                             {"compute_stretch", nullptr},
                             {"comm_cpu_ns_per_byte", measured_json(s, cpu_per_byte_json(f.mean))},
                             {"predicted_iteration_s", measured_json(s, f.predicted_iteration)},
                             {"final_train_accuracy", f.final_train_accuracy < 0 ? nlohmann::json(nullptr) : nlohmann::json(f.final_train_accuracy)},
                             {"final_test_accuracy", f.final_test_accuracy < 0 ? nlohmann::json(nullptr) : nlohmann::json(f.final_test_accuracy)},
                             {"bucket_plan", f.report->bucket_plan()},
                             {"allreduce_calls_per_iteration", f.report->allreduce_calls()},
                             {"speedup", base > 0 && measured(s) ? nlohmann::json(f.throughput / base) : nlohmann::json(nullptr)},
                             {"speedup_baseline", summaries.front().figures.method_spec},
                             {"target_accuracy", accuracy_target_to_json(target)},
                             {"time_to_target_accuracy_s", nullptr},
                             {"unreached_phase", unreached_phase_json(s.unreached_phase)},
                             {"interrupted", interruption_to_json(s.interrupted)}};
    if (const std::optional<double> seconds = time_to_target(s, target)) record["time_to_target_accuracy_s"] = *seconds;
    if (const std::optional<double> stretch = compute_stretch(s, summaries)) record["compute_stretch"] = *stretch;
    f.report->add_json(record, f);
    records.push_back(record);
  }
  write_json_file(std::filesystem::path(dir) / "compare.json", records, "compare");
}

}  // namespace pipesgd
