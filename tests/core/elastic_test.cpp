// --restarts R (train/elastic.h): a run whose worker fails rolls back to its newest complete commit
// and goes on, among threads (run_training), up to R times, and ends with exactly (bit for bit, on
// every rank) the weights of the same run never interrupted. Every registered method, a failure
// during a commit, during the recovery, two in a row, a hang, restarts used up; and the pieces:
// metrics.jsonl's lines kept after a rollback, pipesgdrun's environment, the config's checks.
// (The softmax model of tiny_run.h over resume_checks.h's data: 40 iterations, a commit every 10.
// A crash is reported to the survivors at once by the launcher, so only the hang waits for a
// timeout; nothing here asserts a time.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "pipesgd/algo/registry.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/elastic.h"
#include "pipesgd/train/fault_injection.h"
#include "pipesgd/train/run_config.h"
#include "pipesgd/train/run_context.h"
#include "pipesgd/train/trainer.h"
#include "resume_checks.h"
#include "temp_dir.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

constexpr std::int64_t kRunLength = 40;  // iterations; commits (kEvery = 10) after 10, 20 and 30

::testing::AssertionResult Contains(const std::string& text, const std::string& fragment) {
  if (text.find(fragment) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' lacks '" << fragment << "'";
}

// The asynchronous parameter-server methods apply the pushes in the order they arrive: bit-identical
// runs only with one worker (as in ps_checkpoint_test.cpp).
bool arrival_order_matters(const MethodDescriptor& method) { return method.name == "asgd" || method.name == "dcasgd"; }

// mgwfbp plans its buckets from measured times: with more than two workers the plan changes the
// allreduce's rounding, so two runs may differ (a sum of two floats does not depend on the order).
bool plan_depends_on_timing(const MethodDescriptor& method) { return method.name == "mgwfbp"; }

// One world of the every-method test: `workers` workers plus `servers` servers.
struct MethodWorld {
  const MethodDescriptor* method;
  int workers;
  int servers;
};

std::string world_name(const MethodWorld& world) {
  std::string name = concat(world.method->name, "_", world.workers, world.workers == 1 ? "worker" : "workers");
  if (world.servers > 0) name += concat("_", world.servers, world.servers == 1 ? "server" : "servers");
  return name;
}

void PrintTo(const MethodWorld& world, std::ostream* out) { *out << world_name(world); }

// Worlds of 2 and 3 ranks for every registered method: 2 and 3 workers (one server more for the
// synchronous parameter-server methods; mgwfbp with 2 only); the asynchronous ones with 1 worker and
// 1 or 2 servers.
std::vector<MethodWorld> every_method_world() {
  std::vector<MethodWorld> worlds;
  for (const MethodDescriptor* method : method_registry()) {
    if (arrival_order_matters(*method)) {
      worlds.push_back({method, 1, 1});
      worlds.push_back({method, 1, 2});
      continue;
    }
    const int servers = method->traits.uses_servers ? 1 : 0;
    worlds.push_back({method, 2, servers});
    if (!plan_depends_on_timing(*method)) worlds.push_back({method, 3, servers});
  }
  return worlds;
}

// `spec` on `workers` workers for kRunLength iterations (the method options of the resume tests:
// sapipe with one stale layer, odsgd with a short warm-up so that its local updater runs).
TrainConfig elastic_config(const std::string& spec, int workers, int servers = 0) {
  OptionValues options;
  if (spec == "sapipe") options.set("--stale-layers", "1");
  if (spec == "odsgd") options.set("--warmup-iters", "5");
  TrainConfig config = tiny_config(spec, workers, servers, options);
  config.iterations = kRunLength;
  return config;
}

// `config` with --restarts `restarts`, commits every kEvery (in memory unless `dir` is given),
// worker `rank` crashing at the start of `iteration` in the first attempt.
TrainConfig restarting(TrainConfig config, int restarts, int rank, std::int64_t iteration,
                       const std::string& dir = "") {
  config.reliability.restarts = restarts;
  config.reliability.checkpoint_every = kEvery;
  config.reliability.checkpoint_dir = dir;
  config.reliability.fault.rank = rank;
  config.reliability.fault.iteration = iteration;
  config.reliability.fault.kind = FaultInjection::Kind::kCrash;
  return config;
}

FaultInjection crash(int rank, std::int64_t iteration) {
  FaultInjection fault;
  fault.rank = rank;
  fault.iteration = iteration;
  fault.kind = FaultInjection::Kind::kCrash;
  return fault;
}

RunSummary train(const TrainConfig& config) { return run_training(config, softmax_factory(), data()); }

// The restarted run completed, trained and ended as `uninterrupted` did, bit for bit on every rank.
void expect_recovered(const RunSummary& uninterrupted, const RunSummary& restarted, std::size_t recoveries) {
  EXPECT_EQ(restarted.timing.iterations, kRunLength);
  EXPECT_TRUE(Trained(restarted));
  EXPECT_TRUE(BitIdentical(uninterrupted, restarted)) << "the restarted run's weights differ";
  // The epochs' records (their losses summed over the attempts) are the uninterrupted run's too.
  ASSERT_EQ(restarted.epochs.size(), uninterrupted.epochs.size());
  for (std::size_t e = 0; e < restarted.epochs.size(); ++e) {
    EXPECT_EQ(restarted.epochs[e].iterations, uninterrupted.epochs[e].iterations) << "epoch " << e;
    EXPECT_EQ(restarted.epochs[e].train_loss, uninterrupted.epochs[e].train_loss) << "epoch " << e;
  }
  ASSERT_EQ(restarted.recoveries.size(), recoveries);
  // The last attempt resumed from the commit it says (not from the start, which would end alike).
  const std::int64_t last_commit = restarted.recoveries.back().rolled_back_to;
  EXPECT_EQ(restarted.reliability.resumed_from, last_commit > 0 ? last_commit : -1);
  for (std::size_t k = 0; k < recoveries; ++k) {
    const Recovery& recovery = restarted.recoveries[k];
    std::printf("[ recovery ] %d: reached %lld, rolled back to %lld: %s\n", recovery.attempt,
                static_cast<long long>(recovery.reached), static_cast<long long>(recovery.rolled_back_to),
                recovery.failure.c_str());
    EXPECT_EQ(recovery.attempt, static_cast<int>(k) + 1);
    EXPECT_FALSE(recovery.failure.empty());
    EXPECT_EQ(recovery.rolled_back_to % kEvery, 0) << "not a commit";
    EXPECT_GE(recovery.reached, recovery.rolled_back_to);
  }
}

// A fault iteration in [7, 35] and a rank, from the world's name (FNV-1a: the same on every run).
std::uint64_t name_hash(const std::string& name) {
  std::uint64_t hash = 14695981039346656037ull;
  for (const char c : name) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return hash;
}

// ---- 1. every method ----------------------------------------------------------------------------

class ElasticEveryMethod : public ::testing::TestWithParam<MethodWorld> {};

TEST_P(ElasticEveryMethod, ACrashIsRolledBackToTheNewestCommitBitIdentically) {
  const MethodWorld& world = GetParam();
  const std::uint64_t hash = name_hash(world_name(world));
  const std::int64_t fault_at = 7 + static_cast<std::int64_t>(hash % 29);
  const int rank = static_cast<int>((hash / 29) % static_cast<std::uint64_t>(world.workers));
  SCOPED_TRACE(concat("worker ", rank, " crashes at iteration ", fault_at));
  const TrainConfig config = elastic_config(world.method->name, world.workers, world.servers);

  const RunSummary uninterrupted = train(config);
  ASSERT_TRUE(Trained(uninterrupted));
  EXPECT_TRUE(uninterrupted.recoveries.empty());
  const RunSummary restarted = train(restarting(config, 1, rank, fault_at));
  expect_recovered(uninterrupted, restarted, 1);
  if (restarted.recoveries.size() != 1) return;
  const Recovery& recovery = restarted.recoveries[0];
  // The crashed worker completed its iterations before `fault_at` and wrote its part of every commit
  // up to them; the commit of a crash at its very iteration may still miss a server's part (the
  // servers stop at once), then the commit before it is the newest complete one.
  EXPECT_LE(recovery.rolled_back_to, fault_at);
  const std::int64_t newest = fault_at / kEvery * kEvery;
  if (fault_at % kEvery != 0) {
    EXPECT_EQ(recovery.rolled_back_to, newest);
  } else {
    EXPECT_GE(recovery.rolled_back_to, newest - kEvery);
  }
  EXPECT_GE(recovery.reached, fault_at);
  // The workers of nocomm never wait for one another: a survivor may have run to the end.
  const std::int64_t ahead =
      world.method->traits.compute_alone ? kRunLength : config.method.options->staleness();
  EXPECT_LE(recovery.iterations_redone(), kEvery + ahead);
  EXPECT_GE(recovery.detection_seconds, 0) << "the injected crash's moment was not recorded";
}

INSTANTIATE_TEST_SUITE_P(Registry, ElasticEveryMethod, ::testing::ValuesIn(every_method_world()),
                         [](const ::testing::TestParamInfo<MethodWorld>& info) { return world_name(info.param); });

// ---- 2.-6. failures in the commit, in the recovery, in a row; restarts used up; a hang ------------

// A worker dies halfway through writing its part of the commit of 20 (after iteration 19): that
// commit is torn (its other parts were written), so the run rolls back to 10.
TEST(ElasticRestarts, AFailureDuringACommitRollsBackToTheCommitBefore) {
  for (const char* spec : {"dsync", "pssync"}) {
    SCOPED_TRACE(spec);
    const TrainConfig config = elastic_config(spec, 2, std::string(spec) == "pssync" ? 1 : 0);
    const RunSummary uninterrupted = train(config);
    TempDir dir;
    TrainConfig failing = restarting(config, 1, 1, 19, dir.path());
    failing.reliability.fault.point = FaultInjection::Point::kCheckpoint;
    const RunSummary restarted = train(failing);
    expect_recovered(uninterrupted, restarted, 1);
    if (restarted.recoveries.size() != 1) continue;
    EXPECT_EQ(restarted.recoveries[0].rolled_back_to, 10);
    EXPECT_GE(restarted.recoveries[0].reached, 19);
  }
}

// The run rolls back from a crash at 25 to 20, and the restart fails again at once, at iteration
// 20: it rolls back to 20 again and completes.
TEST(ElasticRestarts, AFailureDuringTheRecoveryIsRecoveredFromToo) {
  const TrainConfig config = elastic_config("dsync", 2);
  const RunSummary uninterrupted = train(config);
  TrainConfig failing = restarting(config, 2, 1, 25);
  failing.reliability.restart_faults = {crash(0, 20)};
  const RunSummary restarted = train(failing);
  expect_recovered(uninterrupted, restarted, 2);
  if (restarted.recoveries.size() != 2) return;
  EXPECT_EQ(restarted.recoveries[0].rolled_back_to, 20);
  EXPECT_GE(restarted.recoveries[0].reached, 25);
  EXPECT_EQ(restarted.recoveries[1].rolled_back_to, 20);
  // The second attempt resumed at 20 and failed before completing an iteration: nothing to redo.
  EXPECT_EQ(restarted.recoveries[1].reached, 20);
  EXPECT_EQ(restarted.recoveries[1].iterations_redone(), 0);
}

// Two crashes on different ranks at different iterations: rank 1 at 13, then rank 0 at 32.
TEST(ElasticRestarts, TwoFailuresInARowOnDifferentRanks) {
  const TrainConfig config = elastic_config("pipe", 3);
  const RunSummary uninterrupted = train(config);
  TrainConfig failing = restarting(config, 2, 1, 13);
  failing.reliability.restart_faults = {crash(0, 32)};
  const RunSummary restarted = train(failing);
  expect_recovered(uninterrupted, restarted, 2);
  if (restarted.recoveries.size() != 2) return;
  EXPECT_EQ(restarted.recoveries[0].rolled_back_to, 10);
  EXPECT_EQ(restarted.recoveries[1].rolled_back_to, 30);
  EXPECT_TRUE(Contains(restarted.recoveries[0].failure, "worker 1"));
  EXPECT_TRUE(Contains(restarted.recoveries[1].failure, "worker 0"));
}

// Pipe's in-memory commit does not drain the pipeline: the commit after iteration 30 (K = 2) takes
// the gradient of iteration 29 when its allreduce ends on its own, in the wait of iteration 31. A
// worker that dies at the start of 31 never completed it, so the run rolls back to 20, and still
// ends bit-identical; one that dies at 32 finds the commit of 30 complete.
TEST(ElasticRestarts, APipeCommitCompletesWhenItsAllreducesInFlightEnd) {
  const TrainConfig config = elastic_config("pipe", 2);
  const RunSummary uninterrupted = train(config);
  for (const auto& [fault_at, expected] : {std::pair{31, 20}, std::pair{32, 30}}) {
    const RunSummary restarted = train(restarting(config, 1, 0, fault_at));
    expect_recovered(uninterrupted, restarted, 1);
    if (restarted.recoveries.size() != 1) continue;
    EXPECT_EQ(restarted.recoveries[0].rolled_back_to, expected) << "a crash at " << fault_at;
  }
}

// A second failure with --restarts 1: the run fails with the failure, saying the restarts are used
// up and where its newest commit (20, after the first rollback to 10) is; that commit is complete
// and valid in --checkpoint-dir.
TEST(ElasticRestarts, RestartsUsedUpThrowWhereTheNewestCommitIs) {
  const TrainConfig config = elastic_config("dsync", 2);
  TempDir dir;
  TrainConfig failing = restarting(config, 1, 1, 15, dir.path());
  failing.reliability.restart_faults = {crash(0, 27)};
  try {
    train(failing);
    ADD_FAILURE() << "the run completed after two failures with --restarts 1";
  } catch (const CommError& error) {
    const std::string message = error.what();
    EXPECT_TRUE(Contains(message, "used up"));
    EXPECT_TRUE(Contains(message, "iteration 20"));
    EXPECT_TRUE(Contains(message, dir.path()));
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line";
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected a CommError, got: " << error.what();
  }
  const std::vector<std::string> parts{"shared", worker_part(0), worker_part(1)};
  std::vector<std::string> warnings;
  const auto newest =
      find_newest_valid_checkpoint(dir.path(), parts, [&](const std::string& line) { warnings.push_back(line); });
  ASSERT_TRUE(newest.has_value()) << "no complete valid commit in " << dir.path();
  EXPECT_EQ(newest->iteration, 20);
  for (const std::string& part : parts) EXPECT_EQ(newest->parts.count(part), 1u) << part;
}

// A worker that hangs (alive, silent) is found by the survivors' --comm-timeout; the run rolls back
// and completes.
TEST(ElasticRestarts, AHangIsRecoveredFromAfterTheCommTimeout) {
  TrainConfig config = elastic_config("dsync", 2);
  set_timeout(config, std::chrono::seconds(2));
  const RunSummary uninterrupted = train(config);
  TrainConfig failing = restarting(config, 1, 1, 23);
  failing.reliability.fault.kind = FaultInjection::Kind::kHang;
  const RunSummary restarted = train(failing);
  expect_recovered(uninterrupted, restarted, 1);
  if (restarted.recoveries.size() != 1) return;
  EXPECT_EQ(restarted.recoveries[0].rolled_back_to, 20);
  EXPECT_TRUE(Contains(restarted.recoveries[0].failure, "timed out"));
}

// ---- 7. the pieces -------------------------------------------------------------------------------

std::string iteration_line(std::int64_t t) {
  return nlohmann::json{{"type", "iteration"}, {"iteration", t}, {"loss", 0.5}}.dump();
}
std::string epoch_line(std::int64_t epoch, std::int64_t iterations) {
  return nlohmann::json{{"type", "epoch"}, {"epoch", epoch}, {"iterations", iterations}}.dump();
}

// Keeps the records before the commit (iterations before it, epochs that ended by it, resume and
// rollback records) in order, drops the rest and torn lines, and appends the rollback's record.
TEST(ElasticMetrics, KeptAfterARollbackAreTheRecordsBeforeTheCommit) {
  TempDir dir;
  const std::string resume = R"({"from_iteration":5,"type":"resume"})";
  const std::string earlier_rollback = R"({"attempt":1,"to_iteration":5,"type":"rollback"})";
  std::vector<std::string> expected{resume, earlier_rollback};
  std::string file = resume + "\n" + earlier_rollback + "\n";
  for (std::int64_t t = 5; t < 27; ++t) {
    file += iteration_line(t) + "\n";
    if (t < 20) expected.push_back(iteration_line(t));
    if (t == 9 || t == 19 || t == 24) {  // epochs ending after iterations 10, 20 (the commit) and 25
      file += epoch_line((t + 1) / 10, t + 1) + "\n";
      if (t + 1 <= 20) expected.push_back(epoch_line((t + 1) / 10, t + 1));
    }
  }
  file += R"({"note":"no type"})" "\n";
  file += R"({"type":"iteration","itera)";  // torn by the failure
  std::ofstream(dir.file("metrics.jsonl")) << file;

  Recovery recovery;
  recovery.attempt = 2;
  recovery.failure = "worker 1 died";
  recovery.rolled_back_to = 20;
  recovery.detection_seconds = 0.25;
  std::int64_t last_recorded = -1;
  const std::string kept = metrics_kept_after_rollback(dir.path(), recovery, &last_recorded);
  EXPECT_EQ(last_recorded, 27);

  std::vector<std::string> lines;
  std::istringstream in(kept);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), expected.size() + 1) << kept;
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(lines[i], expected[i]) << "line " << i;
  const nlohmann::json rollback = nlohmann::json::parse(lines.back());
  EXPECT_EQ(rollback["type"], "rollback");
  EXPECT_EQ(rollback["attempt"], 2);
  EXPECT_EQ(rollback["failure"], "worker 1 died");
  EXPECT_EQ(rollback["reached_iteration"], 27) << "unknown reach: the last iteration recorded";
  EXPECT_EQ(rollback["to_iteration"], 20);
  EXPECT_EQ(rollback["iterations_redone"], 7);
  EXPECT_EQ(rollback["detection_s"], 0.25);

  // A known reach is kept; an unknown detection time is null.
  recovery.reached = 30;
  recovery.detection_seconds = -1;
  const std::string again = metrics_kept_after_rollback(dir.path(), recovery);
  const nlohmann::json second = nlohmann::json::parse(again.substr(again.rfind('\n', again.size() - 2) + 1));
  EXPECT_EQ(second["reached_iteration"], 30);
  EXPECT_EQ(second["iterations_redone"], 10);
  EXPECT_TRUE(second["detection_s"].is_null());
}

TEST(ElasticMetrics, NoFileKeepsOnlyTheRollbackRecord) {
  TempDir dir;
  Recovery recovery;
  recovery.attempt = 1;
  recovery.rolled_back_to = 10;
  std::int64_t last_recorded = -1;
  const std::string kept = metrics_kept_after_rollback(dir.path(), recovery, &last_recorded);
  EXPECT_EQ(last_recorded, 0);
  ASSERT_EQ(std::count(kept.begin(), kept.end(), '\n'), 1) << kept;
  EXPECT_EQ(nlohmann::json::parse(kept)["type"], "rollback");
}

std::optional<LauncherRestart> restart_of(const std::map<std::string, std::string>& environment) {
  return launcher_restart([&](const char* name) -> const char* {
    const auto found = environment.find(name);
    return found == environment.end() ? nullptr : found->second.c_str();
  });
}

TEST(ElasticLauncher, ReadsPipesgdrunsEnvironment) {
  EXPECT_FALSE(restart_of({}).has_value());
  EXPECT_FALSE(restart_of({{"PIPESGD_RESTARTS", "3"}}).has_value()) << "no attempt: not launched so";
  const auto first = restart_of({{"PIPESGD_RESTART", "0"}, {"PIPESGD_RESTARTS", "3"}});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->attempt, 0);
  EXPECT_EQ(first->restarts, 3);
  EXPECT_EQ(first->failures, "");
  const auto later =
      restart_of({{"PIPESGD_RESTART", "2"}, {"PIPESGD_RESTARTS", "5"}, {"PIPESGD_RESTART_FAILURES", R"([{"attempt":1}])"}});
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->attempt, 2);
  EXPECT_EQ(later->restarts, 5);
  EXPECT_EQ(later->failures, R"([{"attempt":1}])");
}

TEST(ElasticLauncher, ABadValueIsAUsageError) {
  const std::vector<std::map<std::string, std::string>> bad{
      {{"PIPESGD_RESTART", "x"}, {"PIPESGD_RESTARTS", "1"}},  {{"PIPESGD_RESTART", "-1"}, {"PIPESGD_RESTARTS", "1"}},
      {{"PIPESGD_RESTART", "1x"}, {"PIPESGD_RESTARTS", "1"}}, {{"PIPESGD_RESTART", ""}, {"PIPESGD_RESTARTS", "1"}},
      {{"PIPESGD_RESTART", "1"}, {"PIPESGD_RESTARTS", "2 3"}}, {{"PIPESGD_RESTART", "1"}},
  };
  for (const auto& environment : bad) {
    std::string text;
    for (const auto& [name, value] : environment) text += concat(name, "='", value, "' ");
    SCOPED_TRACE(text);
    try {
      restart_of(environment);
      ADD_FAILURE() << "accepted";
    } catch (const UsageError& error) {
      EXPECT_TRUE(Contains(error.what(), "must be a non-negative integer"));
      EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
    }
  }
}

// The config's checks of --restarts: each a UsageError of one line naming the option.
TEST(ElasticConfig, MisuseIsAOneLineUsageError) {
  auto expect_usage_error = [](const TrainConfig& config, const std::string& fragment) {
    try {
      validate_train_config(config);
      ADD_FAILURE() << "accepted; expected an error with '" << fragment << "'";
    } catch (const UsageError& error) {
      EXPECT_TRUE(Contains(error.what(), fragment));
      EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << error.what();
    }
  };
  const TrainConfig fine = restarting(elastic_config("dsync", 2), 1, 1, 13);
  EXPECT_NO_THROW(validate_train_config(fine));  // the commits in memory: no --checkpoint-dir needed

  TrainConfig negative = fine;
  negative.reliability.restarts = -1;
  expect_usage_error(negative, "--restarts must be in [0, ");
  TrainConfig too_many = fine;
  too_many.reliability.restarts = kMaxRestarts + 1;
  expect_usage_error(too_many, "--restarts must be in [0, ");
  TrainConfig no_commits = fine;
  no_commits.reliability.checkpoint_every = 0;
  expect_usage_error(no_commits, "--checkpoint-every");
  TrainConfig no_restarts = fine;
  no_restarts.reliability.restarts = 0;
  no_restarts.reliability.restart_faults = {crash(0, 20)};
  no_restarts.reliability.checkpoint_dir = "/tmp";
  expect_usage_error(no_restarts, "--restarts R");
  // A restart's fault is checked as the first one is.
  TrainConfig bad_rank = fine;
  bad_rank.reliability.restart_faults = {crash(2, 20)};
  expect_usage_error(bad_rank, "rank 2 is not a worker");
}

}  // namespace
}  // namespace pipesgd
