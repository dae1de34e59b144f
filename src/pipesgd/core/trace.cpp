#include "pipesgd/core/trace.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

thread_local ThreadTrace* installed_trace = nullptr;

// A ThreadTrace's storage is freed without running destructors.
static_assert(std::is_trivially_destructible_v<TraceEvent>);

bool parse_iteration(const std::string& text, std::int64_t& value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  return error == std::errc() && stop == end && value >= 0;
}

double microseconds(std::int64_t nanoseconds) { return static_cast<double>(nanoseconds) / 1e3; }

}  // namespace

TraceWindow parse_trace_window(const std::string& text, std::string_view setting) {
  const auto bad = [&] {
    return UsageError(concat(setting, " '", text, "': expected A:B (iterations A <= t < B), A: or :B"));
  };
  const std::size_t colon = text.find(':');
  if (colon == std::string::npos) throw bad();
  TraceWindow window;
  const std::string first = text.substr(0, colon), end = text.substr(colon + 1);
  if (first.empty() && end.empty()) throw bad();
  if (!first.empty() && !parse_iteration(first, window.first)) throw bad();
  if (!end.empty() && !parse_iteration(end, window.end)) throw bad();
  if (window.end <= window.first) throw UsageError(concat(setting, " '", text, "': the window is empty"));
  return window;
}

ThreadTrace::ThreadTrace(TraceRecorder& recorder, int process, int thread, std::size_t capacity)
    : recorder_(&recorder),
      process_(process),
      thread_(thread),
      window_(recorder.window()),
      origin_(recorder.origin()),
      capacity_(capacity),
      // Uninitialised: pages are touched as events are recorded, not up front.
      events_(std::allocator<TraceEvent>().allocate(capacity), Deallocate{capacity}) {}

void ThreadTrace::add(const TraceEvent& event) {
  if (!recording()) return;
  const std::size_t size = size_.load(std::memory_order_relaxed);  // this thread is the only writer
  if (size == capacity_) {
    dropped_.store(dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return;
  }
  TraceEvent* recorded = std::construct_at(events_.get() + size, event);
  if (event.phase != TracePhase::kFlowStart && event.phase != TracePhase::kFlowEnd && event.args.iteration < 0) {
    recorded->args.iteration = iteration_;  // by default, the thread's iteration
  }
  size_.store(size + 1, std::memory_order_release);
}

void ThreadTrace::span(const char* name, const char* category, TraceClock::time_point start,
                       TraceClock::time_point end, const TraceArgs& args) {
  const std::int64_t start_ns = since_origin(start);
  add({name, category, TracePhase::kSpan, start_ns, std::max<std::int64_t>(0, since_origin(end) - start_ns), 0, args});
}

void ThreadTrace::instant(const char* name, const char* category, const TraceArgs& args) {
  add({name, category, TracePhase::kInstant, since_origin(TraceClock::now()), 0, 0, args});
}

void ThreadTrace::instant(const char* name, const char* category, TraceClock::time_point at, const TraceArgs& args) {
  add({name, category, TracePhase::kInstant, since_origin(at), 0, 0, args});
}

void ThreadTrace::flow_start(std::uint64_t id, TraceClock::time_point at) {
  add({"gradient", "flow", TracePhase::kFlowStart, since_origin(at), 0, id, {}});
}

void ThreadTrace::flow_end(std::uint64_t id, TraceClock::time_point at) {
  add({"gradient", "flow", TracePhase::kFlowEnd, since_origin(at), 0, id, {}});
}

void ThreadTrace::gradient_flow_start(std::int64_t iteration, std::size_t index) {
  if (recording() && window_.contains(iteration)) flow_start(gradient_flow_id(process_, iteration, index), TraceClock::now());
}

void ThreadTrace::gradient_flow_end(std::int64_t iteration, std::size_t index) {
  if (recording() && window_.contains(iteration)) flow_end(gradient_flow_id(process_, iteration, index), TraceClock::now());
}

TraceRecorder::TraceRecorder(TraceWindow window, std::size_t events_per_thread)
    : window_(window), events_per_thread_(events_per_thread), origin_(TraceClock::now()) {}

ThreadTrace& TraceRecorder::add_thread(int process, const std::string& process_name, const std::string& thread_name,
                                       std::size_t capacity) {
  PIPESGD_ASSERT(process >= 0);
  std::lock_guard lock(mutex_);
  const auto index = static_cast<std::size_t>(process);
  if (process_names_.size() <= index) process_names_.resize(index + 1);
  if (!process_name.empty()) process_names_[index] = process_name;
  thread_names_.push_back(thread_name);
  return threads_.emplace_back(*this, process, static_cast<int>(thread_names_.size()),
                               capacity > 0 ? capacity : events_per_thread_);
}

const char* TraceRecorder::intern(const std::string& text) {
  std::lock_guard lock(mutex_);
  return interned_.emplace_back(text).c_str();
}

std::size_t TraceRecorder::dropped() const {
  std::lock_guard lock(mutex_);
  std::size_t dropped = 0;
  for (const ThreadTrace& thread : threads_) dropped += thread.dropped();
  return dropped;
}

nlohmann::json TraceRecorder::events_json(std::int64_t offset_ns) const {
  std::lock_guard lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  for (std::size_t p = 0; p < process_names_.size(); ++p) {
    if (process_names_[p].empty()) continue;
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", p}, {"args", {{"name", process_names_[p]}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", p}, {"args", {{"sort_index", p}}}});
  }
  for (const ThreadTrace& thread : threads_) {
    const std::string& name = thread_names_[static_cast<std::size_t>(thread.thread() - 1)];
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", thread.process()},
                      {"tid", thread.thread()},
                      {"args", {{"name", name}}}});
    for (const TraceEvent& event : thread.events()) {
      nlohmann::json out = {{"name", event.name},
                            {"cat", event.category},
                            {"ph", std::string(1, static_cast<char>(event.phase))},
                            {"ts", microseconds(event.start_ns + offset_ns)},
                            {"pid", thread.process()},
                            {"tid", thread.thread()}};
      switch (event.phase) {
        case TracePhase::kSpan: out["dur"] = microseconds(event.duration_ns); break;
        case TracePhase::kInstant: out["s"] = "t"; break;
        case TracePhase::kFlowStart: out["id"] = event.flow; break;
        case TracePhase::kFlowEnd:
          out["id"] = event.flow;
          out["bp"] = "e";  // binds to the enclosing span, not the next one
          break;
      }
      nlohmann::json args = nlohmann::json::object();
      const TraceArgs& a = event.args;
      if (a.iteration >= 0) args["iteration"] = a.iteration;
      if (a.layer >= 0) args["layer"] = a.layer;
      if (a.bucket >= 0) args["bucket"] = a.bucket;
      if (a.worker >= 0) args["worker"] = a.worker;
      if (a.bytes > 0) args["bytes"] = a.bytes;
      if (a.tag > 0) args["tag"] = a.tag;
      if (a.algorithm != nullptr) args["algorithm"] = a.algorithm;
      if (a.codec != nullptr) args["codec"] = a.codec;
      if (a.detail != nullptr) args["detail"] = a.detail;
      if (!args.empty()) out["args"] = std::move(args);
      events.push_back(std::move(out));
    }
  }
  return events;
}


ThreadTrace* current_thread_trace() { return installed_trace; }

ScopedThreadTrace::ScopedThreadTrace(ThreadTrace* trace) : previous_(installed_trace) { installed_trace = trace; }

ScopedThreadTrace::~ScopedThreadTrace() { installed_trace = previous_; }

}  // namespace pipesgd
