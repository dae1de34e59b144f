#include "pipesgd/api/api_trace.h"

#include <iostream>
#include <optional>

#include "pipesgd/core/error.h"
#include "pipesgd/report/trace_file.h"
#include "pipesgd/train/worker.h"

namespace pipesgd {
namespace {

constexpr TraceSettingNames kSettingNames{"trace", "trace (the file to write)", "trace_iterations"};

// Each thread's buffer is reserved when the world starts, before the model and the number of steps
// are known: the window's steps (kOpenWindowSteps for a window without an end) at the CLI's
// estimate of a step's events (train/worker.h) for a model of kAssumedLayers layers.
constexpr std::int64_t kOpenWindowSteps = 1000;
constexpr std::size_t kAssumedLayers = 32;

std::size_t events_per_thread(const TraceWindow& window) {
  const std::int64_t steps = window.end == TraceWindow{}.end ? kOpenWindowSteps : window.end - window.first;
  return trace_events_per_thread(TraceWindow{}, steps, kAssumedLayers);
}

}  // namespace

WorldTrace::WorldTrace(const WorldOptions& options) : path_(options.trace) {
  if (const std::optional<TraceWindow> window = check_trace_settings(options.trace, options.trace_iterations, kSettingNames)) {
    recorder_ = std::make_unique<TraceRecorder>(*window, events_per_thread(*window));
  }
}

ThreadTrace* WorldTrace::add_rank(int rank, int workers) {
  if (!recorder_) return nullptr;
  PIPESGD_ASSERT(rank >= 0 && workers >= 1);
  if (rank < workers) return &recorder_->add_thread(rank, concat("worker ", rank), "compute");
  return &recorder_->add_thread(rank, concat("server ", rank - workers), "serve");
}

void WorldTrace::gather(Transport& world, Timeout timeout) {
  if (!recorder_) return;
  PIPESGD_ASSERT(!gathered_);
  gathered_events_ = gather_trace_events(world, *recorder_, timeout);
  gathered_ = true;
  writes_ = world.rank() == 0;
}

void WorldTrace::write() {
  if (!recorder_ || !writes_) return;
  const std::size_t dropped = recorder_->dropped();
  write_trace_file(path_, gathered_ ? std::move(gathered_events_) : recorder_->events_json(), dropped);
  if (dropped > 0) {
    std::cerr << "pipesgd: warning: " << dropped << " trace events did not fit the buffers (" << path_
              << "): narrow trace_iterations\n";
  }
}

void WorldTrace::write_after_failure(int rank, const std::string& failure) noexcept {
  if (!recorder_ || gathered_) return;  // gathered: rank 0 has this rank's events
  const std::string path = failure_trace_path(path_, rank);
  const std::string error = write_trace_after_failure(path, *recorder_, failure);
  try {
    if (error.empty()) {
      std::cerr << "pipesgd: wrote the trace up to the failure to " << path << "\n";
    } else {
      std::cerr << "pipesgd: warning: could not write the trace: " << error << "\n";
    }
  } catch (...) {
    // stderr failed: nothing else to tell.
  }
}

}  // namespace pipesgd
