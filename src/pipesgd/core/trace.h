#pragma once
// A run's timeline (--trace): every thread of a rank records spans, instants and flow arrows into a
// buffer of its own, preallocated before the run; the file is written after the run (or after its
// failure, up to it) in the Chrome trace event format, which Perfetto and chrome://tracing open.
//
// Threads: TraceRecorder::add_thread is for set-up (it takes a lock); a ThreadTrace is written by
// its own thread only, with no allocation, lock or I/O (a full buffer drops further events and
// counts them); events_json normally runs once every recording thread has stopped
// (report/trace_file.h writes the file), and may run while some still record (after a failure:
// what each had published by then). A thread records into
// the trace installed for it by a ScopedThreadTrace; code below (collectives, optimizers, comm
// threads) records through current_thread_trace() and does nothing where none is installed.
//
// Names and categories are `const char*` that must outlive the recorder: string literals, or
// strings the recorder holds (TraceRecorder::intern).
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pipesgd {

using TraceClock = std::chrono::steady_clock;

// The iterations recorded: [first, end) (--trace-iters A:B is A <= t < B).
struct TraceWindow {
  std::int64_t first = 0;
  std::int64_t end = INT64_MAX;
  bool contains(std::int64_t iteration) const { return iteration >= first && iteration < end; }
};

// "A:B" (0 <= A < B), "A:" (A on) or ":B"; UsageError naming `setting` otherwise.
TraceWindow parse_trace_window(const std::string& text, std::string_view setting = "--trace-iters");

// What an event says beyond its name; unset fields are left out of the file.
struct TraceArgs {
  std::int64_t iteration = -1;
  std::int64_t layer = -1;
  std::int64_t bucket = -1;
  std::int64_t worker = -1;  // a server's requests: whose
  std::uint64_t bytes = 0;
  std::uint64_t tag = 0;
  const char* algorithm = nullptr;
  const char* codec = nullptr;
  const char* detail = nullptr;  // free text (e.g. why auto switched); interned (TraceRecorder::intern)
};

// The categories the run's events use.
inline constexpr const char* kTraceCompute = "compute";   // the compute thread's work and waits
inline constexpr const char* kTraceComm = "comm";         // comm threads' jobs and collectives
inline constexpr const char* kTraceServer = "server";     // parameter servers' requests
inline constexpr const char* kTraceRun = "run";           // instants: plan changes, checkpoints, faults

// The id of the flow arrow from the communication of iteration `iteration`'s gradient (part
// `index`: a bucket, a slot) on `process` to the update that applies it; unique in a file whose
// processes number below 2^20, iterations below 2^32 and parts below 2^12.
constexpr std::uint64_t gradient_flow_id(int process, std::int64_t iteration, std::size_t index) {
  return (static_cast<std::uint64_t>(process) << 44) | ((static_cast<std::uint64_t>(iteration) & 0xffffffffu) << 12) |
         (static_cast<std::uint64_t>(index) & 0xfffu);
}

class TraceRecorder;

enum class TracePhase : char { kSpan = 'X', kInstant = 'i', kFlowStart = 's', kFlowEnd = 'f' };

struct TraceEvent {
  const char* name = nullptr;
  const char* category = nullptr;
  TracePhase phase = TracePhase::kSpan;
  std::int64_t start_ns = 0;     // since the recorder's origin
  std::int64_t duration_ns = 0;  // spans only
  std::uint64_t flow = 0;        // flow arrows only: the id that joins a start to its end
  TraceArgs args;
};

// One thread's events. Written by that thread only.
class ThreadTrace {
 public:
  // Made by TraceRecorder::add_thread.
  ThreadTrace(TraceRecorder& recorder, int process, int thread, std::size_t capacity);

  // The iteration this thread works on: events outside the window are not recorded, and spans and
  // instants whose args name none carry it.
  void set_iteration(std::int64_t iteration) { iteration_ = iteration; }
  std::int64_t iteration() const { return iteration_; }
  bool recording() const { return window_.contains(iteration_); }

  void span(const char* name, const char* category, TraceClock::time_point start, TraceClock::time_point end,
            const TraceArgs& args = {});
  void instant(const char* name, const char* category, const TraceArgs& args = {});
  void instant(const char* name, const char* category, TraceClock::time_point at, const TraceArgs& args = {});
  // An arrow from the span enclosing `at` on this thread (flow_start) to the span enclosing `at`
  // on the thread that records flow_end with the same id.
  void flow_start(std::uint64_t id, TraceClock::time_point at);
  void flow_end(std::uint64_t id, TraceClock::time_point at);
  // The arrows of gradient_flow_id(process(), iteration, index), stamped now; recorded only if
  // `iteration` is in the window too (so that no arrow lacks its other end).
  void gradient_flow_start(std::int64_t iteration, std::size_t index);
  void gradient_flow_end(std::int64_t iteration, std::size_t index);

  TraceRecorder& recorder() const { return *recorder_; }
  int process() const { return process_; }
  int thread() const { return thread_; }
  // The events recorded so far (any thread may read them: each is complete before it counts).
  std::span<const TraceEvent> events() const { return {events_.get(), size_.load(std::memory_order_acquire)}; }
  std::size_t capacity() const { return capacity_; }
  std::size_t dropped() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  // Records `event` if this thread's iteration is in the window and the buffer has room.
  void add(const TraceEvent& event);
  std::int64_t since_origin(TraceClock::time_point at) const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(at - origin_).count();
  }

  TraceRecorder* recorder_;
  int process_;
  int thread_;
  TraceWindow window_;
  TraceClock::time_point origin_;
  std::int64_t iteration_ = 0;
  // Storage for capacity_ events, allocated at construction and never grown; the first size_ are
  // recorded (published with release order, so a reader sees whole events).
  struct Deallocate {
    std::size_t capacity;
    void operator()(TraceEvent* events) const { std::allocator<TraceEvent>().deallocate(events, capacity); }
  };
  std::size_t capacity_;
  std::unique_ptr<TraceEvent[], Deallocate> events_;
  std::atomic<std::size_t> size_{0};
  std::atomic<std::size_t> dropped_{0};
};

// Every thread's trace of one process, and the names of its processes and threads.
class TraceRecorder {
 public:
  TraceRecorder(TraceWindow window, std::size_t events_per_thread);

  // Set-up (takes a lock): a buffer for thread `thread_name` of process `process` (a rank), whose
  // names the file shows (an empty `process_name` keeps the process's name). The reference stays
  // valid for the recorder's life.
  // `capacity`: the events it holds (0: the recorder's events_per_thread).
  ThreadTrace& add_thread(int process, const std::string& process_name, const std::string& thread_name,
                          std::size_t capacity = 0);
  // A copy of `text` that lives as long as the recorder.
  const char* intern(const std::string& text);

  TraceClock::time_point origin() const { return origin_; }
  TraceWindow window() const { return window_; }
  std::size_t dropped() const;

  // The "traceEvents" of every thread (after they stopped), times in microseconds since the
  // origin plus `offset_ns`, with process and thread names as metadata events.
  nlohmann::json events_json(std::int64_t offset_ns = 0) const;

 private:
  TraceWindow window_;
  std::size_t events_per_thread_;
  TraceClock::time_point origin_;
  mutable std::mutex mutex_;
  std::deque<ThreadTrace> threads_;  // stable addresses
  std::vector<std::string> process_names_;  // by process id (may have gaps: "")
  std::vector<std::string> thread_names_;   // by ThreadTrace::thread()
  std::deque<std::string> interned_;
};

// The calling thread's trace, or nullptr.
ThreadTrace* current_thread_trace();

// Installs `trace` (may be null) as the calling thread's for its scope.
class ScopedThreadTrace {
 public:
  explicit ScopedThreadTrace(ThreadTrace* trace);
  ~ScopedThreadTrace();
  ScopedThreadTrace(const ScopedThreadTrace&) = delete;
  ScopedThreadTrace& operator=(const ScopedThreadTrace&) = delete;

 private:
  ThreadTrace* previous_;
};

// What TraceSpan and TracedStopwatch share: the calling thread's trace (null without one or
// outside its window), the span's name, category and arguments, and its start.
class TraceScope {
 public:
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 protected:
  TraceScope(const char* name, const char* category, const TraceArgs& args)
      : trace_(current_thread_trace()), name_(name), category_(category), args_(args) {
    if (trace_ != nullptr && !trace_->recording()) trace_ = nullptr;
  }
  // Records the span [start_, end], once.
  void record(TraceClock::time_point end) {
    if (trace_ == nullptr) return;
    trace_->span(name_, category_, start_, end, args_);
    trace_ = nullptr;
  }

  ThreadTrace* trace_;
  const char* name_;
  const char* category_;
  TraceArgs args_;
  TraceClock::time_point start_{};
};

// A span on the calling thread's trace from construction to destruction (nothing without one, and
// no clock read outside the window).
class TraceSpan : public TraceScope {
 public:
  TraceSpan(const char* name, const char* category, const TraceArgs& args = {}) : TraceScope(name, category, args) {
    if (trace_ != nullptr) start_ = TraceClock::now();
  }
  ~TraceSpan() {
    if (trace_ != nullptr) record(TraceClock::now());
  }
};

// An instant event on the calling thread's trace (nothing without one).
inline void trace_instant(const char* name, const char* category, const TraceArgs& args = {}) {
  if (ThreadTrace* trace = current_thread_trace()) trace->instant(name, category, args);
}

// The calling thread's gradient_flow_start / gradient_flow_end (nothing without a trace).
inline void trace_gradient_flow_start(std::int64_t iteration, std::size_t index) {
  if (ThreadTrace* trace = current_thread_trace()) trace->gradient_flow_start(iteration, index);
}
inline void trace_gradient_flow_end(std::int64_t iteration, std::size_t index) {
  if (ThreadTrace* trace = current_thread_trace()) trace->gradient_flow_end(iteration, index);
}

// The calling thread's iteration (nothing without a trace): for threads that serve requests of
// many iterations (comm threads, servers), set before each.
inline void trace_set_iteration(std::int64_t iteration) {
  if (ThreadTrace* trace = current_thread_trace()) trace->set_iteration(iteration);
}

// A Stopwatch that is also a span of the calling thread's trace: stop() returns the seconds since
// construction and records the span (once); one never stopped records it when destroyed (a failing
// operation's span ends where it failed). Reads the clock once at each end, like a Stopwatch.
class TracedStopwatch : public TraceScope {
 public:
  explicit TracedStopwatch(const char* name, const char* category = kTraceCompute, const TraceArgs& args = {})
      : TraceScope(name, category, args) {
    start_ = TraceClock::now();
  }
  ~TracedStopwatch() {
    if (trace_ != nullptr) record(TraceClock::now());
  }

  double stop() {
    const TraceClock::time_point end = TraceClock::now();
    record(end);
    return std::chrono::duration<double>(end - start_).count();
  }
};

}  // namespace pipesgd
