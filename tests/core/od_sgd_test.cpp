// OD-SGD (algo/odsgd/od_sgd.h, OD-SGD paper Alg. 1-2) on the tiny pure-C++ model: the weights each worker
// trains on, iteration by iteration, against an independent replay of Alg. 1-2 from the recorded
// gradients (plain SGD; and with momentum and weight decay on the servers and in every local
// updater, 1 to 4 workers); the warm-up and switching stage; the local updaters; the final global
// weights; the local updater alone against hand-computed values; usage errors.
#include "pipesgd/algo/odsgd/od_sgd.h"
#include "pipesgd/algo/odsgd/od_sgd_report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/train/trainer.h"
#include "test_world.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

// Records, for every forward_backward call, the parameters it computed on and the gradient it
// wrote, into vectors owned by the test (the run destroys its models). One per worker; only that
// worker's compute thread calls it.
class RecordingModel final : public Model {
 public:
  RecordingModel(std::unique_ptr<Model> inner, std::vector<std::vector<float>>& weights,
                 std::vector<std::vector<float>>& gradients)
      : inner_(std::move(inner)), weights_(weights), gradients_(gradients) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& ready) override {
    const auto w = inner_->parameters();
    weights_.emplace_back(w.begin(), w.end());
    StepResult result = inner_->forward_backward(batch, gradients, ready);
    gradients_.emplace_back(gradients.begin(), gradients.end());
    return result;
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
  std::vector<std::vector<float>>& weights_;
  std::vector<std::vector<float>>& gradients_;
};

struct RecordedRun {
  RunSummary summary;
  std::vector<std::vector<std::vector<float>>> weights, gradients;  // [rank][iteration]
  std::vector<float> initial;
};

RecordedRun run_recorded(const TrainConfig& config) {
  RecordedRun run;
  run.weights.resize(static_cast<std::size_t>(config.workers));
  run.gradients.resize(static_cast<std::size_t>(config.workers));
  std::mutex mutex;
  std::size_t built = 0;  // run_training builds the replicas in rank order
  ModelFactory factory = [&](std::uint64_t seed) -> std::unique_ptr<Model> {
    std::lock_guard lock(mutex);
    const std::size_t rank = built++;
    auto inner = softmax_factory()(seed);
    if (rank == 0) run.initial.assign(inner->parameters().begin(), inner->parameters().end());
    return std::make_unique<RecordingModel>(std::move(inner), run.weights[rank], run.gradients[rank]);
  };
  run.summary = run_training(config, factory, small_data());
  return run;
}

// Independent replay of Alg. 1 (the server) with plain SGD (momentum and weight decay 0): G_{t+1} =
// G_t - lr * ((g_0 + g_1 + ... + g_{M-1}) * (1/M)), summed in worker order as the server does.
std::vector<std::vector<float>> replay_global_weights(const RecordedRun& run, float lr) {
  const std::size_t workers = run.gradients.size();
  const std::size_t iterations = run.gradients[0].size();
  const std::size_t n = run.initial.size();
  std::vector<std::vector<float>> global{run.initial};
  const float scale = 1.0f / static_cast<float>(workers);
  for (std::size_t t = 0; t < iterations; ++t) {
    std::vector<float> next = global.back();
    for (std::size_t i = 0; i < n; ++i) {
      float sum = run.gradients[0][t][i];
      for (std::size_t m = 1; m < workers; ++m) sum += run.gradients[m][t][i];
      next[i] -= lr * (sum * scale);
    }
    global.push_back(std::move(next));
  }
  return global;
}

bool equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The property, exactly as Alg. 2: a worker's training weights at iteration t are the
// global weights G_t during the warm-up (t < N), and from then on the pulled global weights of
// iteration t - 1, G_{t-1}, updated locally with its own gradient of iteration t - 1:
//   W_m(t) = G_{t-1} - local_lr * g_m(t-1).
// Bit for bit: the replay does the same fp32 operations in the same order.
TEST(OdSgd, TrainingWeightsArePulledGlobalWeightsUpdatedLocallyExactlyAsAlgorithm2) {
  for (const auto& [workers, servers, warmup] :
       std::vector<std::tuple<int, int, int>>{{3, 1, 5}, {2, 2, 1}, {1, 1, 3}, {4, 1, 0}}) {
    SCOPED_TRACE(concat(workers, " workers, ", servers, " servers, warm-up ", warmup));
    // --local-lr is not the global rate: shows which one is used.
    TrainConfig config = tiny_config("odsgd", workers, servers,
                                     {{"--local-lr", "0.05"}, {"--warmup-iters", std::to_string(warmup)}});
    set_sgd(config, SgdOptions{0.1f, 0.0f, 0.0f});
    const RecordedRun run = run_recorded(config);
    const auto global = replay_global_weights(run, 0.1f);
    const std::int64_t switching = std::max(warmup, 1);  // N: the first locally updated iteration
    for (int m = 0; m < workers; ++m) {
      const auto& w = run.weights[static_cast<std::size_t>(m)];
      const auto& g = run.gradients[static_cast<std::size_t>(m)];
      ASSERT_EQ(w.size(), 25u);
      for (std::size_t t = 0; t < w.size(); ++t) {
        if (static_cast<std::int64_t>(t) < switching) {
          ASSERT_TRUE(equal(w[t], global[t])) << "worker " << m << ", warm-up iteration " << t;
          continue;
        }
        std::vector<float> expected = global[t - 1];
        for (std::size_t i = 0; i < expected.size(); ++i) expected[i] -= 0.05f * g[t - 1][i];
        ASSERT_TRUE(equal(w[t], expected)) << "worker " << m << ", iteration " << t;
        // Not vacuous: the local estimate differs from both the stale and the current global weights.
        ASSERT_FALSE(equal(w[t], global[t - 1])) << t;
        ASSERT_FALSE(equal(w[t], global[t])) << t;
      }
      // finish() leaves the final global weights G_T on every worker.
      EXPECT_TRUE(equal(run.summary.final_parameters[static_cast<std::size_t>(m)], global[25]))
          << "worker " << m;
    }
  }
}

// The DC-ASGD local updaters compensate the worker's own gradient for the step from the weights it
// was computed on to the pulled global weights: W_m(t) = G_{t-1} - local_lr * g~ with
//   g~ = g + lambda g^2 (G_{t-1} - W_m(t-1))                               (dcasgd-c, Eq. 4)
// and the adaptive form for dcasgd-a (Eq. 5-6, MeanSquare over this worker's gradients).
TEST(OdSgd, DelayCompensatingLocalUpdatersFollowEquations4To6) {
  for (const char* updater : {"dcasgd-c", "dcasgd-a"}) {
    SCOPED_TRACE(updater);
    OptionValues given{{"--local-updater", updater}, {"--dc-lambda", "2"}, {"--warmup-iters", "3"}};
    if (std::string(updater) == "dcasgd-a") given.set("--dc-momentum", "0.9");
    TrainConfig config = tiny_config("odsgd", 2, 1, given);
    set_sgd(config, SgdOptions{0.1f, 0.0f, 0.0f});
    const RecordedRun run = run_recorded(config);
    const auto global = replay_global_weights(run, 0.1f);
    DelayCompensationOptions options;
    options.lambda = 2.0f;
    options.mean_square_decay = 0.9f;
    options.variant = std::string(updater) == "dcasgd-c" ? DelayCompensationVariant::kConstant
                                                         : DelayCompensationVariant::kAdaptive;
    for (std::size_t m = 0; m < 2; ++m) {
      const auto& w = run.weights[m];
      const auto& g = run.gradients[m];
      const std::size_t n = w[0].size();
      std::vector<float> mean_square(n, 0.0f);
      double largest_correction = 0;
      for (std::size_t t = 3; t < w.size(); ++t) {
        // Iteration t - 1 >= N - 1 = 2 is where the local update of W(t) happened.
        const auto& base = global[t - 1];
        std::vector<float> expected(n);
        for (std::size_t i = 0; i < n; ++i) {
          const float gi = g[t - 1][i];
          const float delay = base[i] - w[t - 1][i];
          float coefficient = options.lambda;
          if (options.variant == DelayCompensationVariant::kAdaptive) {
            mean_square[i] = options.mean_square_decay * mean_square[i] +
                             (1.0f - options.mean_square_decay) * gi * gi;
            coefficient = options.lambda / std::sqrt(mean_square[i] + options.epsilon);
          }
          const float compensated = gi + coefficient * gi * gi * delay;
          largest_correction = std::max(largest_correction, double(std::fabs(compensated - gi)));
          expected[i] = base[i] - 0.1f * (compensated * 1.0f + 0.0f * base[i]);
        }
        for (std::size_t i = 0; i < n; ++i) {
          ASSERT_NEAR(w[t][i], expected[i], 1e-6f * (1.0f + std::fabs(expected[i])))
              << "worker " << m << ", iteration " << t << ", element " << i;
        }
      }
      EXPECT_GT(largest_correction, 1e-6) << "the compensation never changed a gradient";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The replay with momentum and weight decay: every worker's training weights, iteration by
// iteration, against an independent implementation of OD-SGD paper Alg. 1-2 as od_sgd.h documents it.

// One fp32 SGD step of one element, LibTorch's semantics as optim/sgd.h states them (dampening 0,
// no Nesterov; the velocity starts at zero):
//   d = g + weight_decay * w;  v = momentum * v + d;  w = w - lr * v.
struct ReplaySgd {
  float lr, momentum, weight_decay;
  std::vector<float> velocity;
  float step(std::size_t i, float w, float g) {
    const float d = g + weight_decay * w;
    if (momentum == 0.0f) return w - lr * d;
    velocity[i] = momentum * velocity[i] + d;
    return w - lr * velocity[i];
  }
};

struct Replayed {
  std::vector<std::vector<float>> global;                 // G_0 .. G_T (Alg. 1)
  std::vector<std::vector<std::vector<float>>> weights;   // [worker][t]: W_t (Alg. 2)
};

// Alg. 1 (the servers, one synchronous SGD step per version with the mean of the M workers'
// gradients, summed in worker order, and the server's own momentum) and Alg. 2 (worker m):
//   t < N:   W_t = G_t                                     (warm-up, SSGD)
//   t >= N:  W_t = LocalUpdate(G_{t-1}, g_m(t-1))           (the pulled weights of iteration t-1,
//            updated with the worker's own gradient; at t = N, G_{N-1} = W_{N-1}: the switching stage)
// LocalUpdate = SGD with the local learning rate and the run's momentum and weight decay, with a
// velocity of the worker's own that starts at the switching stage, its gradient compensated first
// by a DC-ASGD updater (Eq. 4 or Eq. 5-6, w_now = G_{t-1}, w_then = W_{t-1}, MeanSquare per worker).
// With a learning-rate schedule, the servers' step with the gradients of iteration t and the local
// update with g_m(t) both scale their own rate by the schedule's factor(t).
Replayed replay_od_sgd(const RecordedRun& run, const SgdOptions& sgd, float local_lr, std::int64_t warmup,
                       const std::string& updater, const DelayCompensationOptions& dc,
                       const LrSchedule& schedule = {}) {
  const std::size_t workers = run.gradients.size();
  const std::size_t iterations = run.gradients[0].size();
  const std::size_t n = run.initial.size();
  const std::size_t N = static_cast<std::size_t>(std::max<std::int64_t>(warmup, 1));
  Replayed out;
  ReplaySgd server{sgd.learning_rate, sgd.momentum, sgd.weight_decay, std::vector<float>(n, 0.0f)};
  const float scale = 1.0f / static_cast<float>(workers);
  out.global.push_back(run.initial);
  for (std::size_t t = 0; t < iterations; ++t) {
    std::vector<float> next = out.global.back();
    server.lr = static_cast<float>(static_cast<double>(sgd.learning_rate) * schedule.factor(static_cast<std::int64_t>(t)));
    for (std::size_t i = 0; i < n; ++i) {
      float sum = run.gradients[0][t][i];
      for (std::size_t m = 1; m < workers; ++m) sum += run.gradients[m][t][i];
      next[i] = server.step(i, next[i], sum * scale);
    }
    out.global.push_back(std::move(next));
  }
  out.weights.resize(workers);
  for (std::size_t m = 0; m < workers; ++m) {
    ReplaySgd local{local_lr, sgd.momentum, sgd.weight_decay, std::vector<float>(n, 0.0f)};
    std::vector<float> mean_square(n, 0.0f);
    auto& w = out.weights[m];
    for (std::size_t t = 0; t < std::min(N, iterations); ++t) w.push_back(out.global[t]);
    for (std::size_t t = N; t < iterations; ++t) {
      const std::vector<float>& base = out.global[t - 1];  // G_{t-1}
      const std::vector<float>& then = w[t - 1];           // W_{t-1}, what g_m(t-1) was computed on
      const std::vector<float>& g = run.gradients[m][t - 1];
      local.lr = static_cast<float>(static_cast<double>(local_lr) * schedule.factor(static_cast<std::int64_t>(t - 1)));
      std::vector<float> next(n);
      for (std::size_t i = 0; i < n; ++i) {
        float gi = g[i];
        if (updater == "dcasgd-c") {
          gi = gi + dc.lambda * gi * gi * (base[i] - then[i]);
        } else if (updater == "dcasgd-a") {
          mean_square[i] = dc.mean_square_decay * mean_square[i] + (1.0f - dc.mean_square_decay) * gi * gi;
          gi = gi + dc.lambda / std::sqrt(mean_square[i] + dc.epsilon) * gi * gi * (base[i] - then[i]);
        }
        next[i] = local.step(i, base[i], gi);
      }
      w.push_back(std::move(next));
    }
  }
  return out;
}

struct OdSgdReplayCase {
  int workers, servers, warmup;
  std::string updater;
};

std::string od_sgd_case_name(const OdSgdReplayCase& c) {
  return concat(c.workers, "workers_", c.servers, "servers_warmup", c.warmup, "_",
                c.updater == "sgd" ? "sgd" : c.updater == "dcasgd-c" ? "dcasgd_c" : "dcasgd_a");
}

void PrintTo(const OdSgdReplayCase& c, std::ostream* out) { *out << od_sgd_case_name(c); }

class OdSgdMomentumReplay : public ::testing::TestWithParam<OdSgdReplayCase> {};

// Bit for bit: the replay evaluates the documented fp32 formulas in their written order, as the
// servers (worker-order sum, then Sgd::step) and the local updater do; nothing is re-associated
// (no FMA on the x86-64 targets these tests are built for).
TEST_P(OdSgdMomentumReplay, TrainingWeightsFollowAlgorithms1And2WithMomentumAndWeightDecay) {
  const OdSgdReplayCase& c = GetParam();
  // --local-lr is not the servers' rate: shows which one is used.
  OptionValues given{{"--local-lr", "0.05"}, {"--local-updater", c.updater}, {"--warmup-iters", std::to_string(c.warmup)}};
  if (c.updater != "sgd") given.set("--dc-lambda", "2");
  if (c.updater == "dcasgd-a") given.set("--dc-momentum", "0.9");
  TrainConfig config = tiny_config("odsgd", c.workers, c.servers, given);
  const SgdOptions sgd{0.1f, 0.9f, 0.01f};
  set_sgd(config, sgd);
  const RecordedRun run = run_recorded(config);
  DelayCompensationOptions compensation;
  compensation.lambda = 2.0f;
  compensation.mean_square_decay = 0.9f;
  const Replayed expected = replay_od_sgd(run, sgd, 0.05f, c.warmup, c.updater, compensation);
  const std::size_t N = static_cast<std::size_t>(std::max(c.warmup, 1));
  const std::size_t T = 25;
  for (std::size_t m = 0; m < static_cast<std::size_t>(c.workers); ++m) {
    const auto& w = run.weights[m];
    ASSERT_EQ(w.size(), T);
    for (std::size_t t = 0; t < T; ++t) {
      ASSERT_TRUE(equal(w[t], expected.weights[m][t]))
          << "worker " << m << ", iteration " << t << (t < N ? " (warm-up)" : " (locally updated)");
    }
    // finish() leaves the final global weights G_T on every worker.
    EXPECT_TRUE(equal(run.summary.final_parameters[m], expected.global[T])) << "worker " << m;
  }
  // Not vacuous: the local velocity and weight decay change the weights trained on: W_t is not
  // G_{t-1} - local_lr * g(t-1) (the plain step) once the local velocity holds a past gradient.
  ASSERT_LT(N + 1, T);
  for (std::size_t t = N + 1; t < T; ++t) {
    std::vector<float> plain = expected.global[t - 1];
    for (std::size_t i = 0; i < plain.size(); ++i) plain[i] -= 0.05f * run.gradients[0][t - 1][i];
    EXPECT_FALSE(equal(run.weights[0][t], plain)) << "iteration " << t;
  }
  // ... and the servers' velocity changes the global weights: G_{t+1} is not the plain step
  // G_t - lr * (mean g(t) + weight_decay * G_t) once the velocity holds a past gradient.
  for (std::size_t t = 1; t < T; ++t) {
    ReplaySgd plain_server{0.1f, 0.0f, 0.01f, {}};
    std::vector<float> plain = expected.global[t];
    for (std::size_t i = 0; i < plain.size(); ++i) {
      float sum = run.gradients[0][t][i];
      for (std::size_t m = 1; m < static_cast<std::size_t>(c.workers); ++m) sum += run.gradients[m][t][i];
      plain[i] = plain_server.step(i, plain[i], sum * (1.0f / static_cast<float>(c.workers)));
    }
    EXPECT_FALSE(equal(expected.global[t + 1], plain)) << "version " << t + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(OdSgd, OdSgdMomentumReplay,
                         ::testing::Values(OdSgdReplayCase{1, 1, 3, "sgd"}, OdSgdReplayCase{2, 2, 1, "sgd"},
                                           OdSgdReplayCase{3, 1, 5, "sgd"}, OdSgdReplayCase{3, 2, 0, "sgd"},
                                           OdSgdReplayCase{4, 1, 2, "sgd"}, OdSgdReplayCase{3, 1, 4, "dcasgd-c"},
                                           OdSgdReplayCase{2, 1, 3, "dcasgd-a"}),
                         [](const ::testing::TestParamInfo<OdSgdReplayCase>& info) {
                           return od_sgd_case_name(info.param);
                         });

// With warm-up covering the whole run, OD-SGD is PS-Sync (every iteration trains on G_t).
// A learning-rate schedule scales the servers' rate and the local updater's (--local-lr) alike,
// each by the factor of the iteration whose gradient it applies: cosine with a warm-up changes the
// factor every iteration, so an update at another iteration's rate would show. Bit for bit.
TEST(OdSgd, ScheduleScalesTheServersAndTheLocalUpdaterByTheGradientsIteration) {
  for (const std::string updater : {"sgd", "dcasgd-c"}) {
    SCOPED_TRACE(updater);
    OptionValues given{{"--local-lr", "0.05"}, {"--local-updater", updater}, {"--warmup-iters", "3"}};
    TrainConfig config = tiny_config("odsgd", 2, 1, given);
    const SgdOptions sgd{0.1f, 0.9f, 0.01f};
    set_sgd(config, sgd);
    config.method.common.lr_schedule = parse_lr_schedule("cosine", 4);
    const RecordedRun run = run_recorded(config);
    const LrSchedule schedule(config.method.common.lr_schedule, {60, 25});  // 600 examples / (2 x 5); 25 iterations
    DelayCompensationOptions compensation;  // the defaults of dcasgd-c
    const Replayed expected = replay_od_sgd(run, sgd, 0.05f, 3, updater, compensation, schedule);
    const Replayed constant = replay_od_sgd(run, sgd, 0.05f, 3, updater, compensation);
    for (std::size_t m = 0; m < 2; ++m) {
      for (std::size_t t = 0; t < 25; ++t) {
        ASSERT_TRUE(equal(run.weights[m][t], expected.weights[m][t])) << "worker " << m << ", iteration " << t;
      }
      ASSERT_FALSE(equal(run.weights[m][10], constant.weights[m][10]));  // the schedule mattered
      EXPECT_TRUE(equal(run.summary.final_parameters[m], expected.global[25])) << "worker " << m;
    }
  }
}

TEST(OdSgd, AllWarmUpIsPsSyncBitForBit) {
  TrainConfig odsgd = tiny_config("odsgd", 3, 2, {{"--warmup-iters", "1000"}});
  const RunSummary a = run_training(odsgd, softmax_factory(), small_data());
  const RunSummary b = run_training(tiny_config("pssync", 3, 2), softmax_factory(), small_data());
  for (std::size_t m = 0; m < 3; ++m) EXPECT_TRUE(equal(a.final_parameters[m], b.final_parameters[m]));
  // No pipelined iteration: nothing to report.
  EXPECT_FALSE(dynamic_cast<const OdSgdReport&>(*a.figures.report).model().has_value());
}

// Momentum and weight decay: the run trains, every worker ends with the same (global) weights, and
// the report carries OD-SGD's timing model measured on the warm-up.
TEST(OdSgd, MomentumRunEndsWithOneGlobalModelAndReportsTheTimingModel) {
  TrainConfig config = tiny_config("odsgd", 3, 1, {{"--warmup-iters", "30"}});  // momentum 0.9, weight decay 1e-4
  config.iterations = 60;
  const RunSummary summary = run_training(config, softmax_factory(), small_data());
  for (std::size_t m = 1; m < 3; ++m) {
    EXPECT_TRUE(equal(summary.final_parameters[m], summary.final_parameters[0]));
  }
  const std::optional<OdSgdModel>& model = dynamic_cast<const OdSgdReport&>(*summary.figures.report).model();
  ASSERT_TRUE(model.has_value());
  const OdSgdModel& report = *model;
  EXPECT_EQ(report.sync_iterations, 29 - 2);  // iterations 0..28 synchronous, 2 of them start-up
  EXPECT_GT(report.times.compute, 0);
  EXPECT_GT(report.times.communication, 0);
  EXPECT_GT(report.times.sync_communication, 0);
  EXPECT_EQ(report.predicted_iteration, od_sgd_iteration_time(report.times));
  EXPECT_EQ(report.predicted_improvement, od_sgd_improvement_rate(report.times));
  EXPECT_DOUBLE_EQ(report.measured_improvement,
                   (report.sync_iteration - summary.figures.mean.iteration) / report.sync_iteration);
  EXPECT_EQ(summary.figures.predicted_iteration, report.predicted_iteration);
}

TEST(OdSgd, RankPerProcessEqualsThreads) {
  const TrainConfig config = tiny_config("odsgd", 2, 1, {{"--warmup-iters", "4"}});
  const RunSummary threads = run_training(config, softmax_factory(), small_data());
  std::vector<RunSummary> ranks(3);
  run_ranks(3, [&](int rank, Transport& transport) {
    ranks[rank] = run_training_rank(config, softmax_factory(), small_data(), transport);
  });
  EXPECT_EQ(ranks[0].weights_checksum, threads.weights_checksum);
  EXPECT_TRUE(equal(ranks[1].final_parameters[1], threads.final_parameters[1]));
}

// The local updater alone, by hand: base G = {1, 2}, the weights the gradient was computed on
// W = {0.5, 3}, g = {2, -1}, lr 0.5.
//   sgd:      W' = G - 0.5 g = {0, 2.5}
//   dcasgd-c: lambda 0.5: g~ = g + 0.5 g^2 (G - W) = {2 + 0.5*4*0.5, -1 + 0.5*1*(-1)} = {3, -1.5}
//             W' = G - 0.5 g~ = {-0.5, 2.75}
TEST(LocalUpdater, MatchesHandComputedSteps) {
  DelayCompensationOptions compensation;
  compensation.lambda = 0.5f;
  const std::vector<float> base = {1.0f, 2.0f}, gradient = {2.0f, -1.0f};
  std::vector<float> weights = {0.5f, 3.0f};
  LocalUpdater sgd(2, "sgd", SgdOptions{0.5f, 0.0f, 0.0f}, compensation);
  sgd.apply(base, gradient, weights, 1.0);
  EXPECT_EQ(weights, (std::vector<float>{0.0f, 2.5f}));
  weights = {0.5f, 3.0f};
  LocalUpdater dc(2, "dcasgd-c", SgdOptions{0.5f, 0.0f, 0.0f}, compensation);
  dc.apply(base, gradient, weights, 1.0);
  EXPECT_EQ(weights, (std::vector<float>{-0.5f, 2.75f}));
  // In place (the switching iteration: the base is the weights themselves): no delay, plain step.
  weights = {1.0f, 2.0f};
  dc.apply(weights, gradient, weights, 1.0);
  EXPECT_EQ(weights, (std::vector<float>{0.0f, 2.5f}));
}

TEST(OdSgd, UsageErrors) {
  auto message = [](const std::string& spec, const OptionValues& options) {
    try {
      select_for_test(spec, options);
    } catch (const UsageError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("odsgd", {{"--local-updater", "adam"}}), "--local-updater must be sgd, dcasgd-c or dcasgd-a, got 'adam'");
  EXPECT_EQ(message("odsgd", {{"--local-lr", "-1"}}), "--local-lr must be > 0, got -1");
  EXPECT_EQ(message("dcasgd", {{"--dc-lambda", "-0.5"}}), "--dc-lambda must be >= 0, got -0.5");
  EXPECT_EQ(message("odsgd+int8", {}),
            "unknown option 'int8' in method 'odsgd+int8': a codec, which applies only to dsync, pipe, wfbp, synceasgd, "
            "mgwfbp, sapipe and auto (method 'odsgd' takes no +options)");
  EXPECT_EQ(message("odsgd", {{"--dc-lambda", "0.1"}}),
            "--dc-lambda applies only to dcasgd, odsgd with --local-updater dcasgd-c or dcasgd-a and sapipe, not "
            "'odsgd'");
}

}  // namespace
}  // namespace pipesgd
