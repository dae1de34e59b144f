#include "pipesgd/train/report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

nlohmann::json times_to_json(const IterationTimes& t) {
  return {{"update_s", t.update},   {"compensation_s", t.compensation}, {"data_s", t.data},       {"forward_s", t.forward},
          {"backward_s", t.backward},
          {"wait_s", t.wait},       {"comm_s", t.comm},       {"iteration_s", t.iteration}, {"checkpoint_s", t.checkpoint},
          {"loss", t.loss}};
}

nlohmann::json epoch_to_json(const EpochRecord& e) {
  return {{"epoch", e.epoch},           {"iterations", e.iterations},
          {"train_loss", e.train_loss}, {"train_accuracy", e.train_accuracy},
          {"test_accuracy", e.test_accuracy},
          {"test_loss", e.test_loss},   {"elapsed_s", e.elapsed_seconds}};
}

std::ofstream open_for_writing(const std::string& path) {
  std::ofstream out(path);
  if (!out) throw UsageError(concat("cannot write '", path, "'"));
  return out;
}

std::string format(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

std::string accuracy(double fraction) {
  return fraction < 0 ? std::string("-") : format("%.2f%%", fraction * 100);
}


nlohmann::json od_sgd_to_json(const std::optional<OdSgdReport>& report) {
  if (!report) return nullptr;
  return {{"sync_iterations_measured", report->sync_iterations},
          {"t_org_measured_s", report->sync_iteration},
          {"t_cop_s", report->times.compute},
          {"t_com_s", report->times.communication},
          {"t_com_sync_s", report->times.sync_communication},
          {"t_new_predicted_eq2_s", report->predicted_iteration},
          {"t_new_overlap_bound_s", report->overlap_bound},
          {"improvement_rate_predicted_eq3", report->predicted_improvement},
          {"improvement_rate_measured", report->measured_improvement}};
}

std::string percent(double fraction) { return format("%.1f%%", fraction * 100); }

nlohmann::json sapipe_to_json(const std::optional<SapipeReport>& report) {
  if (!report) return nullptr;
  nlohmann::json json = {{"layers", report->layers},
                         {"stale_layers", report->stale_layers},
                         {"stale_fraction", report->stale_fraction},
                         {"stale_layers_automatic", report->automatic},
                         {"compensation", report->compensation},
                         {"bounded_compensations", report->bounded_compensations},
                         {"pipeline_start_iteration", report->pipeline_start}};
  if (report->profiled) {
    json["paper_program_stale_layers"] =
        report->paper_stale_layers ? nlohmann::json(*report->paper_stale_layers) : nlohmann::json(nullptr);
    json["predicted_iteration_s"] = report->predicted_iteration;
    json["predicted_stall"] = report->predicted_stall;
    json["forward_s"] = report->profile.forward_seconds;
    json["backward_s"] = report->profile.backward_seconds;
    json["cost_a_s"] = report->cost.a;
    json["cost_b_s_per_byte"] = report->cost.b;
    json["timeline_stale_layers"] = report->timeline_stale_layers;
    nlohmann::json checks = nlohmann::json::array();
    for (const StallCheck& c : report->stall_checks) {
      checks.push_back({{"iteration", c.iteration},
                        {"stale_layers", c.stale_layers},
                        {"stall_fraction", c.stall_fraction},
                        {"cost_scale", c.cost_scale},
                        {"next_stale_layers", c.next_stale_layers}});
    }
    json["stall_checks"] = checks;
  }
  return json;
}

// The sapipe partition in one line.
std::string describe_sapipe(const SapipeReport& r) {
  std::string text = concat("k = ", r.stale_layers, " of ", r.layers, " layers stale, kappa = ",
                            percent(r.stale_fraction), " of the parameters (");
  if (r.automatic) {
    text += "auto: the least k whose simulated pipeline does not stall";
    if (r.predicted_stall) text += "; none hides the communication, so every layer is stale";
    if (r.profiled) {
      text += r.paper_stale_layers ? concat("; the paper's program gives k = ", *r.paper_stale_layers)
                                   : std::string("; the paper's program has no solution");
    }
    if (!r.stall_checks.empty()) {
      text += concat("; the timeline gave k = ", r.timeline_stale_layers, ", then measured:");
      for (const StallCheck& check : r.stall_checks) {
        text += concat(" k = ", check.stale_layers, " waited ", percent(check.stall_fraction),
                       check.next_stale_layers != check.stale_layers
                           ? concat(" -> k = ", check.next_stale_layers, " (cost x", format("%.2f", check.cost_scale), ")")
                           : std::string(" (kept)"),
                       ";");
      }
      text.pop_back();
    }
  } else {
    text += "--stale-layers";
  }
  text += concat("), compensation ", r.compensation);
  if (r.bounded_compensations > 0) {
    text += concat(" (DC scalar bounded by Theorem 3's condition in ", r.bounded_compensations, " updates)");
  }
  return text + concat(", pipelined from iteration ", r.pipeline_start);
}

// OD-SGD Eq. 1-3 beside the measurement (odsgd runs).
void print_od_sgd_model(std::ostream& out, const RunSummary& s) {
  const OdSgdReport& r = *s.od_sgd;
  out << "\nOD-SGD timing model (od-sgd.txt Eq. 1-3): T_cop = compute thread busy = "
      << milliseconds(r.times.compute) << " ms, T_com = push + pull on the comm thread = "
      << milliseconds(r.times.communication) << " ms";
  if (r.sync_iterations <= 0) {
    out << "\nT_org and T'_com are measured on the synchronous warm-up iterations, and this run had "
           "too few: give --warmup-iters 20 or more to see the improvement rate. Eq. 2 predicts T_new = "
        << milliseconds(r.predicted_iteration) << " ms, measured " << milliseconds(s.mean.iteration)
        << " ms\n";
    return;
  }
  out << ", T'_com = SSGD push + pull in the " << r.sync_iterations
      << " measured warm-up iterations = " << milliseconds(r.times.sync_communication) << " ms\n";
  std::vector<std::vector<std::string>> rows = {
      {"", "T_org (SSGD) ms", "T_new (OD-SGD) ms", "improvement rate"},
      {"predicted (Eq. 2, 3)", milliseconds(sync_ps_iteration_time(r.times)),
       milliseconds(r.predicted_iteration), percent(r.predicted_improvement)},
      {"max(T_cop, T_com)", milliseconds(sync_ps_iteration_time(r.times)),
       milliseconds(r.overlap_bound),
       percent(1 - r.overlap_bound / sync_ps_iteration_time(r.times))},
      {"measured", milliseconds(r.sync_iteration), milliseconds(s.mean.iteration),
       percent(r.measured_improvement)}};
  print_table(out, rows);
  out << "(Eq. 2 averages two adjacent iterations when T_com > T_cop; here the next push waits for "
         "the previous pull, as the paper's comm_buf_ dependency (Fig. 8), so an iteration takes "
         "max(T_cop, T_com).)\n";
}

}  // namespace

std::string milliseconds(double seconds) { return format("%.3f", seconds * 1e3); }

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (std::size_t c = 0; c < rows[r].size(); ++c) {
      const std::string& cell = rows[r][c];
      const std::string pad(widths[c] - cell.size(), ' ');
      line += c == 0 ? cell + pad : "  " + pad + cell;
    }
    out << line << '\n';
    if (r == 0) {
      std::size_t total = 0;
      for (std::size_t w : widths) total += w + 2;
      out << std::string(total - 2, '-') << '\n';
    }
  }
}

void ensure_directory(const std::string& dir, const std::string& flag) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    throw UsageError(concat(flag, " '", dir, "': cannot create directory",
                            error ? concat(" (", error.message(), ")") : std::string()));
  }
}

nlohmann::json summary_to_json(const RunSummary& s) {
  nlohmann::json epochs = nlohmann::json::array();
  for (const EpochRecord& e : s.epochs) epochs.push_back(epoch_to_json(e));
  return {{"method", s.method_spec},
          {"model", s.model},
          {"workers", s.workers},
          {"servers", s.servers},
          {"batch_per_worker", s.batch},
          {"network", s.network},
          {"codec", s.codec},
          {"allreduce_segments", s.segmenting},
          {"allreduce", s.allreduce},
          {"staleness_k", s.staleness},
          {"bucket_plan", s.plan},
          {"allreduce_calls_per_iteration", s.allreduce_calls},
          {"non_overlapped_comm_s", s.non_overlapped_comm},
          {"predicted_non_overlapped_comm_s", s.predicted_non_overlapped_comm},
          {"iterations", s.iterations},
          {"measured_iterations", s.measured_iterations},
          {"mean", times_to_json(s.mean)},
          {"compute_s", s.stages.compute()},
          {"other_compute_thread_s", s.stages.other},
          {"throughput_samples_per_s", s.throughput},
          {"iteration_s", s.mean.iteration},
          {"train_s", s.train_seconds},
          {"predicted_iteration_s", s.predicted_iteration},
          {"predicted_dsync_eq2_s", s.predicted_sync_iteration},
          {"predicted_pipe_eq4_s", s.predicted_pipe_iteration},
          {"link_model_comm_eq5_s", s.link_model_comm},
          {"bytes_sent_per_iteration", s.bytes_sent_per_iteration},
          {"weights_checksum", concat(std::hex, s.weights_checksum)},
          {"nonfinite_gradients_skipped", s.nonfinite_skipped},
          {"consistency_checks_passed", s.consistency_checks},
          {"resumed_from_iteration", s.resumed_from},
          {"final_train_accuracy", s.final_train_accuracy},
          {"final_test_accuracy", s.final_test_accuracy},
          {"od_sgd_model", od_sgd_to_json(s.od_sgd)},
          {"sapipe", sapipe_to_json(s.method_report.sapipe)},
          {"epochs", epochs}};
}

void write_run_outputs(const std::string& dir, const RunSummary& summary,
                       const std::vector<std::vector<IterationTimes>>& times_per_rank,
                       std::int64_t iterations_per_epoch) {
  ensure_directory(dir);
  std::ofstream metrics = open_for_writing(dir + "/metrics.jsonl");
  const double ranks = static_cast<double>(times_per_rank.size());
  std::size_t next_epoch = 0;
  for (std::int64_t t = 0; t < summary.iterations; ++t) {
    IterationTimes mean;
    for (const auto& per_rank : times_per_rank) mean.add_scaled(per_rank[t], 1.0 / ranks);
    const bool pipelined = times_per_rank.front()[t].pipelined;
    nlohmann::json record = times_to_json(mean);
    record["type"] = "iteration";
    record["iteration"] = t;
    record["epoch"] = t / iterations_per_epoch + 1;
    record["pipelined"] = pipelined;
    metrics << record.dump() << '\n';
    while (next_epoch < summary.epochs.size() && summary.epochs[next_epoch].iterations == t + 1) {
      nlohmann::json epoch_record = epoch_to_json(summary.epochs[next_epoch++]);
      epoch_record["type"] = "epoch";
      metrics << epoch_record.dump() << '\n';
    }
  }
  open_for_writing(dir + "/summary.json") << summary_to_json(summary).dump(2) << '\n';
}

void print_run_report(std::ostream& out, const RunSummary& s) {
  out << "\n" << s.method_spec << ": " << s.model << ", " << s.workers << " workers";
  if (s.servers > 0) out << " + " << s.servers << (s.servers == 1 ? " server" : " servers");
  out << " x batch " << s.batch << ", codec " << s.codec;
  if (s.servers > 0) {
    out << ", parameter server";
  } else {
    out << ", allreduce " << s.allreduce << " (segments " << s.segmenting << ")";
  }
  out << ", network "
      << s.network << ", " << s.iterations
      << " iterations (means over the last " << s.measured_iterations << ")\n\n";
  std::vector<std::vector<std::string>> rows = {
      {"per iteration (ms)", "update", "compensation", "data", "forward", "backward", "other", "compute",
       "exposed wait", "comm thread", "iteration", "samples/s"},
      {"measured", milliseconds(s.mean.update), milliseconds(s.mean.compensation), milliseconds(s.mean.data),
       milliseconds(s.mean.forward), milliseconds(s.mean.backward), milliseconds(s.stages.other),
       milliseconds(s.stages.compute()), milliseconds(s.mean.wait), milliseconds(s.mean.comm),
       milliseconds(s.mean.iteration), format("%.0f", s.throughput)}};
  print_table(out, rows);
  out << "compute = the compute thread's busy time (iteration - exposed wait) = update + compensation + "
         "data + forward + backward + other (hooks, bookkeeping, descheduling)\n";
  out << "\nPipe-SGD timing model from the measured stage times (l_up + l_comp = compute = "
      << milliseconds(s.stages.compute()) << " ms, l_comm = comm thread = " << milliseconds(s.stages.comm)
      << " ms):\n";
  std::vector<std::vector<std::string>> model_rows = {
      {"model", "predicted ms", "measured ms", "measured / predicted"},
      {"Eq. 2 (D-Sync: up + comp + comm)", milliseconds(s.predicted_sync_iteration),
       milliseconds(s.mean.iteration),
       format("%.3f", s.predicted_sync_iteration > 0 ? s.mean.iteration / s.predicted_sync_iteration : 0)},
      {"Eq. 4 (Pipe-SGD: max(up + comp, comm))", milliseconds(s.predicted_pipe_iteration),
       milliseconds(s.mean.iteration),
       format("%.3f", s.predicted_pipe_iteration > 0 ? s.mean.iteration / s.predicted_pipe_iteration : 0)}};
  print_table(out, model_rows);
  if (s.link_model_comm > 0) {
    out << "Eq. 5 comm term from the emulated link (gamma = 0): " << milliseconds(s.link_model_comm)
        << " ms per allreduce\n";
  }
  if (!s.plan.empty() && !s.method_report.sapipe) {
    out << "\nLayer-wise communication: plan " << s.plan << "; " << s.allreduce_calls
        << " allreduces per iteration. Non-overlapped communication t_c^no (the wait after backward): "
        << milliseconds(s.non_overlapped_comm) << " ms measured, " << milliseconds(s.predicted_non_overlapped_comm)
        << " ms predicted by the plan's timeline (mg-wfbp.txt Eq. 8 / 21); iteration "
        << milliseconds(s.mean.iteration) << " ms measured, " << milliseconds(s.predicted_iteration)
        << " ms predicted.\n";
  }
  if (s.method_report.sapipe) {
    out << "\nSAPipe partial staleness: " << describe_sapipe(*s.method_report.sapipe)
        << ".\nSynchronous layers: " << s.plan << "; " << s.allreduce_calls << " allreduces per iteration.\n";
  }
  if (s.od_sgd) {
    print_od_sgd_model(out, s);
    out << "This method follows OD-SGD's Eq. 2.";
  } else {
    out << "This method follows "
        << (s.predicted_iteration == s.predicted_pipe_iteration &&
                    s.predicted_pipe_iteration != s.predicted_sync_iteration
                ? "Eq. 4"
                : "Eq. 2")
        << ".";
  }
  if (s.resumed_from >= 0) out << " Resumed at iteration " << s.resumed_from << " from its checkpoint.";
  if (s.consistency_checks > 0) {
    out << " Replica consistency: " << s.consistency_checks << " checks, every replica identical.";
  }
  if (s.nonfinite_skipped > 0) {
    out << " Non-finite gradients skipped (layers zeroed): " << s.nonfinite_skipped << ".";
  }
  out << " Final train accuracy: " << accuracy(s.final_train_accuracy)
      << ", test accuracy: " << accuracy(s.final_test_accuracy) << "\n";
}

// sapipe.txt Table 2's form: final test accuracy per method (one run, so no +- column), plus
// throughput, k and kappa, and the best SAPipe variant's gain over Pipe-SGD.
void print_sapipe_table(std::ostream& out, const std::vector<RunSummary>& summaries) {
  const std::string model = summaries.front().model;
  out << "\nModel performance (the form of sapipe.txt Table 2; one run per method):\n";
  std::vector<std::vector<std::string>> table = {
      {"Method", concat("Test Acc (", model, ")"), "Samples/s", "vs pipe", "k", "kappa", "Compensation ms"}};
  double pipe_accuracy = -1, pipe_throughput = 0, best_sapipe = -1;
  for (const RunSummary& s : summaries) {
    if (s.method_spec == "pipe") {
      pipe_accuracy = s.final_test_accuracy;
      pipe_throughput = s.throughput;
    }
    if (s.method_report.sapipe) best_sapipe = std::max(best_sapipe, s.final_test_accuracy);
  }
  for (const RunSummary& s : summaries) {
    const auto& r = s.method_report.sapipe;
    table.push_back({s.method_spec,
                     s.final_test_accuracy < 0 ? std::string("-") : format("%.4f", s.final_test_accuracy),
                     format("%.0f", s.throughput),
                     pipe_throughput > 0 ? format("%.3fx", s.throughput / pipe_throughput) : std::string("-"),
                     r ? concat(r->stale_layers, "/", r->layers) : std::string("-"),
                     r ? percent(r->stale_fraction) : std::string("-"),
                     r ? milliseconds(s.mean.compensation) : std::string("-")});
  }
  if (pipe_accuracy >= 0 && best_sapipe >= 0) {
    table.push_back({"Best SAPipe over pipe", format("%+.2f pt", (best_sapipe - pipe_accuracy) * 100), "", "",
                     "", "", ""});
  }
  print_table(out, table);
  for (const RunSummary& s : summaries) {
    if (s.method_report.sapipe) out << s.method_spec << ": " << describe_sapipe(*s.method_report.sapipe) << "\n";
  }
}

void print_compare_table(std::ostream& out, const std::vector<RunSummary>& summaries) {
  std::vector<std::vector<std::string>> rows = {
      {"method", "samples/s", "iter ms", "update", "comp", "forward", "backward", "compute",
       "exposed wait", "comm", "predicted ms", "train acc", "test acc", "speedup"}};
  const double base = summaries.empty() ? 0 : summaries.front().throughput;
  for (const RunSummary& s : summaries) {
    rows.push_back({s.method_spec, format("%.0f", s.throughput), milliseconds(s.mean.iteration),
                    milliseconds(s.mean.update), milliseconds(s.mean.compensation),
                    milliseconds(s.mean.forward),
                    milliseconds(s.mean.backward), milliseconds(s.stages.compute()), milliseconds(s.mean.wait),
                    milliseconds(s.mean.comm), milliseconds(s.predicted_iteration),
                    accuracy(s.final_train_accuracy), accuracy(s.final_test_accuracy),
                    format("%.2fx", base > 0 ? s.throughput / base : 0)});
  }
  print_table(out, rows);

  bool parameter_server = false;
  for (const RunSummary& s : summaries) parameter_server = parameter_server || s.servers > 0;
  if (parameter_server) {
    // od-sgd.txt Table 1: training speed and accuracy.
    out << "\nTraining speed and accuracy (the form of od-sgd.txt Table 1):\n";
    std::vector<std::vector<std::string>> table = {
        {"Algorithms", "Speed (samples/s)", "Train Acc (%)", "Test Acc (%)"}};
    for (const RunSummary& s : summaries) {
      table.push_back({s.method_spec, format("%.1f", s.throughput),
                       format("%.3f", s.final_train_accuracy * 100),
                       s.final_test_accuracy < 0 ? std::string("-")
                                                 : format("%.3f", s.final_test_accuracy * 100)});
    }
    print_table(out, table);
  }
  bool layer_wise = false;
  // sapipe has a plan for its synchronous layers; its own table below describes it.
  for (const RunSummary& s : summaries) layer_wise = layer_wise || (!s.plan.empty() && !s.method_report.sapipe);
  if (layer_wise) {
    out << "\nLayer-wise communication (mg-wfbp.txt; predicted = the plan's timeline + update from the "
           "run's profile):\n";
    std::vector<std::vector<std::string>> table = {{"method", "allreduces/iter", "iter ms", "predicted ms",
                                                    "measured/predicted", "t_c^no ms", "predicted t_c^no",
                                                    "plan"}};
    for (const RunSummary& s : summaries) {
      if (s.method_report.sapipe) continue;
      table.push_back({s.method_spec, concat(s.allreduce_calls), milliseconds(s.mean.iteration),
                       milliseconds(s.predicted_iteration),
                       format("%.3f", s.predicted_iteration > 0 ? s.mean.iteration / s.predicted_iteration : 0),
                       s.plan.empty() ? std::string("-") : milliseconds(s.non_overlapped_comm),
                       s.plan.empty() ? std::string("-") : milliseconds(s.predicted_non_overlapped_comm),
                       s.plan.empty() ? std::string("(one allreduce after backward)") : s.plan});
    }
    print_table(out, table);
  }
  bool sapipe = false;
  for (const RunSummary& s : summaries) sapipe = sapipe || s.method_report.sapipe.has_value();
  if (sapipe) print_sapipe_table(out, summaries);
  for (const RunSummary& s : summaries) {
    if (!s.od_sgd || s.od_sgd->sync_iterations <= 0) continue;
    out << s.method_spec << ": OD-SGD improvement rate over its synchronous warm-up, predicted (Eq. 3) "
        << percent(s.od_sgd->predicted_improvement) << ", measured "
        << percent(s.od_sgd->measured_improvement) << "\n";
  }
}

void write_compare_outputs(const std::string& dir, const std::vector<RunSummary>& summaries) {
  ensure_directory(dir);
  nlohmann::json records = nlohmann::json::array();
  for (const RunSummary& s : summaries) {
    records.push_back({{"method", s.method_spec},
                       {"throughput_samples_per_s", s.throughput},
                       {"iteration_s", s.mean.iteration},
                       {"breakdown", times_to_json(s.mean)},
                       {"predicted_iteration_s", s.predicted_iteration},
                       {"final_train_accuracy", s.final_train_accuracy},
                       {"final_test_accuracy", s.final_test_accuracy},
                       {"od_sgd_model", od_sgd_to_json(s.od_sgd)},
                       {"sapipe", sapipe_to_json(s.method_report.sapipe)},
                       {"bucket_plan", s.plan},
                       {"allreduce_calls_per_iteration", s.allreduce_calls},
                       {"non_overlapped_comm_s", s.non_overlapped_comm},
                       {"speedup", summaries.front().throughput > 0
                                       ? s.throughput / summaries.front().throughput
                                       : 0}});
  }
  open_for_writing(dir + "/compare.json") << records.dump(2) << '\n';
}

}  // namespace pipesgd
