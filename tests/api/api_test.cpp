// The public C++ API (include/pipesgd) with a user's own modules and loops: collectives against
// closed form, DistributedOptimizer against torch::optim::SGD and hand-computed sequences, every
// registered method, and the errors. Only public headers and LibTorch are used here.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/pipesgd.h"
#include "test_modules.h"

namespace pipesgd {
// gtest prints a registry entry (EveryMethod's parameter) by this: its name and what it needs.
void PrintTo(const MethodInfo& method, std::ostream* out) {
  *out << method.name << (method.uses_servers ? " (with a server)" : "")
       << (method.replicas_identical ? " (identical replicas)" : "");
}
}  // namespace pipesgd

namespace {

using pipesgd::DistributedOptimizer;
using pipesgd::DistributedOptimizerOptions;
using pipesgd::ReduceOp;
using pipesgd::Worker;
using pipesgd::WorldOptions;

// A user's model (not one of pipesgd's): two linear layers with a ReLU.
struct TwoLayerNetImpl : torch::nn::Module {
  TwoLayerNetImpl(int in, int hidden, int out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))), fc2(register_module("fc2", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TwoLayerNet);

// The same module's weights copied from `source` (under no_grad).
void copy_parameters(torch::nn::Module& target, torch::nn::Module& source) {
  torch::NoGradGuard no_grad;
  auto to = target.parameters();
  auto from = source.parameters();
  for (std::size_t k = 0; k < to.size(); ++k) to[k].copy_(from[k]);
}

using pipesgd_test::clone_parameters;
using pipesgd_test::relative_error;

// ---------------------------------------------------------------------------------------------
// Collectives against closed form.

struct CollectiveCase {
  int workers;
  std::int64_t count;
  friend std::ostream& operator<<(std::ostream& out, const CollectiveCase& c) {
    return out << c.workers << " workers, " << c.count << " elements";
  }
};

class Collectives : public ::testing::TestWithParam<CollectiveCase> {};

TEST_P(Collectives, MatchClosedForm) {
  const CollectiveCase c = GetParam();
  const int m = c.workers;
  pipesgd::run_threads(m, [&](Worker& w) {
    const int r = w.rank();
    EXPECT_EQ(w.size(), m);
    EXPECT_EQ(w.local_rank(), r);
    const torch::Tensor index = torch::arange(c.count, torch::kFloat32);
    // Sum of (r + 1) * (i + 1) over r: (i + 1) * m (m + 1) / 2.
    torch::Tensor sum = (index + 1) * (r + 1);
    w.allreduce(sum, ReduceOp::kSum);
    EXPECT_TRUE(torch::equal(sum, (index + 1) * (m * (m + 1) / 2.0f)));
    torch::Tensor mean = (index + 1) * (r + 1);
    w.allreduce(mean, ReduceOp::kAverage);
    EXPECT_TRUE(torch::allclose(mean, (index + 1) * ((m + 1) / 2.0f), 1e-6, 0));
    // Broadcast from the last rank, a non-contiguous view included.
    torch::Tensor value = torch::full({c.count}, static_cast<float>(r));
    w.broadcast(value, m - 1);
    EXPECT_TRUE(torch::equal(value, torch::full({c.count}, static_cast<float>(m - 1))));
    torch::Tensor grid = torch::full({2, c.count}, static_cast<float>(r));
    torch::Tensor column = grid.t();
    w.broadcast(column, 0);
    EXPECT_TRUE(torch::equal(grid, torch::zeros({2, c.count})));
    // Allgather: rank r contributes r rows of (r, count) (rank 0: none).
    torch::Tensor rows = torch::full({r, c.count}, static_cast<float>(r));
    torch::Tensor gathered = w.allgather(rows);
    ASSERT_EQ(gathered.size(0), m * (m - 1) / 2);
    ASSERT_EQ(gathered.size(1), c.count);
    std::int64_t row = 0;
    for (int peer = 0; peer < m; ++peer) {
      for (int k = 0; k < peer; ++k, ++row) EXPECT_TRUE(torch::equal(gathered[row], torch::full({c.count}, static_cast<float>(peer))));
    }
    w.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives,
                         ::testing::Values(CollectiveCase{1, 0}, CollectiveCase{1, 5}, CollectiveCase{2, 0},
                                           CollectiveCase{2, 1}, CollectiveCase{2, 7}, CollectiveCase{3, 0},
                                           CollectiveCase{3, 2}, CollectiveCase{3, 1000}));

TEST(Collectives, BroadcastParametersMakesReplicasIdentical) {
  std::vector<std::vector<torch::Tensor>> after(3);
  pipesgd::run_threads(3, [&](Worker& w) {
    torch::nn::Sequential net(torch::nn::Linear(3, 4), torch::nn::BatchNorm1d(4), torch::nn::Linear(4, 2));
    {
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.fill_(static_cast<float>(w.rank() + 1));
      for (auto& b : net->buffers()) b.fill_(w.rank() + 1);
    }
    pipesgd::broadcast_parameters(w, *net, 1);
    for (const auto& p : net->parameters()) after[static_cast<std::size_t>(w.rank())].push_back(p.detach().clone());
    for (const auto& b : net->buffers()) after[static_cast<std::size_t>(w.rank())].push_back(b.clone());
  });
  for (const auto& replica : after) {
    ASSERT_EQ(replica.size(), after[1].size());
    for (std::size_t k = 0; k < replica.size(); ++k) {
      EXPECT_TRUE(torch::equal(replica[k], after[1][k]));
      EXPECT_EQ(replica[k].flatten()[0].item<double>(), 2.0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// DistributedOptimizer.

struct Samples {
  torch::Tensor x, y;
};
Samples make_samples(std::int64_t n, std::int64_t features, std::int64_t classes) {
  torch::manual_seed(7);
  return {torch::randn({n, features}), torch::randint(0, classes, {n}, torch::kInt64)};
}

// Trains a copy of `initial` with the API on `workers` threads: worker r's batch of iteration t is
// rows [(t * workers + r) * b, ... + b). Returns every worker's final parameters.
std::vector<std::vector<torch::Tensor>> train_with_api(int workers, const std::string& spec,
                                                       DistributedOptimizerOptions options, TwoLayerNet initial,
                                                       const Samples& data, std::int64_t b, int iterations,
                                                       int servers = 0) {
  std::vector<std::vector<torch::Tensor>> result(static_cast<std::size_t>(workers));
  WorldOptions world;
  world.workers = workers;
  world.servers = servers;
  pipesgd::run_threads(world, [&](Worker& w) {
    TwoLayerNet model(4, 6, 3);
    copy_parameters(*model, *initial);
    DistributedOptimizer opt(w, model, spec, options);
    for (int t = 0; t < iterations; ++t) {
      const std::int64_t first = (t * workers + w.rank()) * b;
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(data.x.slice(0, first, first + b)),
                                                               data.y.slice(0, first, first + b));
      loss.backward();
      opt.step();
    }
    opt.finish();
    result[static_cast<std::size_t>(w.rank())] = clone_parameters(*model);
  });
  return result;
}

// The oracle: single-process torch::optim::SGD from `initial`'s weights, batch `global_batch` (the
// workers' batches of an iteration together), the learning rate of step t from lr_of(t).
std::vector<torch::Tensor> sgd_reference(TwoLayerNet initial, const Samples& data, std::int64_t global_batch,
                                         int iterations, const torch::optim::SGDOptions& sgd_options,
                                         const std::function<double(std::int64_t)>& lr_of) {
  TwoLayerNet reference(4, 6, 3);
  copy_parameters(*reference, *initial);
  torch::optim::SGD sgd(reference->parameters(), sgd_options);
  for (int t = 0; t < iterations; ++t) {
    const std::int64_t first = t * global_batch;
    for (auto& group : sgd.param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr_of(t));
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(reference->forward(data.x.slice(0, first, first + global_batch)),
                                         data.y.slice(0, first, first + global_batch))
        .backward();
    sgd.step();
  }
  return clone_parameters(*reference);
}

struct OracleCase {
  float momentum;
  float weight_decay;
  friend std::ostream& operator<<(std::ostream& out, const OracleCase& c) {
    return out << "momentum " << c.momentum << ", weight decay " << c.weight_decay;
  }
};
class DsyncOracle : public ::testing::TestWithParam<OracleCase> {};

TEST_P(DsyncOracle, ThreeWorkersEqualSgdWithTripleBatch) {
  const OracleCase c = GetParam();
  constexpr int kWorkers = 3, kIterations = 5;
  constexpr std::int64_t kBatch = 4;
  const Samples data = make_samples(kWorkers * kBatch * kIterations, 4, 3);
  torch::manual_seed(1);
  TwoLayerNet initial(4, 6, 3);
  DistributedOptimizerOptions options;
  options.learning_rate = 0.2f;
  options.momentum = c.momentum;
  options.weight_decay = c.weight_decay;
  const auto replicas = train_with_api(kWorkers, "dsync", options, initial, data, kBatch, kIterations);

  const auto expected = sgd_reference(initial, data, kWorkers * kBatch, kIterations,
                                      torch::optim::SGDOptions(0.2).momentum(c.momentum).weight_decay(c.weight_decay),
                                      [](std::int64_t) { return 0.2; });
  EXPECT_GT(relative_error(clone_parameters(*initial), expected), 1e-3);  // training moved the weights
  for (const auto& replica : replicas) EXPECT_LE(relative_error(replica, expected), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Hyperparameters, DsyncOracle,
                         ::testing::Values(OracleCase{0.0f, 0.0f}, OracleCase{0.9f, 0.0f}, OracleCase{0.9f, 0.01f}));

// Learning-rate schedules: dsync through the API against torch::optim::SGD whose lr is set by hand
// before every step from the schedule's closed form (docs/user-guide.md, "Learning-rate schedules").
struct ScheduleCase {
  std::string schedule;
  std::int64_t warmup;
  std::int64_t iterations_per_epoch;
  std::int64_t total_iterations;
  friend std::ostream& operator<<(std::ostream& out, const ScheduleCase& c) {
    return out << c.schedule << ", warm-up " << c.warmup << ", " << c.iterations_per_epoch << " iterations per epoch, "
               << c.total_iterations << " total";
  }
};
class ScheduleOracle : public ::testing::TestWithParam<ScheduleCase> {};

// The factor of iteration t in closed form: step:1:0.5 halves every epoch, cosine anneals over T,
// the warm-up ramps (t + 1) / N.
double schedule_factor(const ScheduleCase& c, std::int64_t t) {
  double decay = 1.0;
  if (c.schedule == "step:1:0.5") decay = std::pow(0.5, static_cast<double>(t / c.iterations_per_epoch));
  if (c.schedule == "cosine") {
    decay = (1.0 + std::cos(M_PI * static_cast<double>(std::min(t, c.total_iterations)) /
                            static_cast<double>(c.total_iterations))) / 2.0;
  }
  const double warm = t < c.warmup ? static_cast<double>(t + 1) / static_cast<double>(c.warmup) : 1.0;
  return decay * warm;
}

TEST_P(ScheduleOracle, DsyncEqualsSgdWithTheLrSetPerStep) {
  const ScheduleCase c = GetParam();
  constexpr int kWorkers = 3, kIterations = 6;
  constexpr std::int64_t kBatch = 4;
  constexpr double kLr = 0.2, kMomentum = 0.9;
  const Samples data = make_samples(kWorkers * kBatch * kIterations, 4, 3);
  torch::manual_seed(4);
  TwoLayerNet initial(4, 6, 3);
  DistributedOptimizerOptions options;
  options.learning_rate = static_cast<float>(kLr);
  options.momentum = static_cast<float>(kMomentum);
  options.lr_schedule = c.schedule;
  options.lr_warmup_iterations = c.warmup;
  options.iterations_per_epoch = c.iterations_per_epoch;
  options.total_iterations = c.total_iterations;
  const auto replicas = train_with_api(kWorkers, "dsync", options, initial, data, kBatch, kIterations);
  options.lr_schedule = "constant";
  options.lr_warmup_iterations = 0;
  const auto constant = train_with_api(kWorkers, "dsync", options, initial, data, kBatch, kIterations);

  const auto expected = sgd_reference(initial, data, kWorkers * kBatch, kIterations,
                                      torch::optim::SGDOptions(kLr).momentum(kMomentum),
                                      [&](std::int64_t t) { return kLr * schedule_factor(c, t); });
  EXPECT_GT(relative_error(constant[0], expected), 1e-3);  // the schedule changed the run
  for (const auto& replica : replicas) EXPECT_LE(relative_error(replica, expected), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Schedules, ScheduleOracle,
                         ::testing::Values(ScheduleCase{"step:1:0.5", 0, 2, 0}, ScheduleCase{"step:1:0.5", 3, 1, 0},
                                           ScheduleCase{"cosine", 2, 0, 6}));

// Parameter servers apply the schedule too: synchronous pssync with a schedule equals dsync with it
// (plain SGD), and differs from pssync with a constant rate.
TEST(DistributedOptimizer, PssyncServersFollowTheSchedule) {
  constexpr int kWorkers = 2, kIterations = 6;
  constexpr std::int64_t kBatch = 3;
  const Samples data = make_samples(kWorkers * kBatch * kIterations, 4, 3);
  torch::manual_seed(5);
  TwoLayerNet initial(4, 6, 3);
  DistributedOptimizerOptions options;
  options.learning_rate = 0.3f;
  const auto constant = train_with_api(kWorkers, "pssync", options, initial, data, kBatch, kIterations, 1);
  options.lr_schedule = "step:1:0.5";
  options.iterations_per_epoch = 2;
  const auto scheduled = train_with_api(kWorkers, "pssync", options, initial, data, kBatch, kIterations, 1);
  const auto dsync = train_with_api(kWorkers, "dsync", options, initial, data, kBatch, kIterations);
  for (const auto& replica : scheduled) {
    for (const auto& tensor : replica) EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>());
    EXPECT_GT(relative_error(replica, constant[0]), 1e-3);
    EXPECT_LE(relative_error(replica, dsync[0]), 1e-5);
  }
}

TEST(DistributedOptimizer, PipeK1EqualsDsyncBitForBit) {
  const Samples data = make_samples(2 * 3 * 6, 4, 3);
  torch::manual_seed(2);
  TwoLayerNet initial(4, 6, 3);
  DistributedOptimizerOptions options;
  options.momentum = 0.5f;
  const auto dsync = train_with_api(2, "dsync", options, initial, data, 3, 6);
  options.flags = {{"--staleness-k", "1"}};
  const auto pipe = train_with_api(2, "pipe", options, initial, data, 3, 6);
  for (int r = 0; r < 2; ++r) {
    for (std::size_t k = 0; k < dsync[0].size(); ++k) EXPECT_TRUE(torch::equal(pipe[r][k], dsync[r][k]));
  }
}

// Pipe-SGD with K = 2 on y = w . x with loss (w . x - y)^2 / 2: the update at t uses the mean
// gradient of t - 1, computed at w_{t-1}; finish() applies the last one.
TEST(DistributedOptimizer, PipeK2EqualsHandComputedSequence) {
  constexpr int kWorkers = 2, kIterations = 6;
  constexpr double kLr = 0.1;
  const std::vector<std::array<double, 3>> rows = {{1, 2, 1}, {0.5, -1, 2}, {2, 0, -1}, {-1, 1, 0.5}, {1, 1, 1}, {0, 2, -2},
                                                   {1, -1, 0}, {2, 2, 3}, {-2, 1, 1}, {1, 0, 2}, {0.5, 0.5, 0.5}, {3, -1, 1}};
  std::vector<std::array<double, 2>> w(static_cast<std::size_t>(kIterations + 2), {0.5, -0.25});
  std::array<double, 2> previous_gradient{0, 0};
  for (int t = 0; t < kIterations; ++t) {
    std::array<double, 2> g{0, 0};
    for (int r = 0; r < kWorkers; ++r) {
      const auto& row = rows[static_cast<std::size_t>(t * kWorkers + r)];
      const double error = w[t][0] * row[0] + w[t][1] * row[1] - row[2];
      g[0] += error * row[0] / kWorkers;
      g[1] += error * row[1] / kWorkers;
    }
    w[t + 1] = {w[t][0] - kLr * previous_gradient[0], w[t][1] - kLr * previous_gradient[1]};
    previous_gradient = g;
  }
  const std::array<double, 2> expected{w[kIterations][0] - kLr * previous_gradient[0],
                                       w[kIterations][1] - kLr * previous_gradient[1]};
  std::vector<torch::Tensor> results(kWorkers);
  pipesgd::run_threads(kWorkers, [&](Worker& worker) {
    torch::nn::Linear model(torch::nn::LinearOptions(2, 1).bias(false));
    {
      torch::NoGradGuard no_grad;
      model->weight.copy_(torch::tensor({{0.5f, -0.25f}}));
    }
    DistributedOptimizerOptions options;
    options.learning_rate = static_cast<float>(kLr);
    options.flags = {{"staleness-k", "2"}, {"warmup-iters", "0"}};
    DistributedOptimizer opt(worker, model, "pipe", options);
    for (int t = 0; t < kIterations; ++t) {
      const auto& row = rows[static_cast<std::size_t>(t * kWorkers + worker.rank())];
      torch::Tensor x = torch::tensor({{static_cast<float>(row[0]), static_cast<float>(row[1])}});
      torch::Tensor loss = 0.5 * (model->forward(x).squeeze() - static_cast<float>(row[2])).pow(2);
      loss.backward();
      opt.step();
    }
    opt.finish();
    results[static_cast<std::size_t>(worker.rank())] = model->weight.detach().clone();
  });
  for (const auto& result : results) {
    EXPECT_NEAR(result[0][0].item<double>(), expected[0], 1e-5);
    EXPECT_NEAR(result[0][1].item<double>(), expected[1], 1e-5);
  }
}

using pipesgd_test::ThreeLayerNet;

class EveryMethod : public ::testing::TestWithParam<pipesgd::MethodInfo> {};

TEST_P(EveryMethod, RunsAFewStepsOnAUserModule) {
  const pipesgd::MethodInfo method = GetParam();
  constexpr int kWorkers = 2, kIterations = 6;
  const Samples data = make_samples(kWorkers * 4 * kIterations, 4, 3);
  std::vector<std::vector<torch::Tensor>> finals(kWorkers);
  std::vector<double> first_loss(kWorkers), last_loss(kWorkers);
  WorldOptions world;
  world.workers = kWorkers;
  world.servers = method.uses_servers ? 1 : 0;
  pipesgd::run_threads(world, [&](Worker& w) {
    ThreeLayerNet model;
    DistributedOptimizerOptions options;
    options.learning_rate = 0.05f;
    options.timeout = std::chrono::seconds(60);
    DistributedOptimizer opt(w, model, method.name, options);
    for (int t = 0; t < kIterations; ++t) {
      const std::int64_t first = (t * kWorkers + w.rank()) * 4;
      torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(data.x.slice(0, first, first + 4)),
                                                               data.y.slice(0, first, first + 4));
      loss.backward();
      opt.step();
    }
    opt.finish();
    EXPECT_EQ(opt.iteration(), kIterations);
    EXPECT_EQ(opt.layer_names().size(), 3u);
    finals[static_cast<std::size_t>(w.rank())] = clone_parameters(*model);
  });
  for (const auto& tensor : finals[0]) EXPECT_TRUE(torch::isfinite(tensor).all().item<bool>());
  if (method.replicas_identical) {
    for (std::size_t k = 0; k < finals[0].size(); ++k) EXPECT_TRUE(torch::equal(finals[0][k], finals[1][k])) << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Registry, EveryMethod, ::testing::ValuesIn(pipesgd::available_methods()),
                         [](const auto& info) { return info.param.name; });

TEST(DistributedOptimizer, SpecsWithOptionsRun) {
  for (const std::string spec : {"pipe+int8", "dsync+optimal", "sapipe+wp3", "wfbp", "odsgd", "pipe+bf16"}) {
    SCOPED_TRACE(spec);
    const Samples data = make_samples(2 * 4 * 5, 4, 3);
    WorldOptions world;
    world.workers = 2;
    world.servers = spec == "odsgd" ? 1 : 0;  // OD-SGD's global updater is a server rank
    pipesgd::run_threads(world, [&](Worker& w) {
      ThreeLayerNet model;
      DistributedOptimizer opt(w, model, spec);
      for (int t = 0; t < 5; ++t) {
        const std::int64_t first = (t * 2 + w.rank()) * 4;
        torch::nn::functional::cross_entropy(model->forward(data.x.slice(0, first, first + 4)),
                                             data.y.slice(0, first, first + 4))
            .backward();
        opt.step();
      }
      opt.finish();
    });
  }
}

// The first step rebuilds the layout in backward readiness order: a module whose layers are
// registered in an order its forward does not follow gets its buffer in forward order.
using pipesgd_test::Reversed;

TEST(DistributedOptimizer, FirstStepOrdersLayersByReadiness) {
  pipesgd::run_threads(1, [](Worker& w) {
    Reversed model;
    DistributedOptimizer opt(w, model, "dsync");
    EXPECT_EQ(opt.layer_names(), (std::vector<std::string>{"last", "first"}));
    model->forward(torch::ones({2, 3})).sum().backward();
    opt.step();
    EXPECT_EQ(opt.layer_names(), (std::vector<std::string>{"first", "last"}));
    EXPECT_EQ(opt.flat_parameters().numel(), 3 * 5 + 5 + 5 * 2 + 2);
    opt.finish();
  });
}

// ---------------------------------------------------------------------------------------------
// Errors: exceptions with the CLI's one-line messages, never an abort or a hang.

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const pipesgd::UsageError& error) {
    return error.what();
  }
  return "(no UsageError)";
}

TEST(Errors, BadSpecHasTheCliMessage) {
  const std::string message = error_of([] {
    pipesgd::run_threads(2, [](Worker& w) {
      TwoLayerNet model(2, 2, 2);
      DistributedOptimizer opt(w, model, "nosuch");
    });
  });
  EXPECT_EQ(message, "unknown algorithm 'nosuch' in 'nosuch' (expected dsync, pipe, wfbp, synceasgd, mgwfbp, pssync, "
                     "asgd, dcasgd, odsgd, sapipe, nocomm, auto, optionally followed by +options such as a codec: "
                     "pipe+int8)");
  // auto's policy errors are the CLI's too.
  const std::string automatic = error_of([] {
    pipesgd::run_threads(1, [](Worker& w) {
      TwoLayerNet model(2, 2, 2);
      DistributedOptimizer opt(w, model, "auto:fast");
    });
  });
  EXPECT_EQ(automatic, "unknown policy 'fast' in auto:fast (policies: sync, stale, lossy or any)");
  const std::string flag = error_of([] {
    pipesgd::run_threads(1, [](Worker& w) {
      TwoLayerNet model(2, 2, 2);
      DistributedOptimizerOptions options;
      options.flags = {{"--staleness-k", "2"}};
      DistributedOptimizer opt(w, model, "dsync", options);
    });
  });
  EXPECT_NE(flag.find("--staleness-k"), std::string::npos) << flag;
}

std::string schedule_error(const std::string& schedule, std::int64_t warmup, std::int64_t iterations_per_epoch,
                           std::int64_t total_iterations) {
  return error_of([&] {
    pipesgd::run_threads(1, [&](Worker& w) {
      TwoLayerNet model(2, 2, 2);
      DistributedOptimizerOptions options;
      options.lr_schedule = schedule;
      options.lr_warmup_iterations = warmup;
      options.iterations_per_epoch = iterations_per_epoch;
      options.total_iterations = total_iterations;
      DistributedOptimizer opt(w, model, "dsync", options);
    });
  });
}

TEST(Errors, BadLrScheduleHasTheCliMessage) {
  EXPECT_EQ(schedule_error("step:0:0.5", 0, 10, 0),
            "DistributedOptimizerOptions::lr_schedule 'step:0:0.5': EVERY_EPOCHS must be >= 1, got 0 (expected constant, "
            "step:EVERY_EPOCHS:GAMMA, multistep:E1,E2,...:GAMMA or cosine)");
  for (const std::string& message :
       {schedule_error("linear", 0, 10, 100), schedule_error("step:2:1.5", 0, 10, 100),
        schedule_error("constant", -1, 10, 100)}) {
    EXPECT_NE(message.find("DistributedOptimizerOptions::lr_"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_EQ(schedule_error("step:1:0.5", 0, 0, 100),
            "lr_schedule 'step:1:0.5' needs DistributedOptimizerOptions::iterations_per_epoch (the iterations of one "
            "epoch of your loop, >= 1), got 0");
  EXPECT_EQ(schedule_error("cosine", 0, 10, 0),
            "lr_schedule 'cosine' needs DistributedOptimizerOptions::total_iterations (the steps of the whole run, "
            ">= 1), got 0");
  EXPECT_EQ(schedule_error("cosine", 5, 0, 10), "(no UsageError)");  // cosine needs no epoch length
}

TEST(Errors, UndefinedOrUnsupportedTensorToAllreduce) {
  const std::string message = error_of([] {
    pipesgd::run_threads(2, [](Worker& w) {
      torch::Tensor undefined;
      w.allreduce(undefined);
    });
  });
  EXPECT_EQ(message, "allreduce: expected a CPU tensor, got an undefined tensor");
  const std::string complex = error_of([] {
    pipesgd::run_threads(1, [](Worker& w) {
      torch::Tensor values = torch::zeros({3}, torch::kComplexFloat);
      w.allreduce(values);
    });
  });
  EXPECT_EQ(complex, "allreduce: dtype ComplexFloat is not supported (uint8, int8, int16, int32, int64, float16, "
                     "bfloat16, float32, float64, bool)");
}

TEST(Errors, ModuleWithoutParameters) {
  const std::string message = error_of([] {
    pipesgd::run_threads(1, [](Worker& w) {
      torch::nn::ReLU relu;
      DistributedOptimizer opt(w, relu, "dsync");
    });
  });
  EXPECT_EQ(message, "the model has no parameters");
}

TEST(Errors, ParameterServerMethodWithoutServers) {
  const std::string message = error_of([] {
    pipesgd::run_threads(2, [](Worker& w) {
      TwoLayerNet model(2, 2, 2);
      DistributedOptimizer opt(w, model, "pssync");
    });
  });
  EXPECT_NE(message.find("WorldOptions::servers = 1"), std::string::npos) << message;
}

TEST(Errors, AFailedWorkerStopsTheOthers) {
  WorldOptions world;
  world.workers = 3;
  world.timeout = std::chrono::seconds(60);
  try {
    pipesgd::run_threads(world, [](Worker& w) {
      if (w.rank() == 1) throw pipesgd::DataError("worker 1's data is bad");
      torch::Tensor value = torch::ones({4});
      w.allreduce(value);  // would wait for rank 1 forever without its failure notice
    });
    FAIL() << "no exception";
  } catch (const pipesgd::DataError& error) {
    EXPECT_STREQ(error.what(), "worker 1's data is bad");
  }
}

TEST(Errors, StepAfterFinish) {
  const std::string message = error_of([] {
    pipesgd::run_threads(1, [](Worker& w) {
      TwoLayerNet model(2, 2, 2);
      DistributedOptimizer opt(w, model, "dsync");
      opt.finish();
      opt.step();
    });
  });
  EXPECT_EQ(message, "DistributedOptimizer::step after finish()");
}

}  // namespace
