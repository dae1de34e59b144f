// A run stopped early by its interrupt flag (TrainConfig::interrupt, set by SIGINT / SIGTERM in the
// CLI): every worker stops at one iteration S and the run reports [0, S) as a run of S iterations
// would; summary.json is marked interrupted and metrics.jsonl holds those S iterations (streamed
// while the run goes). Where each rank is a process, the ranks stop separately and never hang.
// The flag is set by rank 0's model at a given iteration, so the tests need no signal.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/early_stop.h"
#include "pipesgd/train/trainer.h"
#include "resume_checks.h"
#include "temp_dir.h"
#include "test_world.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

constexpr std::int64_t kLength = 400;  // long enough never to end before the flag stops it
constexpr std::int64_t kFlagAt = 20;

// Behaves like `inner`; if `raises`, sets `flag` to `signal` at its forward pass of iteration
// `at` (its call with that index) and, if `then` is given, calls it there too.
class FlaggingModel final : public Model {
 public:
  FlaggingModel(std::unique_ptr<Model> inner, std::atomic<int>* flag, int signal, std::int64_t at,
                std::function<void()> then)
      : inner_(std::move(inner)), flag_(flag), signal_(signal), at_(at), then_(std::move(then)) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients, const SegmentReadyFn& ready) override {
    if (flag_ != nullptr && calls_++ == at_) {
      flag_->store(signal_);
      if (then_) then_();
    }
    return inner_->forward_backward(batch, gradients, ready);
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
  std::atomic<int>* flag_;
  int signal_;
  std::int64_t at_;
  std::function<void()> then_;
  std::int64_t calls_ = 0;
};

// The models of a run whose first built replica (rank 0's among threads) sets `flag`.
ModelFactory flagging(std::atomic<int>& flag, int signal = SIGINT, std::int64_t at = kFlagAt,
                      std::function<void()> then = {}) {
  auto built = std::make_shared<std::atomic<int>>(0);
  return [&flag, built, signal, at, then](std::uint64_t seed) -> std::unique_ptr<Model> {
    const bool first = (*built)++ == 0;
    return std::make_unique<FlaggingModel>(softmax_factory()(seed), first ? &flag : nullptr, signal, at, then);
  };
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
  return records;
}

struct Method {
  const char* name;
  const char* spec;
  int servers = 0;
  OptionValues options;
};

void PrintTo(const Method& method, std::ostream* out) { *out << method.name; }

const Method kMethods[] = {
    {"dsync", "dsync", 0, {}},
    {"pipe", "pipe", 0, {}},
    {"sapipe", "sapipe", 0, {{"--stale-layers", "1"}}},
    {"odsgd", "odsgd", 2, {{"--warmup-iters", "5"}}},
};

TrainConfig method_config(const Method& method) {
  TrainConfig config = tiny_config(method.spec, 3, method.servers, method.options);
  config.iterations = kLength;
  return config;
}

class InterruptedRun : public ::testing::TestWithParam<Method> {};

// Stopped at S, the run ends as a run of S iterations: every replica's weights bit for bit (a
// pipelined method applies what is in flight, as at a run's end). (Not its bytes: the run of S
// iterations also ends its last, partial epoch, with a reduction; the interrupted one does not.)
TEST_P(InterruptedRun, EndsAsTheRunOfItsLength) {
  TrainConfig config = method_config(GetParam());
  std::atomic<int> flag{0};
  config.interrupt = &flag;
  TempDir out;
  config.out_dir = out.path();
  const RunSummary interrupted = run_training(config, flagging(flag), data());
  ASSERT_TRUE(interrupted.interrupted);
  const std::int64_t stop = interrupted.interrupted->at_iteration;
  EXPECT_GT(stop, kFlagAt);
  EXPECT_LT(stop, kLength);
  EXPECT_EQ(interrupted.interrupted->signal, SIGINT);
  EXPECT_EQ(interrupted.interrupted->of_iterations, kLength);
  EXPECT_EQ(interrupted.interrupted->workers_reported, 3);
  EXPECT_EQ(interrupted.timing.iterations, stop);

  TrainConfig shorter = method_config(GetParam());
  shorter.iterations = stop;
  const RunSummary expected = run_training(shorter, softmax_factory(), data());
  EXPECT_FALSE(expected.interrupted);
  EXPECT_TRUE(BitIdentical(expected, interrupted));

  // summary.json says so; metrics.jsonl holds the iterations [0, S), each once, in order.
  std::ifstream summary_file(out.file("summary.json"));
  const nlohmann::json summary = nlohmann::json::parse(summary_file);
  EXPECT_EQ(summary["interrupted"]["signal"], "SIGINT");
  EXPECT_EQ(summary["interrupted"]["at_iteration"], stop);
  EXPECT_EQ(summary["iterations"], stop);
  std::int64_t next = 0;
  for (const nlohmann::json& record : read_lines(out.file("metrics.jsonl"))) {
    if (record["type"] == "epoch") continue;
    EXPECT_EQ(record["iteration"], next++);
  }
  EXPECT_EQ(next, stop);
}

INSTANTIATE_TEST_SUITE_P(Methods, InterruptedRun, ::testing::ValuesIn(kMethods),
                         [](const ::testing::TestParamInfo<Method>& info) { return std::string(info.param.name); });

// A flag that is never set, or set in rank 0's last iteration (every worker's decision then lands
// past the end: rank 0 published that iteration before it started it), changes nothing.
TEST(InterruptedRunTest, AFlagInTheLastIterationIsNoInterruption) {
  TrainConfig config = tiny_config("pipe", 2);
  std::atomic<int> flag{0};
  config.interrupt = &flag;
  const RunSummary plain = run_training(config, softmax_factory(), data());
  EXPECT_FALSE(plain.interrupted);
  const RunSummary late = run_training(config, flagging(flag, SIGINT, config.iterations - 1), data());
  EXPECT_FALSE(late.interrupted);
  EXPECT_EQ(late.timing.iterations, config.iterations);
  EXPECT_TRUE(BitIdentical(plain, late));
}

// metrics.jsonl grows while the run goes: rank 0 waits at iteration 30 until the file holds
// iterations 0..19 at least (the stream writes every second), then the run goes on.
TEST(InterruptedRunTest, MetricsAreStreamedWhileTheRunGoes) {
  TrainConfig config = tiny_config("dsync", 2);
  config.iterations = 60;
  TempDir out;
  config.out_dir = out.path();
  std::atomic<int> unused{0};
  std::int64_t lines_seen = 0;
  const auto wait_for_lines = [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      std::ifstream in(out.file("metrics.jsonl"));
      std::string line;
      std::int64_t complete = 0;
      while (std::getline(in, line) && !in.eof()) ++complete;  // a last line without '\n' may be partial
      lines_seen = complete;
      if (lines_seen >= 20) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  };
  // The hook runs inside rank 0's iteration 30; the flag it sets is not the run's (config.interrupt
  // stays nullptr), so the run completes.
  run_training(config, flagging(unused, SIGINT, 30, wait_for_lines), data());
  EXPECT_GE(lines_seen, 20);
  EXPECT_LE(lines_seen, 30);
  EXPECT_EQ(read_lines(out.file("metrics.jsonl")).size(), 61u);  // 60 iterations and the epoch
}

// Each rank a process of its own (run_training_rank; here threads over a LocalFabric, each rank
// with its own EarlyStop of one worker): the ranks stop separately, each at its own boundary if it
// was signalled or, told by a rank that stopped, in a wait; none hangs, each reports what it
// completed and the signal, and rank 0 writes its own times, marked interrupted. Every rank
// signalled (as mpirun does), or rank 1 only (the others learn it from rank 1's notice).
TEST(InterruptedRunTest, RanksThatAreProcessesStopWithoutHanging) {
  for (const auto& [spec, rank_1_only] : {std::pair{"dsync", false}, std::pair{"pipe", false}, std::pair{"pipe", true}}) {
    SCOPED_TRACE(concat(spec, rank_1_only ? ", rank 1 signalled" : ", every rank signalled"));
    TrainConfig config = tiny_config(spec, 3);
    config.iterations = kLength;
    set_timeout(config, std::chrono::seconds(60));  // a hang: a timed-out wait throws, failing the run
    std::atomic<int> flag{0};
    TempDir out;
    config.out_dir = out.path();
    std::vector<RunSummary> summaries(3);
    const ModelFactory factory = flagging(flag, SIGTERM);
    run_ranks(3, [&](int rank, Transport& transport) {
      TrainConfig own = config;
      own.interrupt = !rank_1_only || rank == 1 ? &flag : nullptr;
      summaries[static_cast<std::size_t>(rank)] = run_training_rank(own, factory, data(), transport);
    });
    for (const RunSummary& summary : summaries) {
      ASSERT_TRUE(summary.interrupted);
      EXPECT_EQ(summary.interrupted->signal, SIGTERM);
      EXPECT_EQ(summary.interrupted->workers_reported, 1);
      EXPECT_GT(summary.interrupted->at_iteration, 0);
      EXPECT_LT(summary.interrupted->at_iteration, kLength);
    }
    const std::int64_t rank0 = summaries[0].interrupted->at_iteration;
    std::ifstream summary_file(out.file("summary.json"));
    const nlohmann::json summary = nlohmann::json::parse(summary_file);
    EXPECT_EQ(summary["interrupted"]["signal"], "SIGTERM");
    EXPECT_EQ(summary["interrupted"]["at_iteration"], rank0);
    EXPECT_EQ(summary["interrupted"]["workers_reported"], 1);
    std::int64_t iterations = 0;
    for (const nlohmann::json& record : read_lines(out.file("metrics.jsonl"))) iterations += record["type"] == "iteration";
    EXPECT_EQ(iterations, rank0);
  }
}

// A peer's interruption notice is told from any other failure by its reason.
TEST(InterruptedRunTest, PeerInterruptionNotices) {
  EXPECT_EQ(interruption_notice(SIGINT), "interrupted by SIGINT");
  EXPECT_EQ(peer_interruption(PeerFailedError("ring allreduce: recv from rank 1 (tag gradients:3 step 0 segment 0) "
                                              "on rank 0 aborted: rank 1 failed: interrupted by SIGTERM")),
            SIGTERM);
  EXPECT_EQ(peer_interruption(PeerFailedError("x aborted: rank 2 failed: " + interruption_notice(SIGINT))), SIGINT);
  EXPECT_EQ(peer_interruption(PeerFailedError("x aborted: rank 2 failed: ring allreduce: timed out after 5 s")),
            std::nullopt);
}

}  // namespace
}  // namespace pipesgd
