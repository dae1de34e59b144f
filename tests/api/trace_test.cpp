// WorldOptions::trace / trace_iterations (include/pipesgd/world.h) through run_threads and
// Session::join_alone: the file parses; a process per worker with a compute and a comm track; the
// optimizer's "step" spans (one per step(), iteration = the step's number) hold its waits and
// updates and every track's spans nest; every gradient arrow has both ends, from a comm thread's
// bucket of step t to the update of step t + K (Pipe-SGD), or to finish()'s; the window keeps its
// steps only; a failure still writes the file, with the reason; bad settings are one-line
// UsageErrors before anything runs. Session::join_mpi is tested under mpirun by
// tests/api_mpi/api_session_main.cpp (trace).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../core/temp_dir.h"
#include "../core/trace_checks.h"
#include "pipesgd/pipesgd.h"
#include "pipesgd/session.h"
#include "test_modules.h"

namespace {

using pipesgd::DistributedOptimizer;
using pipesgd::TempDir;
using pipesgd::Worker;
using pipesgd::WorldOptions;
using namespace trace_checks;  // the trace file checks (tests/core/trace_checks.h)

constexpr int kSteps = 10;
constexpr int kStaleness = 2;  // pipe's default --staleness-k

nlohmann::json read_trace(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path << " was not written";
  return nlohmann::json::parse(in);
}

// `steps` steps of `spec` on a three-layer net, every worker on its own batches; `throw_at_step`
// >= 0: worker 1 throws there instead of stepping.
void train(Worker& worker, const std::string& spec, int steps, int throw_at_step = -1) {
  torch::manual_seed(11);
  pipesgd_test::ThreeLayerNet model;
  DistributedOptimizer optimizer(worker, model, spec);
  torch::manual_seed(100 + worker.rank());
  for (int step = 0; step < steps; ++step) {
    if (step == throw_at_step && worker.rank() == 1) throw pipesgd::DataError("worker 1 stopped on purpose");
    torch::mse_loss(model->forward(torch::rand({6, 4})), torch::rand({6, 3})).backward();
    optimizer.step();
  }
  optimizer.finish();
}

nlohmann::json traced_run_threads(const std::string& path, const std::string& iterations) {
  WorldOptions world;
  world.workers = 2;
  world.timeout = std::chrono::seconds(60);
  world.trace = path;
  world.trace_iterations = iterations;
  pipesgd::run_threads(world, [](Worker& worker) { train(worker, "pipe", kSteps); });
  return read_trace(path);
}

TEST(WorldTrace, RunThreadsRecordsEveryWorkersTracksStepsAndArrows) {
  const TempDir dir;
  const nlohmann::json file = traced_run_threads(dir.file("trace.json"), "");
  EXPECT_EQ(file.at("otherData").at("dropped_events"), 0);
  EXPECT_FALSE(file.at("otherData").contains("failure"));
  const nlohmann::json& events = file.at("traceEvents");

  const std::map<int, std::string> processes = {{0, "worker 0"}, {1, "worker 1"}};
  EXPECT_EQ(process_names(events), processes);
  const std::map<Track, std::string> threads = thread_names(events);
  const std::map<std::string, int> compute_and_comm = {{"comm", 1}, {"compute", 1}};
  for (int w = 0; w < 2; ++w) EXPECT_EQ(thread_kinds(threads, w), compute_and_comm) << "worker " << w;

  const std::map<Track, std::vector<Span>> tracks = spans_by_track(events);
  expect_spans_nest(tracks, threads);
  std::map<std::string, std::set<std::string>> names_by_thread;  // "compute" / "comm": span names
  for (const auto& [track, spans] : tracks) {
    const std::string& thread = threads.at(track);
    for (const Span& span : spans) names_by_thread[thread == "compute" ? "compute" : "comm"].insert(span.name);
    if (thread != "compute") continue;
    // One step span per step(), its iteration the step's number, holding that step's other spans:
    // in step t, the beginning of step t + 1 waits for and applies step t + 1 - K's gradient.
    std::vector<std::int64_t> steps;
    int updates_in_steps = 0;
    for (const Span& span : spans) {
      if (span.name == "step") steps.push_back(span.iteration);
      if (span.name == "update" || span.name == "wait") {
        const Span* step = nullptr;
        for (const Span& candidate : spans) {
          if (candidate.name == "step" && candidate.start <= span.start && span.end <= candidate.end + kNanosecond) {
            step = &candidate;
          }
        }
        // (finish() applies the last updates after the last step.)
        if (step != nullptr) {
          EXPECT_EQ(span.iteration, step->iteration + 1) << span.name << " inside step " << step->iteration;
          updates_in_steps += span.name == "update";
        }
      }
    }
    std::sort(steps.begin(), steps.end());
    std::vector<std::int64_t> expected(kSteps);
    for (int t = 0; t < kSteps; ++t) expected[static_cast<std::size_t>(t)] = t;
    EXPECT_EQ(steps, expected) << "worker " << track.first;
    EXPECT_EQ(updates_in_steps, kSteps - kStaleness + 1) << "worker " << track.first;  // steps K-1..
  }
  for (const char* name : {"step", "update", "wait"}) EXPECT_EQ(names_by_thread["compute"].count(name), 1u) << name;
  for (const char* name : {"bucket", "allreduce"}) EXPECT_EQ(names_by_thread["comm"].count(name), 1u) << name;

  // Arrows: one per worker and step, from the comm thread's bucket of step t to the compute thread's
  // update of step t + K, or of finish() (which runs after the last step began step kSteps).
  const Flows flows = flows_by_id(events);
  EXPECT_EQ(flows.size(), static_cast<std::size_t>(2 * kSteps));
  for (const auto& [from, to] : gradient_arrows(flows, tracks, threads)) {
    EXPECT_EQ(to->name, "update");
    if (from->iteration + kStaleness < kSteps) {
      EXPECT_EQ(to->iteration, from->iteration + kStaleness) << "bucket of step " << from->iteration;
    } else {
      EXPECT_EQ(to->iteration, kSteps) << "bucket of step " << from->iteration << " (applied by finish())";
    }
  }
}

TEST(WorldTrace, TraceIterationsKeepsItsStepsOnly) {
  const TempDir dir;
  const nlohmann::json events = traced_run_threads(dir.file("window.json"), "3:5").at("traceEvents");
  std::set<std::int64_t> iterations;
  std::set<std::string> threads_with_events;
  const std::map<Track, std::string> threads = thread_names(events);
  for (const nlohmann::json& event : events) {
    if (event.at("ph") == "M") continue;
    threads_with_events.insert(threads.at({event.at("pid"), event.at("tid")}));
    if (event.contains("args")) iterations.insert(event["args"].value("iteration", std::int64_t{-1}));
  }
  const std::set<std::int64_t> window = {3, 4};
  EXPECT_EQ(iterations, window);
  EXPECT_EQ(threads_with_events.size(), 2u);  // compute and comm (both workers name them alike)
  std::map<int, std::set<std::int64_t>> steps_by_worker;
  for (const auto& [track, spans] : spans_by_track(events)) {
    for (const Span& span : spans) {
      if (span.name == "step") steps_by_worker[track.first].insert(span.iteration);
    }
  }
  const std::map<int, std::set<std::int64_t>> steps = {{0, window}, {1, window}};
  EXPECT_EQ(steps_by_worker, steps);
}

TEST(WorldTrace, AFailedWorldStillWritesItsTraceAndRethrowsTheRootCause) {
  const TempDir dir;
  WorldOptions world;
  world.workers = 2;
  world.timeout = std::chrono::seconds(60);
  world.trace = dir.file("failed.json");
  try {
    pipesgd::run_threads(world, [](Worker& worker) { train(worker, "pipe", kSteps, /*throw_at_step=*/4); });
    FAIL() << "no exception";
  } catch (const pipesgd::DataError& error) {
    EXPECT_STREQ(error.what(), "worker 1 stopped on purpose");
  }
  const nlohmann::json file = read_trace(world.trace);
  EXPECT_EQ(file.at("otherData").at("failure"), "worker 1 stopped on purpose");
  std::set<std::int64_t> worker_1_steps;
  for (const auto& [track, spans] : spans_by_track(file.at("traceEvents"))) {
    for (const Span& span : spans) {
      if (track.first == 1 && span.name == "step") worker_1_steps.insert(span.iteration);
    }
  }
  const std::set<std::int64_t> before_the_failure = {0, 1, 2, 3};
  EXPECT_EQ(worker_1_steps, before_the_failure);
}

TEST(WorldTrace, SessionAloneWritesAtShutdownAndAfterFailure) {
  const TempDir dir;
  WorldOptions options;
  options.trace = dir.file("alone.json");
  {
    std::unique_ptr<pipesgd::Session> session = pipesgd::Session::join_alone(options);
    train(session->worker(), "dsync", 3);
    EXPECT_FALSE(std::filesystem::exists(options.trace));  // written at shutdown
    session->shutdown();
  }
  const nlohmann::json events = read_trace(options.trace).at("traceEvents");
  EXPECT_EQ(process_names(events), (std::map<int, std::string>{{0, "worker 0"}}));
  std::set<std::int64_t> steps;
  for (const auto& [track, spans] : spans_by_track(events)) {
    for (const Span& span : spans) {
      if (span.name == "step") steps.insert(span.iteration);
    }
  }
  EXPECT_EQ(steps, (std::set<std::int64_t>{0, 1, 2}));

  options.trace = dir.file("failed.json");
  std::unique_ptr<pipesgd::Session> session = pipesgd::Session::join_alone(options);
  train(session->worker(), "dsync", 2);
  session->fail("given up");
  EXPECT_EQ(read_trace(options.trace).at("otherData").at("failure"), "given up");
}

std::string usage_error_of(const WorldOptions& options) {
  bool ran = false;
  try {
    pipesgd::run_threads(options, [&](Worker&) { ran = true; });
  } catch (const pipesgd::UsageError& error) {
    EXPECT_FALSE(ran) << "the world started";
    return error.what();
  }
  return "(no UsageError)";
}

TEST(WorldTrace, BadSettingsAreUsageErrorsAtWorldStart) {
  const TempDir dir;
  WorldOptions options;
  options.trace = dir.file("t.json");
  options.trace_iterations = "5";
  EXPECT_EQ(usage_error_of(options), "trace_iterations '5': expected A:B (iterations A <= t < B), A: or :B");
  options.trace_iterations = "4:4";
  EXPECT_EQ(usage_error_of(options), "trace_iterations '4:4': the window is empty");
  EXPECT_THROW(pipesgd::Session::join_alone(options), pipesgd::UsageError);

  options.trace = "";
  options.trace_iterations = "1:3";
  EXPECT_EQ(usage_error_of(options), "trace_iterations needs trace (the file to write)");

  std::ofstream(dir.file("a_file")) << "not a directory";
  options.trace = dir.file("a_file") + "/t.json";
  options.trace_iterations = "";
  const std::string message = usage_error_of(options);
  EXPECT_EQ(message.rfind("trace '" + dir.file("a_file") + "': cannot create directory", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

}  // namespace
