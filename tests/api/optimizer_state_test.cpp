// DistributedOptimizer's state: step_and_save_state / load_state resume bit for bit for every
// worker-only method, broadcast_optimizer_state starts every worker from root's state, and the
// errors. The oracle is the same run without the interruption. Public headers and LibTorch only.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/pipesgd.h"
#include "test_modules.h"

namespace {

using pipesgd::DistributedOptimizer;
using pipesgd::DistributedOptimizerOptions;
using pipesgd::OptimizerState;
using pipesgd::Worker;
using pipesgd::WorldOptions;

using Net = pipesgd_test::ThreeLayerNet;
using pipesgd_test::Reversed;

constexpr std::int64_t kBatch = 4;

struct Samples {
  torch::Tensor x, y;
};
Samples make_samples(std::int64_t n) {
  torch::manual_seed(11);
  return {torch::randn({n, 4}), torch::randint(0, 3, {n}, torch::kInt64)};
}

// Worker `rank`'s forward and backward of iteration t (its batch depends on t and rank only).
void backward(Net& model, const Samples& data, int workers, int rank, std::int64_t t) {
  const std::int64_t first = (t * workers + rank) * kBatch;
  torch::nn::functional::cross_entropy(model->forward(data.x.slice(0, first, first + kBatch)),
                                       data.y.slice(0, first, first + kBatch))
      .backward();
}

// A Net with the weights seed gives (torch's generator is global: draw on one thread only).
Net initial_net(std::uint64_t seed) {
  torch::manual_seed(seed);
  return Net();
}

// A worker's model: a copy of `initial` (the workers' threads must not draw from the generator).
Net copy_of(const Net& initial) {
  Net model;
  torch::NoGradGuard no_grad;
  auto to = model->parameters();
  auto from = initial->parameters();
  for (std::size_t k = 0; k < to.size(); ++k) to[k].copy_(from[k]);
  return model;
}

std::vector<torch::Tensor> parameters_of(Net& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

struct ResumeCase {
  std::string spec;
  int workers;
  std::map<std::string, std::string> flags;
  std::string optimizer = "sgd";
};
std::ostream& operator<<(std::ostream& out, const ResumeCase& c) {
  out << c.spec << " on " << c.workers << " workers, " << c.optimizer;
  for (const auto& [flag, value] : c.flags) out << " --" << flag << " " << value;
  return out;
}

DistributedOptimizerOptions options_of(const ResumeCase& c) {
  DistributedOptimizerOptions options;
  options.optimizer = c.optimizer;
  options.learning_rate = c.optimizer == "adam" ? 0.01f : 0.05f;
  options.momentum = c.optimizer == "adam" ? 0.0f : 0.9f;
  options.weight_decay = 1e-3f;
  options.flags = c.flags;
  options.timeout = std::chrono::seconds(60);
  return options;
}

constexpr int kIterations = 9;

// Steps `from` .. kIterations - 1 of worker `rank`, then finish(); returns its final parameters.
std::vector<torch::Tensor> train_to_the_end(DistributedOptimizer& opt, Net& model, const Samples& data,
                                            const ResumeCase& c, int rank, int from) {
  for (int t = from; t < kIterations; ++t) {
    backward(model, data, c.workers, rank, t);
    opt.step();
  }
  opt.finish();
  return parameters_of(model);
}

// Every worker's final parameters after kIterations steps without interruption.
std::vector<std::vector<torch::Tensor>> straight_run(const ResumeCase& c, const Samples& data) {
  std::vector<std::vector<torch::Tensor>> finals(static_cast<std::size_t>(c.workers));
  const Net initial = initial_net(100);
  pipesgd::run_threads(c.workers, [&](Worker& w) {
    Net model = copy_of(initial);
    DistributedOptimizer opt(w, model, c.spec, options_of(c));
    finals[static_cast<std::size_t>(w.rank())] = train_to_the_end(opt, model, data, c, w.rank(), 0);
  });
  return finals;
}

// Every worker's state, saved by step_and_save_state() at step `save_at` of the straight run. The
// optimizers are destroyed without finish(): the updates in flight live on in the states only.
std::vector<OptimizerState> saved_states(const ResumeCase& c, const Samples& data, int save_at) {
  std::vector<OptimizerState> states(static_cast<std::size_t>(c.workers));
  const Net initial = initial_net(100);
  pipesgd::run_threads(c.workers, [&](Worker& w) {
    Net model = copy_of(initial);
    DistributedOptimizer opt(w, model, c.spec, options_of(c));
    for (int t = 0; t < save_at; ++t) {
      backward(model, data, c.workers, w.rank(), t);
      opt.step();
    }
    backward(model, data, c.workers, w.rank(), save_at);
    states[static_cast<std::size_t>(w.rank())] = opt.step_and_save_state();
  });
  return states;
}

// The run saved at step `save_at` (every worker its state), then continued by new optimizers over
// new modules (other initial weights) that load the states.
std::vector<std::vector<torch::Tensor>> resumed_run(const ResumeCase& c, const Samples& data, int save_at) {
  const std::vector<OptimizerState> states = saved_states(c, data, save_at);
  std::vector<std::vector<torch::Tensor>> finals(static_cast<std::size_t>(c.workers));
  const Net other = initial_net(200);
  pipesgd::run_threads(c.workers, [&](Worker& w) {
    Net model = copy_of(other);
    DistributedOptimizer opt(w, model, c.spec, options_of(c));
    opt.load_state(states[static_cast<std::size_t>(w.rank())]);
    EXPECT_EQ(opt.iteration(), save_at + 1);
    finals[static_cast<std::size_t>(w.rank())] = train_to_the_end(opt, model, data, c, w.rank(), save_at + 1);
  });
  return finals;
}

void expect_bit_identical(const std::vector<std::vector<torch::Tensor>>& actual,
                          const std::vector<std::vector<torch::Tensor>>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t r = 0; r < actual.size(); ++r) {
    ASSERT_EQ(actual[r].size(), expected[r].size());
    for (std::size_t k = 0; k < actual[r].size(); ++k) {
      EXPECT_TRUE(torch::equal(actual[r][k], expected[r][k])) << "worker " << r << ", parameter " << k;
    }
  }
}

class ResumeFromSavedState : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeFromSavedState, EqualsTheUninterruptedRunBitForBit) {
  const ResumeCase c = GetParam();
  const Samples data = make_samples(c.workers * kBatch * kIterations);
  const auto expected = straight_run(c, data);
  for (const int save_at : {0, 4}) {  // 0: the first step (the readiness rebuild); 4: in steady state
    SCOPED_TRACE(::testing::Message() << "saved at step " << save_at);
    expect_bit_identical(resumed_run(c, data, save_at), expected);
  }
}

std::vector<ResumeCase> resume_cases() {
  std::vector<ResumeCase> cases;
  for (const pipesgd::MethodInfo& method : pipesgd::available_methods()) {
    if (!method.uses_servers) cases.push_back({method.name, 2, {}});
  }
  cases.push_back({"dsync", 1, {}});
  cases.push_back({"dsync", 3, {}, "adam"});
  cases.push_back({"pipe", 3, {{"staleness-k", "3"}, {"warmup-iters", "1"}}});
  cases.push_back({"pipe+int8", 2, {{"warmup-iters", "0"}}});
  cases.push_back({"pipe+bf16", 3, {{"warmup-iters", "0"}}});
  cases.push_back({"sapipe+wp3", 2, {{"warmup-iters", "1"}}});
  cases.push_back({"sapipe+none", 3, {{"warmup-iters", "1"}}});
  cases.push_back({"dsync+optimal", 2, {}});
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<ResumeCase>& info) {
  std::string name = std::to_string(info.index) + "_" + info.param.spec + "_" + std::to_string(info.param.workers) + "w";
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Methods, ResumeFromSavedState, ::testing::ValuesIn(resume_cases()), case_name);

// The usual resume: only root has the state; broadcast_optimizer_state gives it to every worker.
TEST(BroadcastOptimizerState, RootsLoadedStateResumesEveryWorker) {
  for (const ResumeCase& c : {ResumeCase{"dsync", 3, {}}, ResumeCase{"pipe", 3, {{"warmup-iters", "0"}}},
                              ResumeCase{"wfbp", 2, {}}}) {
    SCOPED_TRACE(::testing::Message() << c);
    const Samples data = make_samples(c.workers * kBatch * kIterations);
    const auto expected = straight_run(c, data);
    constexpr int kSaveAt = 3;
    const int root = c.workers - 1;
    const OptimizerState root_state = saved_states(c, data, kSaveAt)[static_cast<std::size_t>(root)];
    std::vector<std::vector<torch::Tensor>> finals(static_cast<std::size_t>(c.workers));
    const std::vector<Net> others{initial_net(300), initial_net(301), initial_net(302)};
    pipesgd::run_threads(c.workers, [&](Worker& w) {
      Net model = copy_of(others[static_cast<std::size_t>(w.rank())]);  // different weights on each worker
      DistributedOptimizerOptions options = options_of(c);
      options.broadcast_initial_parameters = false;
      DistributedOptimizer opt(w, model, c.spec, options);
      if (w.rank() == root) opt.load_state(root_state);
      pipesgd::broadcast_optimizer_state(w, opt, root);
      EXPECT_EQ(opt.iteration(), kSaveAt + 1);
      finals[static_cast<std::size_t>(w.rank())] = train_to_the_end(opt, model, data, c, w.rank(), kSaveAt + 1);
    });
    expect_bit_identical(finals, expected);
  }
}

// A root without a loaded state sends its fresh state: its parameters, iteration 0; a worker that
// had loaded a state goes back to the fresh start too.
TEST(BroadcastOptimizerState, FreshRootGivesItsParameters) {
  const Samples data = make_samples(2 * kBatch * 4);
  OptimizerState saved;
  pipesgd::run_threads(2, [&](Worker& w) {
    Net model;
    DistributedOptimizer opt(w, model, "dsync");
    backward(model, data, 2, w.rank(), 0);
    OptimizerState state = opt.step_and_save_state();
    if (w.rank() == 0) saved = std::move(state);
  });
  const std::vector<Net> others{initial_net(400), initial_net(401)};
  pipesgd::run_threads(2, [&](Worker& w) {
    Net model = copy_of(others[static_cast<std::size_t>(w.rank())]);  // different weights on each worker
    DistributedOptimizerOptions options;
    options.broadcast_initial_parameters = false;
    DistributedOptimizer opt(w, model, "dsync", options);
    if (w.rank() == 0) opt.load_state(saved);  // dropped: root 1 is fresh
    const std::vector<torch::Tensor> before = parameters_of(model);
    pipesgd::broadcast_optimizer_state(w, opt, 1);
    EXPECT_EQ(opt.iteration(), 0);
    torch::Tensor mine = torch::cat([&] {
      std::vector<torch::Tensor> flat;
      for (const auto& p : parameters_of(model)) flat.push_back(p.flatten());
      return flat;
    }());
    torch::Tensor roots = mine.clone();
    w.broadcast(roots, 1);
    EXPECT_TRUE(torch::equal(mine, roots));
    if (w.rank() == 1) {
      for (std::size_t k = 0; k < before.size(); ++k) EXPECT_TRUE(torch::equal(before[k], parameters_of(model)[k]));
    }
    for (int t = 0; t < 4; ++t) {
      backward(model, data, 2, w.rank(), t);
      opt.step();
    }
    opt.finish();
    torch::Tensor final_flat = opt.flat_parameters().clone();
    torch::Tensor root_final = final_flat.clone();
    w.broadcast(root_final, 0);
    EXPECT_TRUE(torch::equal(final_flat, root_final));
  });
}

// The saved layer order (the first step's readiness rebuild) is restored with the state.

TEST(LoadState, RestoresTheLayerOrder) {
  pipesgd::run_threads(1, [](Worker& w) {
    OptimizerState state;
    {
      Reversed model;
      DistributedOptimizer opt(w, model, "dsync");
      model->forward(torch::ones({2, 3})).sum().backward();
      state = opt.step_and_save_state();
      EXPECT_EQ(opt.layer_names(), (std::vector<std::string>{"first", "last"}));
    }
    Reversed model;
    DistributedOptimizer opt(w, model, "dsync");
    EXPECT_EQ(opt.layer_names(), (std::vector<std::string>{"last", "first"}));
    opt.load_state(state);
    EXPECT_EQ(opt.layer_names(), (std::vector<std::string>{"first", "last"}));
    model->forward(torch::ones({2, 3})).sum().backward();
    opt.step();
    opt.finish();
  });
}

// ---------------------------------------------------------------------------------------------
// Errors: one line, as an exception; the optimizer stays usable after a refused load.

template <typename ErrorType, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ErrorType& error) {
    return error.what();
  }
  return "(no error of the expected type)";
}

OptimizerState one_step_state(Worker& w, const std::string& spec, const std::map<std::string, std::string>& flags = {}) {
  Net model;
  DistributedOptimizerOptions options;
  options.flags = flags;
  DistributedOptimizer opt(w, model, spec, options);
  model->forward(torch::ones({2, 4})).sum().backward();
  return opt.step_and_save_state();
}

TEST(OptimizerStateErrors, LoadAfterBackwardOrStep) {
  pipesgd::run_threads(1, [](Worker& w) {
    const OptimizerState state = one_step_state(w, "dsync");
    Net model;
    DistributedOptimizer opt(w, model, "dsync");
    model->forward(torch::ones({2, 4})).sum().backward();
    EXPECT_EQ(error_of<pipesgd::UsageError>([&] { opt.load_state(state); }),
              "DistributedOptimizer::load_state: call it on a new optimizer, before its first backward");
    opt.step();
    EXPECT_EQ(error_of<pipesgd::UsageError>([&] { pipesgd::broadcast_optimizer_state(w, opt); }),
              "DistributedOptimizer::broadcast_optimizer_state: call it on a new optimizer, before its first backward");
    opt.finish();
  });
}

TEST(OptimizerStateErrors, StateOfAnotherConfiguration) {
  pipesgd::run_threads(1, [](Worker& w) {
    const OptimizerState state = one_step_state(w, "pipe", {{"staleness-k", "2"}});
    Net model;
    DistributedOptimizer opt(w, model, "pipe", [] {
      DistributedOptimizerOptions options;
      options.flags = {{"staleness-k", "3"}};
      return options;
    }());
    const std::string message = error_of<pipesgd::UsageError>([&] { opt.load_state(state); });
    EXPECT_EQ(message.rfind("the optimizer state was saved by another configuration: saved 'method pipe (", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
    // Still usable: it trains from its own start.
    model->forward(torch::ones({2, 4})).sum().backward();
    opt.step();
    opt.finish();
    EXPECT_EQ(opt.iteration(), 1);
  });
}

TEST(OptimizerStateErrors, StateOfAnotherModule) {
  pipesgd::run_threads(1, [](Worker& w) {
    const OptimizerState state = one_step_state(w, "dsync");
    Reversed model;
    DistributedOptimizer opt(w, model, "dsync");
    EXPECT_EQ(error_of<pipesgd::UsageError>([&] { opt.load_state(state); }),
              "the optimizer state was saved for other layers than this module's (last (12), first (20))");
  });
}

TEST(OptimizerStateErrors, CorruptBytes) {
  pipesgd::run_threads(1, [](Worker& w) {
    OptimizerState state = one_step_state(w, "dsync");
    Net model;
    DistributedOptimizer opt(w, model, "dsync");
    for (const std::size_t at : {std::size_t{0}, state.bytes.size() / 2, state.bytes.size() - 1}) {
      OptimizerState corrupt = state;
      corrupt.bytes[at] ^= std::byte{0x5a};
      const std::string message = error_of<pipesgd::DataError>([&] { opt.load_state(corrupt); });
      EXPECT_EQ(message.rfind("checkpoint 'the optimizer state'", 0), 0u) << message;
    }
    OptimizerState truncated = state;
    truncated.bytes.resize(state.bytes.size() / 3);
    EXPECT_NE(error_of<pipesgd::DataError>([&] { opt.load_state(truncated); }), "(no error of the expected type)");
    EXPECT_NE(error_of<pipesgd::DataError>([&] { opt.load_state(OptimizerState{}); }), "(no error of the expected type)");
    opt.load_state(state);  // the intact state still loads
    EXPECT_EQ(opt.iteration(), 1);
  });
}

TEST(OptimizerStateErrors, ParameterServerMethodsKeepTheirStateOnTheServers) {
  WorldOptions world;
  world.workers = 1;
  world.servers = 1;
  pipesgd::run_threads(world, [](Worker& w) {
    Net model;
    DistributedOptimizer opt(w, model, "pssync");
    model->forward(torch::ones({2, 4})).sum().backward();
    EXPECT_EQ(error_of<pipesgd::UsageError>([&] { opt.step_and_save_state(); }),
              "DistributedOptimizer::step_and_save_state: 'pssync' keeps its state on its parameter servers: the API "
              "saves the state of worker-only methods");
    opt.step();
    opt.finish();
  });
}

TEST(OptimizerStateErrors, BadRoot) {
  pipesgd::run_threads(2, [](Worker& w) {
    Net model;
    DistributedOptimizer opt(w, model, "dsync");
    EXPECT_EQ(error_of<pipesgd::UsageError>([&] { pipesgd::broadcast_optimizer_state(w, opt, 2); }),
              "broadcast_optimizer_state: root 2 is not a worker rank (0..1)");
  });
}

}  // namespace
