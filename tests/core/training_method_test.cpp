// Semantics of the training methods on the tiny pure-C++ model: Pipe-SGD's staleness against a
// hand-computed sequence, K = 1 == D-Sync bit for bit, warm-up, and failure propagation.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstring>
#include <ostream>

#include "failing_model.h"
#include "phase_oracle.h"
#include "tiny_run.h"
#include "pipesgd/algo/training_method.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/random.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/models/softmax_regression.h"
#include "pipesgd/report/report.h"
#include "pipesgd/train/trainer.h"
#include "softmax_batches.h"
#include "test_world.h"

namespace pipesgd {
namespace {

using Batches = SoftmaxBatches;
Batches make_batches(int ranks, std::int64_t iterations) {
  return make_softmax_batches(99, ranks, iterations, kFeatures, kClasses, kBatch);
}

struct Observed {
  std::vector<std::vector<std::vector<float>>> weights_used;  // [rank][t]: weights gradient t saw
  std::vector<std::vector<float>> final_weights;              // [rank], after finish()
};

Observed run_method(const MethodSelection& method, std::int64_t warmup, int ranks, std::int64_t iterations,
                    const Batches& data, LrScheduleLength length = {}) {
  Observed observed;
  observed.weights_used.assign(ranks, {});
  observed.final_weights.assign(ranks, {});
  run_ranks(ranks, [&](int rank, Transport& transport) {
    SoftmaxRegression model(kFeatures, kClasses, kSeed);
    auto method_object = make_method(method, transport, model, warmup, {}, length);
    TrainingMethod* const trained = method_object.get();
    for (std::int64_t t = 0; t < iterations; ++t) {
      IterationTimes times;
      std::span<float> gradients = trained->begin_iteration(t, times);
      auto parameters = model.parameters();
      observed.weights_used[rank].emplace_back(parameters.begin(), parameters.end());
      model.forward_backward(data.at(rank, t, ranks), gradients, {});
      trained->end_iteration(t, times);
    }
    IterationTimes times;
    trained->finish(times);
    auto parameters = model.parameters();
    observed.final_weights[rank].assign(parameters.begin(), parameters.end());
  });
  return observed;
}

// The hand-computed sequence of Pipe-SGD Alg. 1 with warm-up W and, with `drain` (--final-gradients
// apply), a final drain:
//   t <  W:  g_t = mean_r g_r(w_t); w <- SGD(w, g_t)                      (D-Sync)
//   t >= W:  if t-K >= W: w <- SGD(w, g_{t-K});  g_t = mean_r g_r(w_t)   (stale by K-1)
//   drain:   w <- SGD(w, g_t) for the pipelined t in [T-K, T), in order; without it (drop, Alg. 1 as
//            printed, whose comm thread reduces 1..T-K) the final w is the one after t = T-1's update.
// SGD as LibTorch: v = m v + (g + wd w); w -= lr v. Computed in double. With a learning-rate
// schedule, the update with g_i uses lr(i) = schedule.learning_rate(lr, i), i the gradient's iteration.
struct Expected {
  std::vector<std::vector<double>> weights_used;
  std::vector<double> final_weights;
};

Expected hand_computed(const SgdOptions& sgd, int K, std::int64_t W, int ranks, std::int64_t iterations,
                       const Batches& data, bool drain = true, const LrSchedule& schedule = {}) {
  SoftmaxRegression initial(kFeatures, kClasses, kSeed);
  std::vector<double> w(initial.parameters().begin(), initial.parameters().end());
  std::vector<double> v(w.size(), 0.0);
  std::vector<std::vector<double>> gradient_of(iterations + K);
  auto apply = [&](const std::vector<double>& g, std::int64_t of_iteration) {
    const double lr = schedule.learning_rate(sgd.learning_rate, of_iteration);
    for (std::size_t i = 0; i < w.size(); ++i) {
      v[i] = sgd.momentum * v[i] + (g[i] + sgd.weight_decay * w[i]);
      w[i] -= lr * v[i];
    }
  };
  Expected expected;
  for (std::int64_t t = 0; t < (drain ? iterations + K : iterations); ++t) {
    const bool pipelined = t >= W;
    if (pipelined && t - K >= W && t - K < iterations) apply(gradient_of[t - K], t - K);
    if (t >= iterations) continue;  // drain
    expected.weights_used.push_back(w);
    std::vector<float> w_float(w.begin(), w.end());
    std::vector<double> mean(w.size(), 0.0);
    for (int r = 0; r < ranks; ++r) {
      auto g = SoftmaxRegression::gradient_for(w_float, data.at(r, t, ranks), kFeatures, kClasses);
      for (std::size_t i = 0; i < g.size(); ++i) mean[i] += g[i] / ranks;
    }
    gradient_of[t] = mean;
    if (!pipelined) apply(mean, t);
  }
  expected.final_weights = w;
  return expected;
}

struct StalenessCase {
  int ranks;
  int staleness;
  std::int64_t warmup;
  float momentum;
};

void PrintTo(const StalenessCase& c, std::ostream* out) {
  *out << c.ranks << " ranks, K " << c.staleness << ", warm-up " << c.warmup << ", momentum " << c.momentum;
}

class PipeStaleness : public ::testing::TestWithParam<StalenessCase> {};

TEST_P(PipeStaleness, WeightsFollowHandComputedSequence) {
  const StalenessCase c = GetParam();
  const std::int64_t iterations = 9;
  const Batches data = make_batches(c.ranks, iterations);
  const SgdOptions sgd{0.5f, c.momentum, 0.01f};
  const MethodSelection pipe = select_for_test("pipe", {{"--staleness-k", std::to_string(c.staleness)}}, sgd);
  const Observed observed = run_method(pipe, c.warmup, c.ranks, iterations, data);
  const Expected expected = hand_computed(sgd, c.staleness, c.warmup, c.ranks, iterations, data);
  for (int rank = 0; rank < c.ranks; ++rank) {
    for (std::int64_t t = 0; t < iterations; ++t) {
      expect_close(observed.weights_used[rank][t], expected.weights_used[t],
                   concat("rank ", rank, " weights used at iteration ", t));
    }
    expect_close(observed.final_weights[rank], expected.final_weights, concat("rank ", rank, " final"));
    EXPECT_EQ(observed.final_weights[rank], observed.final_weights[0]) << "replicas diverged";
  }
  // The first K pipelined iterations see no update (Alg. 1's zero-initialised slots).
  for (std::int64_t t = c.warmup + 1; t < std::min<std::int64_t>(iterations, c.warmup + c.staleness); ++t) {
    EXPECT_EQ(observed.weights_used[0][t], observed.weights_used[0][c.warmup]) << "iteration " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PipeStaleness,
    ::testing::Values(StalenessCase{1, 2, 0, 0.0f}, StalenessCase{3, 2, 0, 0.0f}, StalenessCase{3, 2, 0, 0.9f},
                      StalenessCase{4, 3, 0, 0.9f}, StalenessCase{3, 1, 0, 0.9f}, StalenessCase{3, 2, 3, 0.9f},
                      StalenessCase{2, 2, 20, 0.5f}),
    [](const auto& info) {
      const StalenessCase& c = info.param;
      return concat("p", c.ranks, "_K", c.staleness, "_warmup", c.warmup, c.momentum > 0 ? "_momentum" : "");
    });

// --final-gradients drop: Alg. 1 as printed. The final weights are the hand-computed sequence
// without the drain, and (an independent check) exactly the weights the last gradient was computed
// on: no update follows iteration T-1's. They differ from apply's (so the option does something).
class PipeDropsFinalGradients : public ::testing::TestWithParam<StalenessCase> {};

TEST_P(PipeDropsFinalGradients, FinalWeightsHaveTMinusKUpdates) {
  const StalenessCase c = GetParam();
  const std::int64_t iterations = 9;
  const Batches data = make_batches(c.ranks, iterations);
  const SgdOptions sgd{0.5f, c.momentum, 0.01f};
  const OptionValues options{{"--staleness-k", std::to_string(c.staleness)}, {"--final-gradients", "drop"}};
  const Observed observed = run_method(select_for_test("pipe", options, sgd), c.warmup, c.ranks, iterations, data);
  const Expected expected = hand_computed(sgd, c.staleness, c.warmup, c.ranks, iterations, data, false);
  const Observed applied = run_method(select_for_test("pipe", {{"--staleness-k", std::to_string(c.staleness)}}, sgd),
                                      c.warmup, c.ranks, iterations, data);
  for (int rank = 0; rank < c.ranks; ++rank) {
    for (std::int64_t t = 0; t < iterations; ++t) {
      expect_close(observed.weights_used[rank][t], expected.weights_used[t],
                   concat("rank ", rank, " weights used at iteration ", t));
    }
    expect_close(observed.final_weights[rank], expected.final_weights, concat("rank ", rank, " final"));
    EXPECT_EQ(observed.final_weights[rank], observed.weights_used[rank][iterations - 1]) << "rank " << rank;
    // The same run up to the end: only finish() differs.
    EXPECT_EQ(observed.weights_used[rank], applied.weights_used[rank]) << "rank " << rank;
    EXPECT_NE(observed.final_weights[rank], applied.final_weights[rank]) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, PipeDropsFinalGradients,
                         ::testing::Values(StalenessCase{1, 2, 0, 0.0f}, StalenessCase{3, 2, 0, 0.9f},
                                           StalenessCase{4, 3, 0, 0.9f}, StalenessCase{3, 1, 0, 0.0f},
                                           StalenessCase{3, 2, 3, 0.9f}, StalenessCase{2, 3, 7, 0.5f}),
                         [](const auto& info) {
                           const StalenessCase& c = info.param;
                           return concat("p", c.ranks, "_K", c.staleness, "_warmup", c.warmup,
                                         c.momentum > 0 ? "_momentum" : "");
                         });

// With K = 1 and drop, T iterations apply the gradients of the first T - 1: exactly D-Sync's T - 1
// iterations, bit for bit (the gradient of iteration T - 1 is computed and discarded).
TEST(PipeDropsFinalGradients, KOneEqualsDSyncWithOneIterationLess) {
  const DataSplits data = small_data();
  TrainConfig dsync = tiny_config("dsync", 3);
  dsync.iterations -= 1;
  const TrainConfig pipe = tiny_config("pipe", 3, 0, {{"--staleness-k", "1"}, {"--final-gradients", "drop"}});
  const RunSummary a = run_training(dsync, softmax_factory(), data);
  const RunSummary b = run_training(pipe, softmax_factory(), data);
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(a.final_parameters[rank], b.final_parameters[rank]) << "rank " << rank;
  EXPECT_EQ(summary_to_json(b)["final_gradients"], "drop");
  EXPECT_EQ(summary_to_json(run_training(tiny_config("pipe", 1), softmax_factory(), data))["final_gradients"], "apply");
}

TEST(PipeDropsFinalGradients, BadValueIsAUsageErrorNamingTheValues) {
  try {
    select_for_test("pipe", {{"--final-gradients", "keep"}});
    ADD_FAILURE() << "expected a usage error";
  } catch (const UsageError& error) {
    EXPECT_STREQ(error.what(), "--final-gradients must be apply or drop, got 'keep'");
  }
}

// A wrong staleness must be caught: the K=2 run does not match the K=1 sequence.
TEST(PipeStaleness, HandComputedSequenceDistinguishesStaleness) {
  const Batches data = make_batches(3, 6);
  const SgdOptions sgd{0.5f, 0.0f, 0.0f};
  const Observed observed = run_method(select_for_test("pipe", {{"--staleness-k", "2"}}, sgd), 0, 3, 6, data);
  const Expected wrong = hand_computed(sgd, 1, 0, 3, 6, data);
  double largest = 0;
  for (std::size_t i = 0; i < wrong.final_weights.size(); ++i) {
    largest = std::max(largest, std::fabs(observed.final_weights[0][i] - wrong.final_weights[i]));
  }
  EXPECT_GT(largest, 1e-3);
}

// A learning-rate schedule: the update that applies the gradient of iteration i uses lr(i), for
// D-Sync (K = 1 here: pipe's warm-up runs D-Sync) and for Pipe-SGD, whose update at t applies
// g_{t-K} at lr(t-K), drained at the end at the rates of their iterations. Per-iteration factors
// (cosine with a warm-up; a step every 3 iterations) make an update at another iteration's rate show.
struct ScheduleCase {
  int ranks;
  int staleness;
  std::int64_t warmup;
  const char* schedule;
  std::int64_t lr_warmup;
};

void PrintTo(const ScheduleCase& c, std::ostream* out) {
  *out << c.ranks << " ranks, K " << c.staleness << ", warm-up " << c.warmup << ", " << c.schedule << " lr warm-up "
       << c.lr_warmup;
}

class PipeSchedule : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(PipeSchedule, UpdatesUseTheRateOfTheirGradientsIteration) {
  const ScheduleCase c = GetParam();
  const std::int64_t iterations = 11;
  const Batches data = make_batches(c.ranks, iterations);
  const SgdOptions sgd{0.5f, 0.5f, 0.01f};
  MethodSelection pipe = select_for_test("pipe", {{"--staleness-k", std::to_string(c.staleness)}}, sgd);
  pipe.common.lr_schedule = parse_lr_schedule(c.schedule, c.lr_warmup);
  const LrScheduleLength length{3, iterations};  // "epochs" of 3 iterations
  const Observed observed = run_method(pipe, c.warmup, c.ranks, iterations, data, length);
  const LrSchedule schedule(pipe.common.lr_schedule, length);
  const Expected expected = hand_computed(sgd, c.staleness, c.warmup, c.ranks, iterations, data, true, schedule);
  for (int rank = 0; rank < c.ranks; ++rank) {
    for (std::int64_t t = 0; t < iterations; ++t) {
      expect_close(observed.weights_used[rank][t], expected.weights_used[t],
                   concat("rank ", rank, " weights used at iteration ", t));
    }
    expect_close(observed.final_weights[rank], expected.final_weights, concat("rank ", rank, " final"));
  }
  // Not vacuous: the same sequence at the constant rate differs.
  const Expected constant = hand_computed(sgd, c.staleness, c.warmup, c.ranks, iterations, data);
  double difference = 0;
  for (std::size_t i = 0; i < constant.final_weights.size(); ++i) {
    difference = std::max(difference, std::fabs(constant.final_weights[i] - expected.final_weights[i]));
  }
  EXPECT_GT(difference, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PipeSchedule,
    ::testing::Values(ScheduleCase{3, 1, 0, "step:1:0.5", 0}, ScheduleCase{3, 2, 0, "step:1:0.5", 0},
                      ScheduleCase{2, 3, 0, "cosine", 4}, ScheduleCase{3, 2, 4, "multistep:1,2:0.3", 2},
                      ScheduleCase{1, 2, 0, "cosine", 0}),
    [](const auto& info) {
      const ScheduleCase& c = info.param;
      std::string name = concat("p", c.ranks, "_K", c.staleness, "_warmup", c.warmup, "_", c.schedule, "_lrwarmup",
                                c.lr_warmup);
      for (char& ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return name;
    });

// Pipe-SGD with K = 1 stays D-Sync bit for bit under a schedule (the same update at the same rate).
TEST(PipeSchedule, KOneIsBitIdenticalToDSyncWithASchedule) {
  const DataSplits data = small_data();
  for (const char* schedule : {"step:1:0.5", "cosine"}) {
    SCOPED_TRACE(schedule);
    TrainConfig dsync = tiny_config("dsync", 3);
    TrainConfig pipe = tiny_config("pipe", 3, 0, {{"--staleness-k", "1"}});
    for (TrainConfig* config : {&dsync, &pipe}) {
      config->iterations = 0;
      config->epochs = 2;
      config->method.common.lr_schedule = parse_lr_schedule(schedule, 5);
    }
    const RunSummary a = run_training(dsync, softmax_factory(), data);
    const RunSummary b = run_training(pipe, softmax_factory(), data);
    ASSERT_EQ(a.final_parameters[0].size(), b.final_parameters[0].size());
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(0, std::memcmp(a.final_parameters[rank].data(), b.final_parameters[rank].data(),
                               a.final_parameters[rank].size() * sizeof(float)))
          << "rank " << rank;
    }
    // And the schedule changed the run (so the comparison is not of two constant runs).
    TrainConfig constant = dsync;
    constant.method.common.lr_schedule = LrScheduleSpec{};
    EXPECT_NE(run_training(constant, softmax_factory(), data).final_parameters[0], a.final_parameters[0]);
  }
}

class PipeWithKOne : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(PipeWithKOne, IsBitIdenticalToDSync) {
  const auto [workers, codec] = GetParam();
  const DataSplits data = small_data();
  TrainConfig dsync = tiny_config("dsync+" + codec, workers);
  TrainConfig pipe = tiny_config("pipe+" + codec, workers, 0, {{"--staleness-k", "1"}});
  const RunSummary a = run_training(dsync, softmax_factory(), data);
  const RunSummary b = run_training(pipe, softmax_factory(), data);
  for (int rank = 0; rank < workers; ++rank) {
    ASSERT_EQ(a.final_parameters[rank].size(), b.final_parameters[rank].size());
    EXPECT_EQ(0, std::memcmp(a.final_parameters[rank].data(), b.final_parameters[rank].data(),
                             a.final_parameters[rank].size() * sizeof(float)))
        << "rank " << rank;
  }
  // And K = 2 is not (so the comparison above can fail).
  set_method_options(pipe, {{"--staleness-k", "2"}});
  const RunSummary c = run_training(pipe, softmax_factory(), data);
  EXPECT_NE(a.final_parameters[0], c.final_parameters[0]);
}

INSTANTIATE_TEST_SUITE_P(Cases, PipeWithKOne,
                         ::testing::Combine(::testing::Values(1, 3, 4), ::testing::Values("none", "bf16", "int8")),
                         [](const auto& info) {
                           return concat("p", std::get<0>(info.param), "_", std::get<1>(info.param));
                         });

TEST(Trainer, WarmupOnlyRunEqualsDSync) {
  const DataSplits data = small_data();
  TrainConfig dsync = tiny_config("dsync", 3);
  TrainConfig pipe = tiny_config("pipe", 3, 0, {{"--warmup-iters", std::to_string(dsync.iterations)}});
  EXPECT_EQ(run_training(dsync, softmax_factory(), data).final_parameters,
            run_training(pipe, softmax_factory(), data).final_parameters);
}

TEST(Trainer, ReportsEpochsAndTimings) {
  const DataSplits data = small_data();
  TrainConfig config = tiny_config("pipe+int8", 2);
  config.iterations = 0;
  config.epochs = 2;
  config.evaluate = true;
  const RunSummary summary = run_training(config, softmax_factory(), data);
  ASSERT_EQ(summary.epochs.size(), 2u);
  EXPECT_EQ(summary.timing.iterations, 2 * (600 / (2 * 5)));
  EXPECT_GE(summary.figures.final_test_accuracy, 0.0);
  EXPECT_LE(summary.figures.final_test_accuracy, 1.0);
  EXPECT_GT(summary.figures.mean.iteration, 0.0);
  EXPECT_GT(summary.figures.throughput, 0.0);
  EXPECT_EQ(summary.setup.codec, "int8");
  EXPECT_EQ(summary.setup.staleness, 2);
  EXPECT_DOUBLE_EQ(summary.timing.predicted_pipe_iteration,
                   std::max(summary.timing.stages.compute(), summary.timing.stages.comm));
  EXPECT_DOUBLE_EQ(summary.figures.predicted_iteration, summary.timing.predicted_pipe_iteration);
  EXPECT_GT(summary.timing.bytes_sent_per_iteration, 0u);
}

TEST(Trainer, LearnsSyntheticData) {
  const DataSplits data = make_synthetic(2000, 500, 5);
  for (const std::string spec : {"dsync", "pipe", "pipe+int8"}) {
    TrainConfig config = tiny_config(spec, 4);
    config.iterations = 0;
    config.epochs = 2;
    config.evaluate = true;
    const RunSummary summary = run_training(config, softmax_factory(), data);
    EXPECT_GT(summary.figures.final_test_accuracy, 0.8) << spec;
  }
}

TEST(Trainer, RejectsBadConfigurations) {
  const DataSplits data = small_data();
  auto expect_usage_error = [&](TrainConfig config, const std::string& fragment) {
    try {
      run_training(config, softmax_factory(), data);
      ADD_FAILURE() << "expected UsageError containing '" << fragment << "'";
    } catch (const UsageError& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
  };
  TrainConfig config = tiny_config("dsync", 0);
  expect_usage_error(config, "--workers must be in [1, 1024], got 0");
  config = tiny_config("dsync", 2);
  config.batch = 1000;
  expect_usage_error(config, "fewer than one global batch");
  // Method options are checked where the method is selected, before any run.
  auto expect_selection_error = [](const std::string& spec, const OptionValues& options, const std::string& fragment) {
    try {
      select_for_test(spec, options);
      ADD_FAILURE() << "expected UsageError containing '" << fragment << "'";
    } catch (const UsageError& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
  };
  expect_selection_error("pipe", {{"--staleness-k", "0"}}, "--staleness-k must be in [1, 64], got 0");
  expect_selection_error("dsync", {{"--codec", "zip"}}, "unknown codec 'zip'");
}

TEST(MethodSpec, ParsesNameAndCodec) {
  const MethodSelection method = select_for_test("pipe+int8");
  EXPECT_EQ(method.name(), "pipe");
  EXPECT_EQ(method.common.codec, "int8");
  EXPECT_EQ(method.spec, "pipe+int8");
  for (const std::string bad : {"pipes", "", "+int8", "pipe+", "pipe+gzip", "pipe+int8+bf16"}) {
    EXPECT_THROW(select_for_test(bad), UsageError) << bad;
  }
}

// A model that throws on one rank at one iteration (failing_model.h): the others must stop (no hang)
// and the run must report the root cause, not the others' "peer failed".
TEST(Trainer, WorkerFailureStopsEveryRankWithRootCause) {
  const DataSplits data = small_data();
  for (const std::string spec : {"dsync", "pipe"}) {
    TrainConfig config = tiny_config(spec, 4);
    set_timeout(config, std::chrono::seconds(60));
    expect_failing_rank_is_the_reported_cause(config, data);
  }
}

}  // namespace
}  // namespace pipesgd
