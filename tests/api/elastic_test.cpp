// run_elastic / ElasticState (pipesgd/elastic.h): a worker failing mid-run rolls the world back to
// the newest commit every worker took, and the run ends with the weights of a run never
// interrupted (the oracle), for every worker-only method family; values, sync, the restart count
// used up, commits in a directory, and a user's own exception is not retried. Public headers only.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/pipesgd.h"
#include "test_modules.h"

namespace {

using pipesgd::DistributedOptimizer;
using pipesgd::DistributedOptimizerOptions;
using pipesgd::ElasticOptions;
using pipesgd::ElasticState;
using pipesgd::Worker;
using Net = pipesgd_test::ThreeLayerNet;

constexpr std::int64_t kBatch = 4;
constexpr std::int64_t kSteps = 23;
constexpr std::int64_t kCommitEvery = 5;

struct Case {
  std::string spec;
  int workers;
};
std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.spec << " on " << c.workers << " workers"; }

struct Data {
  torch::Tensor x, y;
};
Data make_data() {
  torch::manual_seed(7);
  return {torch::randn({kSteps * 3 * kBatch, 4}), torch::randint(0, 3, {kSteps * 3 * kBatch}, torch::kInt64)};
}

// The replicas start from one set of weights drawn on the test's thread (torch's generator is global).
std::vector<torch::Tensor> initial_weights() {
  torch::manual_seed(100);
  Net net;
  std::vector<torch::Tensor> weights;
  for (const auto& p : net->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

DistributedOptimizerOptions optimizer_options() {
  DistributedOptimizerOptions options;
  options.learning_rate = 0.05f;
  options.momentum = 0.9f;
  options.timeout = std::chrono::seconds(20);
  return options;
}

using Finals = std::vector<std::vector<torch::Tensor>>;

// Trains kSteps steps with a commit every kCommitEvery; worker `fail_rank` throws a CommError (as a
// transport would for a lost peer) when it reaches step `fail_at` in the first attempt.
Finals train(const Case& c, const ElasticOptions& base, int fail_rank, std::int64_t fail_at,
             std::vector<std::int64_t>* restored = nullptr) {
  const Data data = make_data();
  const std::vector<torch::Tensor> initial = initial_weights();
  Finals finals(static_cast<std::size_t>(c.workers));
  ElasticOptions options = base;
  options.world.workers = c.workers;
  pipesgd::run_elastic(options, [&](Worker& worker, ElasticState& state) {
    Net net;
    {
      torch::NoGradGuard no_grad;
      auto params = net->parameters();
      for (std::size_t k = 0; k < params.size(); ++k) params[k].copy_(initial[k]);
    }
    DistributedOptimizer optimizer(worker, *net, c.spec, optimizer_options());
    const bool restored_now = state.restore(optimizer);
    if (restored != nullptr && worker.rank() == 0) restored->push_back(restored_now ? state.restored_step() : -1);
    if (restored_now) {
      EXPECT_EQ(state.value("step"), state.restored_step());
    }
    for (std::int64_t& step = state.value("step"); step < kSteps;) {
      if (state.attempt() == 0 && worker.rank() == fail_rank && step == fail_at) {
        throw pipesgd::CommError("test: this worker's link failed");
      }
      const std::int64_t first = (step * c.workers + worker.rank()) * kBatch;
      torch::nn::functional::cross_entropy(net->forward(data.x.slice(0, first, first + kBatch)),
                                           data.y.slice(0, first, first + kBatch))
          .backward();
      ++step;
      if (step % kCommitEvery == 0) {
        state.step_and_commit(optimizer);
      } else {
        optimizer.step();
      }
    }
    optimizer.finish();
    for (const auto& p : net->parameters()) finals[static_cast<std::size_t>(worker.rank())].push_back(p.detach().clone());
  });
  return finals;
}

void expect_identical(const Finals& expected, const Finals& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (std::size_t r = 0; r < expected.size(); ++r) {
    ASSERT_EQ(expected[r].size(), actual[r].size());
    for (std::size_t k = 0; k < expected[r].size(); ++k) {
      EXPECT_TRUE(torch::equal(expected[r][k], actual[r][k])) << "worker " << r << ", parameter " << k;
    }
  }
}

class ElasticApi : public ::testing::TestWithParam<Case> {};

TEST_P(ElasticApi, AFailureRollsBackToTheNewestCommitAndEndsBitIdentical) {
  const Case c = GetParam();
  ElasticOptions options;
  options.restarts = 1;
  const Finals expected = train(c, options, /*fail_rank=*/-1, 0);
  std::vector<std::int64_t> restored;
  const Finals actual = train(c, options, /*fail_rank=*/c.workers - 1, /*fail_at=*/13, &restored);
  expect_identical(expected, actual);
  EXPECT_EQ(restored, (std::vector<std::int64_t>{-1, 10}));  // the first attempt, then the commit of step 10
}

INSTANTIATE_TEST_SUITE_P(Methods, ElasticApi,
                         ::testing::Values(Case{"dsync", 2}, Case{"pipe", 3}, Case{"pipe+int8", 2},
                                           Case{"dsync+wfbp", 3}),
                         [](const auto& info) {
                           std::string name = info.param.spec + "_" + std::to_string(info.param.workers) + "workers";
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

TEST(ElasticApiRuns, CommitsInADirectoryRollBackTheSameWay) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "pipesgd-elastic-api-test";
  std::filesystem::remove_all(dir);
  ElasticOptions options;
  options.restarts = 1;
  options.commit_dir = dir.string();
  const Finals expected = train({"pipe", 2}, ElasticOptions{}, -1, 0);
  std::vector<std::int64_t> restored;
  expect_identical(expected, train({"pipe", 2}, options, 0, 17, &restored));
  EXPECT_EQ(restored, (std::vector<std::int64_t>{-1, 15}));
  EXPECT_TRUE(std::filesystem::exists(dir / "checkpoint-000000000020-rank1.psgd"));
  std::filesystem::remove_all(dir);
}

TEST(ElasticApiRuns, AFailureBeforeTheFirstCommitStartsOver) {
  ElasticOptions options;
  options.restarts = 1;
  const Finals expected = train({"dsync", 2}, options, -1, 0);
  std::vector<std::int64_t> restored;
  expect_identical(expected, train({"dsync", 2}, options, 1, 3, &restored));
  EXPECT_EQ(restored, (std::vector<std::int64_t>{-1, -1}));
}

TEST(ElasticApiRuns, RestartsUsedUpRethrowWithWhereTheCommitIs) {
  ElasticOptions options;  // restarts 0
  try {
    train({"dsync", 2}, options, 1, 12);
    FAIL() << "no failure";
  } catch (const pipesgd::CommError& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("test: this worker's link failed"), std::string::npos) << what;
    EXPECT_NE(what.find("restarts 0 used up (the newest commit, of step 10, is in memory)"), std::string::npos) << what;
  }
}

TEST(ElasticApiRuns, AUsersOwnExceptionIsNotRetried) {
  ElasticOptions options;
  options.restarts = 3;
  options.world.workers = 2;
  std::atomic<int> calls{0};
  EXPECT_THROW(pipesgd::run_elastic(options,
                                    [&](Worker&, ElasticState&) {
                                      ++calls;
                                      throw std::runtime_error("user bug");
                                    }),
               std::runtime_error);
  EXPECT_EQ(calls.load(), 2);  // one attempt: each worker once
}

TEST(ElasticApiRuns, SyncGivesEveryWorkerRankZerosValues) {
  ElasticOptions options;
  options.world.workers = 3;
  std::vector<std::int64_t> seen(3);
  pipesgd::run_elastic(options, [&](Worker& worker, ElasticState& state) {
    state.value("epoch") = 10 + worker.rank();
    state.value("batch") = 100 * worker.rank();
    state.sync(worker);
    seen[static_cast<std::size_t>(worker.rank())] = state.value("epoch") * 1000 + state.value("batch");
  });
  EXPECT_EQ(seen, (std::vector<std::int64_t>{10000, 10000, 10000}));
}

TEST(ElasticApiRuns, BadOptionsAreOneLineUsageErrors) {
  ElasticOptions options;
  options.restarts = -1;
  EXPECT_THROW(pipesgd::run_elastic(options, [](Worker&, ElasticState&) {}), pipesgd::UsageError);
  ElasticOptions no_dir;
  int argc = 0;
  char** argv = nullptr;
  try {
    pipesgd::run_elastic_mpi(&argc, &argv, no_dir, [](Worker&, ElasticState&) {});
    FAIL() << "accepted";
  } catch (const pipesgd::UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("run_elastic_mpi needs ElasticOptions::commit_dir"), std::string::npos);
  }
}

}  // namespace
