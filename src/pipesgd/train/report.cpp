#include "pipesgd/train/report.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

nlohmann::json times_to_json(const IterationTimes& t) {
  return {{"update_s", t.update},   {"data_s", t.data},       {"forward_s", t.forward},
          {"backward_s", t.backward},
          {"wait_s", t.wait},       {"comm_s", t.comm},       {"iteration_s", t.iteration},
          {"loss", t.loss}};
}

nlohmann::json epoch_to_json(const EpochRecord& e) {
  return {{"epoch", e.epoch},           {"iterations", e.iterations},
          {"train_loss", e.train_loss}, {"test_accuracy", e.test_accuracy},
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

std::string milliseconds(double seconds) { return format("%.3f", seconds * 1e3); }

std::string accuracy(double fraction) {
  return fraction < 0 ? std::string("-") : format("%.2f%%", fraction * 100);
}

// Prints rows of cells as an aligned table (first column left-aligned, the others right-aligned).
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

}  // namespace

void ensure_directory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error || !std::filesystem::is_directory(dir)) {
    throw UsageError(concat("--out '", dir, "': cannot create directory",
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
          {"final_test_accuracy", s.final_test_accuracy},
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
      {"per iteration (ms)", "update", "data", "forward", "backward", "other", "compute",
       "exposed wait", "comm thread", "iteration", "samples/s"},
      {"measured", milliseconds(s.mean.update), milliseconds(s.mean.data),
       milliseconds(s.mean.forward), milliseconds(s.mean.backward), milliseconds(s.stages.other),
       milliseconds(s.stages.compute()), milliseconds(s.mean.wait), milliseconds(s.mean.comm),
       milliseconds(s.mean.iteration), format("%.0f", s.throughput)}};
  print_table(out, rows);
  out << "compute = the compute thread's busy time (iteration - exposed wait) = update + data + "
         "forward + backward + other (hooks, bookkeeping, descheduling)\n";
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
  out << "This method follows " << (s.predicted_iteration == s.predicted_pipe_iteration &&
                                           s.predicted_pipe_iteration != s.predicted_sync_iteration
                                       ? "Eq. 4"
                                       : "Eq. 2")
      << ". Final test accuracy: " << accuracy(s.final_test_accuracy) << "\n";
}

void print_compare_table(std::ostream& out, const std::vector<RunSummary>& summaries) {
  std::vector<std::vector<std::string>> rows = {
      {"method", "samples/s", "iter ms", "update", "forward", "backward", "compute", "exposed wait",
       "comm", "predicted ms", "test acc", "speedup"}};
  const double base = summaries.empty() ? 0 : summaries.front().throughput;
  for (const RunSummary& s : summaries) {
    rows.push_back({s.method_spec, format("%.0f", s.throughput), milliseconds(s.mean.iteration),
                    milliseconds(s.mean.update), milliseconds(s.mean.forward),
                    milliseconds(s.mean.backward), milliseconds(s.stages.compute()), milliseconds(s.mean.wait),
                    milliseconds(s.mean.comm), milliseconds(s.predicted_iteration),
                    accuracy(s.final_test_accuracy),
                    format("%.2fx", base > 0 ? s.throughput / base : 0)});
  }
  print_table(out, rows);
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
                       {"final_test_accuracy", s.final_test_accuracy},
                       {"speedup", summaries.front().throughput > 0
                                       ? s.throughput / summaries.front().throughput
                                       : 0}});
  }
  open_for_writing(dir + "/compare.json") << records.dump(2) << '\n';
}

}  // namespace pipesgd
