#include "pipesgd/report/trace_timeline.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

constexpr int kWorkersShown = 2;

// The spans a timeline shows: the compute thread's stages (not the per-layer spans inside backward,
// nor the epoch's end) and the comm thread's transfers (not the bucket around them).
bool shown(const std::string& thread, const std::string& name) {
  static const std::set<std::string> compute = {"data", "forward", "backward", "update", "compensation", "wait",
                                                "checkpoint"};
  static const std::set<std::string> comm = {"allreduce", "push", "pull"};
  return thread == "compute" ? compute.count(name) > 0 : comm.count(name) > 0;
}

struct Span {
  int pid;
  int tid;
  std::string name;
  double start_us;
  double end_us;
  std::int64_t iteration;
};

}  // namespace

std::vector<Timeline> read_trace_timelines(const std::filesystem::path& path, std::int64_t iterations) {
  std::ifstream file(path);
  if (!file.is_open()) throw DataError(concat("cannot read the trace '", path.string(), "'"));
  const nlohmann::json trace = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    throw DataError(concat("'", path.string(), "' is not a trace file (no traceEvents array)"));
  }
  // Processes "<label>worker R" and threads by name.
  std::map<int, std::pair<std::string, int>> workers;  // pid -> (run label, worker)
  std::map<std::pair<int, int>, std::string> threads;   // (pid, tid) -> compute | comm (...)
  std::vector<Span> spans;
  for (const nlohmann::json& event : trace["traceEvents"]) {
    const std::string phase = event.value("ph", "");
    if (phase == "M") {
      const std::string name = event.value("name", "");
      const std::string value = event.contains("args") ? event["args"].value("name", "") : "";
      if (name == "process_name") {
        const std::size_t at = value.rfind("worker ");
        if (at != std::string::npos) {
          const std::string label = value.substr(0, at);
          workers[event.value("pid", -1)] = {label.size() >= 2 ? label.substr(0, label.size() - 2) : label,
                                            std::atoi(value.c_str() + at + 7)};
        }
      } else if (name == "thread_name") {
        threads[{event.value("pid", -1), event.value("tid", -1)}] = value.rfind("comm", 0) == 0 ? "comm" : value;
      }
    } else if (phase == "X") {
      const std::int64_t iteration = event.contains("args") ? event["args"].value("iteration", std::int64_t{-1}) : -1;
      const double start = event.value("ts", 0.0);
      spans.push_back({event.value("pid", -1), event.value("tid", -1), event.value("name", ""), start,
                       start + event.value("dur", 0.0), iteration});
    }
  }
  // "compute", "comm" or another thread's name; "" for a span of no named thread.
  auto thread_of = [&](const Span& span) -> const std::string& {
    static const std::string none;
    const auto found = threads.find({span.pid, span.tid});
    return found != threads.end() ? found->second : none;
  };
  // One timeline per run label, in the order of the runs' processes.
  std::vector<std::string> labels;
  for (const auto& [pid, worker] : workers) {
    if (std::find(labels.begin(), labels.end(), worker.first) == labels.end()) labels.push_back(worker.first);
  }
  std::vector<Timeline> timelines;
  for (const std::string& label : labels) {
    auto pid_of = [&](int worker) -> std::optional<int> {
      for (const auto& [pid, w] : workers) {
        if (w.first == label && w.second == worker) return pid;
      }
      return std::nullopt;
    };
    const std::optional<int> leader = pid_of(0);
    if (!leader) continue;
    // Worker 0's compute iterations; the window: `iterations` of them from the middle on.
    std::set<std::int64_t> seen;
    for (const Span& span : spans) {
      if (span.pid == *leader && thread_of(span) == "compute" && span.name == "forward") {
        seen.insert(span.iteration);
      }
    }
    if (static_cast<std::int64_t>(seen.size()) < iterations) continue;
    const std::vector<std::int64_t> ordered(seen.begin(), seen.end());
    const std::int64_t first = ordered[std::min(ordered.size() - static_cast<std::size_t>(iterations), ordered.size() / 2)];
    double begin_us = 0, end_us = 0;
    bool found = false;
    for (const Span& span : spans) {
      if (span.pid != *leader || thread_of(span) != "compute" || !shown("compute", span.name)) continue;
      if (span.iteration < first || span.iteration >= first + iterations) continue;
      begin_us = found ? std::min(begin_us, span.start_us) : span.start_us;
      end_us = found ? std::max(end_us, span.end_us) : span.end_us;
      found = true;
    }
    if (!found || end_us <= begin_us) continue;
    Timeline timeline;
    timeline.run = label;
    timeline.first_iteration = first;
    timeline.iterations = iterations;
    for (int w = 0; w < kWorkersShown; ++w) {
      const std::optional<int> pid = pid_of(w);
      if (!pid) continue;
      for (const char* thread : {"compute", "comm"}) {
        const std::size_t track = timeline.tracks.size();
        bool any = false;
        for (const Span& span : spans) {
          if (span.pid != *pid || thread_of(span) != thread || !shown(thread, span.name)) continue;
          if (span.end_us <= begin_us || span.start_us >= end_us) continue;
          timeline.boxes.push_back({track, span.name, (std::max(span.start_us, begin_us) - begin_us) / 1e3,
                                    (std::min(span.end_us, end_us) - begin_us) / 1e3, span.iteration});
          any = true;
        }
        if (any) timeline.tracks.push_back(concat("worker ", w, " ", thread));
      }
    }
    timelines.push_back(std::move(timeline));
  }
  return timelines;
}

}  // namespace pipesgd
