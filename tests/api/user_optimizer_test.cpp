// The public API with the user's torch::optim optimizer applying the update (the constructor that
// takes it): D-Sync equals single-process training with the same optimizer on the concatenated
// batch; Pipe-SGD equals the per-iteration rule (step t applies iteration t+1-K's gradient; finish
// the last K-1); gradients edited between synchronize_gradients() and step() are applied; methods
// that cannot hand their gradients over are refused.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "pipesgd/distributed_optimizer.h"
#include "pipesgd/world.h"
#include "test_modules.h"

namespace {

using pipesgd::DistributedOptimizer;
using pipesgd::Worker;
using pipesgd_test::ThreeLayerNet;

constexpr std::int64_t kBatch = 3;
constexpr int kSteps = 6;

using pipesgd_test::relative_error;

// The initial weights, drawn once (LibTorch's generator is shared by the worker threads: they copy).
const std::vector<torch::Tensor>& initial_weights() {
  static const std::vector<torch::Tensor> weights = [] {
    torch::manual_seed(11);
    return pipesgd_test::clone_parameters(*ThreeLayerNet());
  }();
  return weights;
}

ThreeLayerNet fresh_net() {
  ThreeLayerNet net;
  torch::NoGradGuard no_grad;
  auto parameters = net->parameters();
  for (std::size_t k = 0; k < parameters.size(); ++k) parameters[k].copy_(initial_weights()[k]);
  return net;
}

// The global batch of each step: workers * kBatch rows; worker r's are rows [r * kBatch, (r+1) * kBatch).
struct Batch {
  torch::Tensor x, y;
};
std::vector<Batch> global_batches(int workers, int steps = kSteps) {
  torch::manual_seed(100);
  std::vector<Batch> batches;
  for (int t = 0; t < steps; ++t) {
    batches.push_back({torch::randn({workers * kBatch, 4}), torch::randint(0, 3, {workers * kBatch}, torch::kInt64)});
  }
  return batches;
}

std::unique_ptr<torch::optim::Optimizer> adamw(ThreeLayerNet& net) {
  return std::make_unique<torch::optim::AdamW>(net->parameters(),
                                               torch::optim::AdamWOptions(0.02).betas({0.8, 0.99}).weight_decay(0.05));
}

using Edit = std::function<void(ThreeLayerNet&)>;

// Every worker's weights after `steps` steps and finish() with `spec` (and `flags`) and AdamW.
std::vector<std::vector<torch::Tensor>> train(int workers, const std::string& spec, const Edit& edit = {},
                                              int steps = kSteps, std::map<std::string, std::string> flags = {}) {
  std::vector<std::vector<torch::Tensor>> result(static_cast<std::size_t>(workers));
  const std::vector<Batch> batches = global_batches(workers, steps);
  initial_weights();
  pipesgd::run_threads(workers, [&](Worker& w) {
    ThreeLayerNet net = fresh_net();
    auto optimizer = adamw(net);
    pipesgd::DistributedOptimizerOptions options;
    options.flags = flags;
    DistributedOptimizer opt(w, net, *optimizer, spec, options);
    for (int t = 0; t < steps; ++t) {
      const Batch& batch = batches[static_cast<std::size_t>(t)];
      const std::int64_t first = w.rank() * kBatch;
      torch::nn::functional::cross_entropy(net->forward(batch.x.slice(0, first, first + kBatch)),
                                           batch.y.slice(0, first, first + kBatch))
          .backward();
      if (edit) {
        opt.synchronize_gradients();
        edit(net);
      }
      opt.step();
    }
    opt.finish();
    result[static_cast<std::size_t>(w.rank())] = pipesgd_test::clone_parameters(*net);
  });
  return result;
}

// Single process: step t applies the full batch's gradient of iteration t + 1 - staleness (the
// gradients computed at the weights each iteration ran on); then the last staleness - 1.
std::vector<torch::Tensor> oracle(int workers, int staleness, const Edit& edit = {}) {
  ThreeLayerNet net = fresh_net();
  auto optimizer = adamw(net);
  std::vector<std::vector<torch::Tensor>> gradients;
  const std::vector<Batch> batches = global_batches(workers);
  auto apply = [&](const std::vector<torch::Tensor>& gradient) {
    auto parameters = net->parameters();
    for (std::size_t k = 0; k < parameters.size(); ++k) parameters[k].mutable_grad() = gradient[k].clone();
    if (edit) edit(net);
    optimizer->step();
  };
  for (int t = 0; t < kSteps; ++t) {
    const Batch& batch = batches[static_cast<std::size_t>(t)];
    optimizer->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(batch.x), batch.y).backward();
    std::vector<torch::Tensor> gradient;
    for (const auto& p : net->parameters()) gradient.push_back(p.grad().clone());
    gradients.push_back(gradient);
    if (t + 1 - staleness >= 0) apply(gradients[static_cast<std::size_t>(t + 1 - staleness)]);
  }
  for (int t = std::max(kSteps + 1 - staleness, 0); t < kSteps; ++t) apply(gradients[static_cast<std::size_t>(t)]);
  return pipesgd_test::clone_parameters(*net);
}

struct Case {
  int workers;
  std::string spec;
  int staleness;
  friend std::ostream& operator<<(std::ostream& out, const Case& c) {
    return out << c.spec << " with AdamW, " << c.workers << " workers";
  }
};

class UserOptimizer : public ::testing::TestWithParam<Case> {};

TEST_P(UserOptimizer, EqualsTheSingleProcessRule) {
  const Case c = GetParam();
  const auto expected = oracle(c.workers, c.staleness);
  EXPECT_GT(relative_error(pipesgd_test::clone_parameters(*fresh_net()), expected), 1e-3);  // the oracle trained
  for (const auto& replica : train(c.workers, c.spec)) EXPECT_LE(relative_error(replica, expected), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Methods, UserOptimizer,
                         ::testing::Values(Case{1, "dsync", 1}, Case{2, "dsync", 1}, Case{3, "dsync", 1},
                                           Case{2, "wfbp", 1}, Case{2, "dsync+optimal", 1}, Case{2, "pipe", 2},
                                           Case{3, "pipe", 2}),
                         [](const auto& info) {
                           std::string spec = info.param.spec;
                           std::replace(spec.begin(), spec.end(), '+', '_');
                           return spec + "_" + std::to_string(info.param.workers) + "_workers";
                         });

TEST(UserOptimizer, ClippedGradientsAreApplied) {
  const Edit clip = [](ThreeLayerNet& net) { torch::nn::utils::clip_grad_norm_(net->parameters(), 0.01); };
  const auto expected = oracle(2, 1, clip);
  const auto unclipped = oracle(2, 1);
  EXPECT_GT(relative_error(expected, unclipped), 1e-3);  // clipping changes the run
  for (const auto& replica : train(2, "dsync", clip)) EXPECT_LE(relative_error(replica, expected), 1e-5);
}

// --- auto through the API, with the user's AdamW -------------------------------------------------

constexpr int kAutoSteps = 24;
constexpr int kAutoChoice = 13;  // auto profiles iterations 0-12 (3 start-up, 10 profiled)

// Single process, the same batches: the gradient of iteration t at the weights then; step t applies
// iteration t's (a synchronous method), or from iteration `pipe_from` on (pipe K=2) nothing at
// pipe_from and t - 1's at t > pipe_from, and finish() the last one.
std::vector<torch::Tensor> auto_oracle(int workers, int pipe_from) {
  const std::vector<Batch> batches = global_batches(workers, kAutoSteps);
  ThreeLayerNet net = fresh_net();
  auto optimizer = adamw(net);
  std::vector<std::vector<torch::Tensor>> gradients;
  auto apply = [&](int t) {
    auto parameters = net->parameters();
    for (std::size_t k = 0; k < parameters.size(); ++k) {
      parameters[k].mutable_grad() = gradients[static_cast<std::size_t>(t)][k].clone();
    }
    optimizer->step();
  };
  for (int t = 0; t < kAutoSteps; ++t) {
    optimizer->zero_grad();
    torch::nn::functional::cross_entropy(net->forward(batches[static_cast<std::size_t>(t)].x),
                                         batches[static_cast<std::size_t>(t)].y)
        .backward();
    std::vector<torch::Tensor> gradient;
    for (const auto& p : net->parameters()) gradient.push_back(p.grad().clone());
    gradients.push_back(gradient);
    if (pipe_from < 0 || t < pipe_from) {
      apply(t);
    } else if (t > pipe_from) {
      apply(t - 1);
    }
  }
  if (pipe_from >= 0) apply(kAutoSteps - 1);
  return pipesgd_test::clone_parameters(*net);
}

struct AutoCase {
  int workers;
  std::string spec;
  std::map<std::string, std::string> flags;
  friend std::ostream& operator<<(std::ostream& out, const AutoCase& c) {
    out << c.spec << " with AdamW, " << c.workers << " workers";
    for (const auto& [flag, value] : c.flags) out << ", " << flag << " " << value;
    return out;
  }
};

class UserOptimizerAuto : public ::testing::TestWithParam<AutoCase> {};

// auto chooses at iteration 13 (its one line on worker 0's stderr says which method) and switches
// with nothing lost: the weights follow the rule of the method it chose from 13 on. Policy sync
// only ever chooses a synchronous method; stale with --auto-min-gain 0 takes pipe whenever its
// prediction is lower, as it is here (no emulated network: the allreduce hides behind compute).
TEST_P(UserOptimizerAuto, FollowsTheRuleOfTheMethodItChose) {
  const AutoCase c = GetParam();
  ::testing::internal::CaptureStderr();
  const auto replicas = train(c.workers, c.spec, {}, kAutoSteps, c.flags);
  const std::string err = ::testing::internal::GetCapturedStderr();
  std::smatch chose;
  const std::regex line("pipesgd: (auto:\\w+) chose (\\S+)( K=(\\d+))? from iteration (\\d+): predicted ");
  ASSERT_TRUE(std::regex_search(err, chose, line)) << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << "one line, on worker 0 only: " << err;
  EXPECT_EQ(chose[5].str(), std::to_string(kAutoChoice));
  const bool pipe = chose[2].str() == "pipe";
  if (pipe) {
    EXPECT_EQ(chose[4].str(), "2");
  }
  if (c.spec == "auto") {
    EXPECT_FALSE(pipe) << "policy sync chose " << chose[2];
  }
  const auto expected = auto_oracle(c.workers, pipe ? kAutoChoice : -1);
  EXPECT_GT(relative_error(expected, auto_oracle(c.workers, pipe ? -1 : kAutoChoice)), 1e-4);  // the rules differ
  for (const auto& replica : replicas) EXPECT_LE(relative_error(replica, expected), 1e-5) << chose[0];
}

INSTANTIATE_TEST_SUITE_P(
    Policies, UserOptimizerAuto,
    ::testing::Values(AutoCase{2, "auto", {{"--auto-drift", "0"}, {"--auto-trial", "0"}}},
                      AutoCase{3, "auto", {{"--auto-drift", "0"}, {"--auto-trial", "0"}}},
                      AutoCase{2, "auto:stale", {{"--auto-min-gain", "0"}, {"--auto-drift", "0"}, {"--auto-trial", "0"}}},
                      AutoCase{3, "auto:stale", {{"--auto-min-gain", "0"}, {"--auto-drift", "0"}, {"--auto-trial", "0"}}}),
    [](const auto& info) {
      return std::string(info.param.spec == "auto" ? "sync" : "stale") + "_" + std::to_string(info.param.workers) +
             "_workers";
    });

TEST(UserOptimizer, MethodsThatCannotHandOverAreRefused) {
  pipesgd::run_threads(1, [&](Worker& w) {
    ThreeLayerNet net = fresh_net();
    auto optimizer = adamw(net);
    try {
      DistributedOptimizer opt(w, net, *optimizer, "sapipe+wp3");
      ADD_FAILURE() << "sapipe+wp3 handed its gradients over";
    } catch (const pipesgd::UsageError& error) {
      EXPECT_NE(std::string(error.what()).find("sapipe+dc"), std::string::npos) << error.what();
    }
  });
}

TEST(UserOptimizer, SynchronizeGradientsNeedsTheUsersOptimizer) {
  pipesgd::run_threads(1, [&](Worker& w) {
    ThreeLayerNet net = fresh_net();
    DistributedOptimizer opt(w, net, "dsync");
    EXPECT_THROW(opt.synchronize_gradients(), pipesgd::UsageError);
  });
}

}  // namespace
