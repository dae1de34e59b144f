// The trace recorder (core/trace.h): the Chrome trace event format it writes (one process per rank,
// one track per thread, spans, instants, flow arrows bound to their spans), its iteration window,
// a full buffer dropping instead of growing, and --trace-iters.
#include "pipesgd/core/trace.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "pipesgd/core/error.h"
#include "pipesgd/report/trace_file.h"
#include "temp_dir.h"

namespace pipesgd {
namespace {

using std::chrono::microseconds;

const nlohmann::json* find_event(const nlohmann::json& events, const std::string& phase, const std::string& name) {
  for (const nlohmann::json& event : events) {
    if (event.at("ph") == phase && event.at("name") == name) return &event;
  }
  return nullptr;
}

TEST(Trace, SpansInstantsAndFlowsInChromeFormat) {
  TraceRecorder recorder(TraceWindow{}, 16);
  ThreadTrace& compute = recorder.add_thread(0, "rank 0", "compute");
  ThreadTrace& comm = recorder.add_thread(0, "rank 0", "comm");
  const TraceClock::time_point origin = recorder.origin();
  TraceArgs args;
  args.iteration = 3;
  args.bytes = 4096;
  args.algorithm = "ring";
  args.codec = "int8";
  args.tag = 7;
  comm.span("allreduce", "comm", origin + microseconds(10), origin + microseconds(30), args);
  comm.flow_start(42, origin + microseconds(20));
  compute.span("update", "compute", origin + microseconds(40), origin + microseconds(45));
  compute.flow_end(42, origin + microseconds(41));
  {
    ScopedThreadTrace installed(&compute);
    trace_instant("checkpoint", "run");
  }
  const nlohmann::json events = recorder.events_json();

  const nlohmann::json* allreduce = find_event(events, "X", "allreduce");
  ASSERT_NE(allreduce, nullptr);
  EXPECT_DOUBLE_EQ(allreduce->at("ts").get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(allreduce->at("dur").get<double>(), 20.0);
  EXPECT_EQ(allreduce->at("pid"), 0);
  EXPECT_EQ(allreduce->at("args").at("bytes"), 4096);
  EXPECT_EQ(allreduce->at("args").at("algorithm"), "ring");
  EXPECT_EQ(allreduce->at("args").at("codec"), "int8");
  EXPECT_EQ(allreduce->at("args").at("iteration"), 3);
  EXPECT_EQ(allreduce->at("args").at("tag"), 7);
  const nlohmann::json* update = find_event(events, "X", "update");
  ASSERT_NE(update, nullptr);
  EXPECT_EQ(update->at("args"), nlohmann::json({{"iteration", 0}}));  // the thread's iteration, nothing else
  EXPECT_NE(update->at("tid"), allreduce->at("tid"));  // a track per thread

  const nlohmann::json* start = find_event(events, "s", "gradient");
  const nlohmann::json* end = find_event(events, "f", "gradient");
  ASSERT_NE(start, nullptr);
  ASSERT_NE(end, nullptr);
  EXPECT_EQ(start->at("id"), 42);
  EXPECT_EQ(end->at("id"), 42);
  EXPECT_EQ(end->at("bp"), "e");
  EXPECT_EQ(start->at("tid"), allreduce->at("tid"));
  EXPECT_EQ(end->at("tid"), update->at("tid"));

  const nlohmann::json* instant = find_event(events, "i", "checkpoint");
  ASSERT_NE(instant, nullptr);
  EXPECT_EQ(instant->at("tid"), update->at("tid"));

  int thread_names = 0, process_names = 0;
  for (const nlohmann::json& event : events) {
    if (event.at("ph") != "M") continue;
    if (event.at("name") == "thread_name") ++thread_names;
    if (event.at("name") == "process_name") {
      ++process_names;
      EXPECT_EQ(event.at("args").at("name"), "rank 0");
    }
  }
  EXPECT_EQ(thread_names, 2);
  EXPECT_EQ(process_names, 1);
  EXPECT_EQ(current_thread_trace(), nullptr);  // the scope restored it
}

TEST(Trace, OnlyTheWindowIsRecorded) {
  TraceRecorder recorder(TraceWindow{2, 4}, 16);
  ThreadTrace& thread = recorder.add_thread(1, "rank 1", "compute");
  ScopedThreadTrace installed(&thread);
  for (std::int64_t t = 0; t < 6; ++t) {
    thread.set_iteration(t);
    TraceSpan span("forward", "compute");
  }
  EXPECT_EQ(thread.events().size(), 2u);  // iterations 2 and 3
}

TEST(Trace, AFullBufferDropsAndCounts) {
  TraceRecorder recorder(TraceWindow{}, 3);
  ThreadTrace& thread = recorder.add_thread(0, "rank 0", "compute");
  const std::size_t capacity = thread.capacity();
  for (int i = 0; i < 5; ++i) thread.instant("tick", "test");
  EXPECT_EQ(thread.events().size(), 3u);
  EXPECT_EQ(thread.capacity(), capacity);  // never grown
  EXPECT_EQ(recorder.dropped(), 2u);
}

TEST(Trace, NoTraceInstalledRecordsNothing) {
  TraceRecorder recorder(TraceWindow{}, 4);
  ThreadTrace& thread = recorder.add_thread(0, "rank 0", "compute");
  ScopedThreadTrace installed(&thread);
  {
    ScopedThreadTrace none(nullptr);  // e.g. a thread of a run without --trace
    TraceSpan span("forward", "compute");
    trace_instant("x", "y");
  }
  EXPECT_TRUE(thread.events().empty());
  { TraceSpan span("forward", "compute"); }  // the outer trace is back
  EXPECT_EQ(thread.events().size(), 1u);
}

TEST(Trace, ThreadsRecordConcurrently) {
  TraceRecorder recorder(TraceWindow{}, 1000);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    ThreadTrace& trace = recorder.add_thread(r, concat("rank ", r), "compute");
    threads.emplace_back([&trace] {
      ScopedThreadTrace installed(&trace);
      for (int i = 0; i < 1000; ++i) TraceSpan span("work", "compute");
    });
  }
  for (std::thread& thread : threads) thread.join();
  std::size_t spans = 0;
  for (const nlohmann::json& event : recorder.events_json()) spans += event.at("ph") == "X";
  EXPECT_EQ(spans, 3000u);
  EXPECT_EQ(recorder.dropped(), 0u);
}

TEST(Trace, WritesAFilePerfettoReads) {
  TempDir dir;
  TraceRecorder recorder(TraceWindow{}, 4);
  ThreadTrace& thread = recorder.add_thread(0, "rank 0", "compute");
  thread.span("forward", "compute", recorder.origin(), recorder.origin() + microseconds(5));
  const std::string path = (std::filesystem::path(dir.path()) / "t.json").string();
  write_trace_file(path, recorder.events_json(), recorder.dropped(), "rank 1 stopped");
  std::ifstream in(path);
  const nlohmann::json file = nlohmann::json::parse(in);
  EXPECT_EQ(file.at("displayTimeUnit"), "ms");
  ASSERT_TRUE(file.at("traceEvents").is_array());
  EXPECT_NE(find_event(file.at("traceEvents"), "X", "forward"), nullptr);
  EXPECT_EQ(file.at("otherData").at("dropped_events"), 0);
  EXPECT_EQ(file.at("otherData").at("failure"), "rank 1 stopped");
}

TEST(Trace, IterationWindowFlag) {
  EXPECT_EQ(parse_trace_window("10:20").first, 10);
  EXPECT_EQ(parse_trace_window("10:20").end, 20);
  EXPECT_EQ(parse_trace_window("5:").first, 5);
  EXPECT_EQ(parse_trace_window("5:").end, INT64_MAX);
  EXPECT_EQ(parse_trace_window(":7").first, 0);
  EXPECT_EQ(parse_trace_window(":7").end, 7);
  for (const std::string bad : {"", ":", "3", "a:b", "-1:4", "4:4", "5:2", "1:2:3", "1.5:3"}) {
    EXPECT_THROW(parse_trace_window(bad), UsageError) << bad;
  }
}

}  // namespace
}  // namespace pipesgd
