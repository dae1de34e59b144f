#include "pipesgd/cli/command_trace.h"

#include <iostream>
#include <optional>

#include <nlohmann/json.hpp>

#include "pipesgd/report/trace_file.h"

namespace pipesgd {
namespace {

constexpr int kProcessesPerRun = 10000;  // above any run's ranks (kMaxWorkers plus servers)
// Each thread's buffer is sized by its run (train/worker.h trace_events_per_thread); this is the
// default of threads that do not say.
constexpr std::size_t kDefaultEventsPerThread = 4096;

}  // namespace

CommandTrace::CommandTrace(const std::string& path, const std::string& iterations) : path_(path) {
  if (const std::optional<TraceWindow> window = check_trace_settings(path, iterations)) {
    recorder_ = std::make_unique<TraceRecorder>(*window, kDefaultEventsPerThread);
  }
}

TraceTarget CommandTrace::target(std::size_t index, const std::string& label) {
  TraceTarget target;
  target.recorder = recorder_.get();
  target.first_process = static_cast<int>(index) * kProcessesPerRun;
  target.label = label;
  return target;
}

void CommandTrace::write(MpiSession* session, Timeout timeout) {
  if (!recorder_) return;
  nlohmann::json events = session != nullptr ? gather_trace_events(session->transport, *recorder_, timeout)
                                             : recorder_->events_json();
  if (!prints_results(session)) return;
  const std::size_t dropped = recorder_->dropped();
  write_trace_file(path_, std::move(events), dropped);
  std::cout << "wrote " << path_ << " (open it in https://ui.perfetto.dev)";
  if (dropped > 0) std::cout << "; " << dropped << " events did not fit the buffers: narrow --trace-iters";
  std::cout << "\n";
}

void CommandTrace::write_after_failure(MpiSession* session, const std::string& failure) noexcept {
  if (!recorder_) return;
  const std::string path = failure_trace_path(path_, session == nullptr ? 0 : session->runtime.rank());
  const std::string error = write_trace_after_failure(path, *recorder_, failure);
  if (error.empty()) {
    std::cout << "wrote the trace of the run up to where it stopped to " << path << std::endl;
  } else {
    std::cerr << "pipesgd: warning: could not write the trace: " << error << "\n";
  }
}

}  // namespace pipesgd
