// --trace through whole runs (train/worker.cpp, comm/comm_worker.cpp, the methods, the servers):
// the file parses as JSON; every worker has a compute track (and a comm track where its method has
// a comm thread), every server a track; spans nest properly on every track; every flow arrow has
// both ends, each inside a span of its track, and joins the communication of iteration t to the
// update that applies it (t + K for Pipe-SGD); --trace-iters keeps the window only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "pipesgd/core/trace.h"
#include "pipesgd/report/trace_file.h"
#include "pipesgd/report/trace_timeline.h"
#include "pipesgd/train/worker.h"
#include "temp_dir.h"
#include "tiny_run.h"
#include "trace_checks.h"

namespace pipesgd {
namespace {

using namespace trace_checks;  // the trace file checks (tests/core/trace_checks.h)

struct TraceCase {
  std::string spec;
  int workers;
  int servers;
  std::string flag;  // a method option and its value ("": none)
  std::string value;
  bool comm_thread;  // the method communicates off the compute thread
  bool arrows;       // ... and its updates apply what it communicated: gradient arrows
  // The update of iteration t + d applies the gradient of iteration t, min_delay <= d <= max_delay.
  int min_delay;
  int max_delay;
};

std::ostream& operator<<(std::ostream& out, const TraceCase& c) {
  return out << c.spec << (c.flag.empty() ? "" : concat(" ", c.flag, " ", c.value)) << ", " << c.workers << " workers"
             << (c.servers > 0 ? concat(", ", c.servers, " servers") : "");
}

constexpr std::int64_t kIterations = 30;  // past the layer-wise methods' and SAPipe's profiling (18)

// Runs `c` with a trace of `window`; returns the file's content as written and read back.
nlohmann::json traced_run(const TraceCase& c, TraceWindow window, const std::string& label = "") {
  TraceRecorder recorder(window, 64);
  OptionValues options;
  if (!c.flag.empty()) options.set(c.flag, c.value);
  TrainConfig config = tiny_config(c.spec, c.workers, c.servers, options);
  config.iterations = kIterations;
  config.warn_short_run = false;
  config.trace.recorder = &recorder;
  config.trace.label = label;
  run_training(config, softmax_factory(), small_data());
  return nlohmann::json::parse(nlohmann::json{{"traceEvents", recorder.events_json()}}.dump());
}

class RunTrace : public ::testing::TestWithParam<TraceCase> {};

TEST_P(RunTrace, TracksNestingAndArrows) {
  const TraceCase& c = GetParam();
  const nlohmann::json events = traced_run(c, TraceWindow{}).at("traceEvents");

  // A named process per rank, a compute track per worker, comm and server tracks.
  std::map<int, std::string> processes = process_names(events);
  std::map<Track, std::string> threads = thread_names(events);
  ASSERT_EQ(processes.size(), static_cast<std::size_t>(c.workers + c.servers));
  for (int w = 0; w < c.workers; ++w) {
    EXPECT_EQ(processes[w], concat("worker ", w));
    std::map<std::string, int> kinds = {{"compute", 1}};
    if (c.comm_thread) kinds["comm"] = 1;
    EXPECT_EQ(thread_kinds(threads, w), kinds) << "worker " << w;
  }
  for (int s = 0; s < c.servers; ++s) {
    EXPECT_EQ(processes[c.workers + s], concat("server ", s));
    EXPECT_EQ(thread_kinds(threads, c.workers + s), (std::map<std::string, int>{{"serve", 1}}));
  }

  const std::map<Track, std::vector<Span>> tracks = spans_by_track(events);
  expect_spans_nest(tracks, threads);
  std::set<std::string> names;
  for (const auto& [track, spans] : tracks) {
    for (const Span& span : spans) names.insert(span.name);
  }
  for (const char* name : {"data", "forward", "backward", "backward linear.weight", "backward linear.bias"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  if (c.servers == 0) {
    EXPECT_EQ(names.count("allreduce"), 1u);
    EXPECT_EQ(names.count("update"), 1u);
  }
  if (c.servers > 0) {
    EXPECT_EQ(names.count("push"), 1u);
    EXPECT_EQ(names.count("pull"), 1u);
  }
  if (c.comm_thread) {
    EXPECT_EQ(names.count("bucket"), 1u);
  }

  // Arrows: each id once as a start and once as an end, both inside a span of their tracks: from a
  // comm thread's bucket of iteration t to the compute thread's update in iteration t + delay.
  const Flows flows = flows_by_id(events);
  if (!c.arrows) {
    EXPECT_TRUE(flows.empty());
    return;
  }
  EXPECT_GE(flows.size(), static_cast<std::size_t>(c.workers * 6));
  for (const auto& [from, to] : gradient_arrows(flows, tracks, threads)) {
    EXPECT_TRUE(to->name == "update" || to->name == "compensation") << to->name;
    const std::int64_t delay = to->iteration - from->iteration;
    if (from->iteration + c.min_delay >= kIterations) {
      // The run's end applies the last gradients (the drain, in the last iteration).
      EXPECT_EQ(to->iteration, kIterations - 1);
    } else {
      EXPECT_GE(delay, c.min_delay) << "bucket of " << from->iteration << " applied in " << to->iteration;
      EXPECT_LE(delay, c.max_delay) << "bucket of " << from->iteration << " applied in " << to->iteration;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Methods, RunTrace,
    ::testing::Values(TraceCase{"dsync", 2, 0, "", "", false, false, 0, 0},
                      TraceCase{"dsync", 3, 0, "", "", false, false, 0, 0},
                      TraceCase{"pipe", 2, 0, "", "", true, true, 2, 2},
                      TraceCase{"pipe+int8", 3, 0, "", "", true, true, 2, 2},
                      TraceCase{"pipe", 2, 0, "--staleness-k", "3", true, true, 3, 3},
                      TraceCase{"wfbp", 2, 0, "", "", true, true, 0, 0},
                      TraceCase{"mgwfbp", 3, 0, "", "", true, true, 0, 0},
                      // Synchronous buckets in the next iteration, the stale range in the one after.
                      TraceCase{"sapipe", 2, 0, "", "", true, true, 1, 2},
                      TraceCase{"sapipe+wp3", 2, 0, "--stale-layers", "1", true, true, 1, 2},
                      TraceCase{"pssync", 2, 1, "", "", false, false, 0, 0},
                      TraceCase{"odsgd", 2, 2, "--warmup-iters", "4", true, true, 1, 1}),
    [](const ::testing::TestParamInfo<TraceCase>& info) {
      std::string name = concat(info.param.spec, "_", info.param.value, "_", info.param.workers, "w",
                                info.param.servers, "s");
      std::replace_if(name.begin(), name.end(), [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
      return name;
    });

TEST(RunTrace, WindowKeepsItsIterationsOnly) {
  const nlohmann::json events =
      traced_run({"pipe", 2, 0, "", "", true, true, 2, 2}, parse_trace_window("4:7")).at("traceEvents");
  std::set<std::int64_t> iterations;
  for (const nlohmann::json& event : events) {
    if (event.at("ph") == "M" || !event.contains("args")) continue;
    iterations.insert(event["args"].value("iteration", std::int64_t{-1}));
  }
  const std::set<std::int64_t> window = {4, 5, 6};
  EXPECT_EQ(iterations, window);
}

TEST(RunTrace, ComparisonLabelsItsProcesses) {
  const nlohmann::json events =
      traced_run({"dsync", 2, 0, "", "", false, false, 0, 0}, TraceWindow{}, "dsync: ").at("traceEvents");
  const std::map<int, std::string> labelled = {{0, "dsync: worker 0"}, {1, "dsync: worker 1"}};
  EXPECT_EQ(process_names(events), labelled);
}

TEST(RunTrace, TimelineOfTheMiddleIterations) {
  // A comparison's file: two runs, each worker's compute and comm tracks.
  TempDir dir;
  TraceRecorder recorder(TraceWindow{}, 64);
  for (std::size_t run = 0; run < 2; ++run) {
    TrainConfig config = tiny_config(run == 0 ? "pipe" : "dsync", 2);
    config.iterations = 10;
    config.warn_short_run = false;
    config.trace = {&recorder, static_cast<int>(run) * 10000, run == 0 ? "pipe: " : "dsync: "};
    run_training(config, softmax_factory(), small_data());
  }
  const std::filesystem::path path = std::filesystem::path(dir.path()) / "t.json";
  write_trace_file(path.string(), recorder.events_json(), recorder.dropped());

  const std::vector<Timeline> timelines = read_trace_timelines(path, 3);
  ASSERT_EQ(timelines.size(), 2u);
  EXPECT_EQ(timelines[0].run, "pipe");
  EXPECT_EQ(timelines[1].run, "dsync");
  const std::vector<std::string> pipe_tracks = {"worker 0 compute", "worker 0 comm", "worker 1 compute", "worker 1 comm"};
  EXPECT_EQ(timelines[0].tracks, pipe_tracks);
  const std::vector<std::string> dsync_tracks = {"worker 0 compute", "worker 1 compute"};  // no comm thread
  EXPECT_EQ(timelines[1].tracks, dsync_tracks);
  for (const Timeline& timeline : timelines) {
    EXPECT_EQ(timeline.first_iteration, 5);  // the middle of 0..9, three iterations
    std::set<std::int64_t> forwards;
    for (const TimelineBox& box : timeline.boxes) {
      EXPECT_LT(box.track, timeline.tracks.size());
      EXPECT_GE(box.start_ms, 0);
      EXPECT_LE(box.start_ms, box.end_ms);
      EXPECT_NE(box.name, "backward linear.weight");  // the layers' spans are inside backward's
      if (box.name == "forward" && box.track == 0) forwards.insert(box.iteration);
    }
    const std::set<std::int64_t> window = {5, 6, 7};
    EXPECT_EQ(forwards, window);
  }
  EXPECT_THROW(read_trace_timelines(std::filesystem::path(dir.path()) / "missing.json"), DataError);
}

TEST(RunTrace, BufferSizeCoversTheWindow) {
  // Every iteration of the window fits: 12 iterations of a 2-layer model.
  EXPECT_GE(trace_events_per_thread(TraceWindow{}, 12, 2), 12u * (4 * 2 + 16));
  EXPECT_EQ(trace_events_per_thread(parse_trace_window("100:"), 12, 2), 2u * (4 * 2 + 16));  // nothing but the end
  EXPECT_EQ(trace_events_per_thread(TraceWindow{}, 10'000'000, 1000), 2'000'000u);           // bounded
}

}  // namespace
}  // namespace pipesgd
