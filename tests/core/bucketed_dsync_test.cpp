// Layer-wise D-Sync (algo/bucketed_dsync.h) through run_training on the tiny softmax model cut into
// 14 layers: every bucket plan trains the same weights as the single bucket (bit for bit where the
// allreduce's per-element summation order does not depend on the bucket boundaries), the plan is
// reported, replanning mid-run is safe, a model without readiness reports still works, usage errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "pipesgd/algo/bucketed_dsync.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/trainer.h"
#include "resegmented_model.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

constexpr std::size_t kPieces = 7;  // 7 weight segments + 7 bias segments: 14 layers

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TrainConfig layer_wise_config(const std::string& plan, int workers, const std::string& algorithm) {
  TrainConfig config = tiny_config("dsync", workers);
  config.method.buckets = plan;
  config.method.allreduce_algorithm = algorithm;
  config.method.profile_iterations = 3;
  config.method.replan_every = 5;  // re-plans at iterations 8, 13, 18, 23: plan changes mid-run
  return config;
}

RunSummary run(const TrainConfig& config) {
  return run_training(config, resegmented_softmax_factory(kPieces), small_data());
}

class EveryPlan : public testing::TestWithParam<std::tuple<int, std::string>> {};

// Bucketing changes only which elements are allreduced together. Recursive doubling adds every
// element along the same tree whatever the message (x0 + x1, then the pair sums; fp32 addition is
// commutative, so every rank gets the same bits): bit-identical for every plan and world size. The
// ring adds chunk c in ring order starting after rank c, and which chunk an element falls into
// depends on its bucket's offset and size: for 3+ ranks two plans may add an element's p terms in
// different orders. Two fp32 sums of the same p terms differ by at most 2 (p - 1) u sum |g| (u =
// 2^-24), ~4e-7 of the gradient for p = 4; through 25 iterations of lr 0.1 and momentum 0.9 (at most
// 10x) that is ~1e-5 of O(1) weights: tolerance 2e-5 (1 + |w|), as for PS-Sync vs D-Sync. With 1 or
// 2 ranks a + b = b + a: bit-identical for the ring too.
TEST_P(EveryPlan, TrainsTheSingleBucketWeights) {
  const auto& [workers, algorithm] = GetParam();
  const bool exact = algorithm == "recursive-doubling" || workers <= 2;
  const RunSummary single = run(layer_wise_config("single", workers, algorithm));
  for (const std::string plan : {"wfbp", "mgwfbp", "optimal", "fixed:0.01"}) {
    SCOPED_TRACE(plan);
    const RunSummary other = run(layer_wise_config(plan, workers, algorithm));
    for (int r = 0; r < workers; ++r) {
      const auto& a = other.final_parameters[static_cast<std::size_t>(r)];
      const auto& b = single.final_parameters[static_cast<std::size_t>(r)];
      if (exact) {
        ASSERT_TRUE(bit_identical(a, b)) << "rank " << r;
      } else {
        for (std::size_t i = 0; i < a.size(); ++i) {
          ASSERT_NEAR(a[i], b[i], 2e-5 * (1 + std::fabs(b[i]))) << "rank " << r << ", element " << i;
        }
      }
    }
    EXPECT_FALSE(other.plan.empty());
  }
  // Not vacuous: the weights moved away from the initial ones.
  auto initial = resegmented_softmax_factory(kPieces)(11);
  double moved = 0;
  for (std::size_t i = 0; i < single.final_parameters[0].size(); ++i) {
    moved = std::max(moved, std::fabs(double(single.final_parameters[0][i]) - initial->parameters()[i]));
  }
  EXPECT_GT(moved, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, EveryPlan,
                         testing::Combine(testing::Values(1, 2, 3, 4),
                                          testing::Values(std::string("ring"),
                                                          std::string("recursive-doubling"))),
                         [](const auto& info) {
                           std::string name = concat(std::get<0>(info.param), "_ranks_",
                                                     std::get<1>(info.param));
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// The single-bucket plan is the classic D-Sync allreduce (same buffer, same algorithm, same
// segments), only on the comm thread: bit-identical for any world size.
TEST(LayerWise, SingleBucketIsClassicDSyncBitForBit) {
  for (int workers : {1, 3, 4}) {
    SCOPED_TRACE(workers);
    TrainConfig classic = tiny_config("dsync", workers);
    const RunSummary a = run(classic);
    TrainConfig synceasgd = tiny_config("synceasgd", workers);
    // One profiled iteration: the single-bucket phase only (the interference phase would run one
    // bucket per layer, whose ring chunking differs for 3+ ranks).
    synceasgd.method.profile_iterations = 1;
    const RunSummary b = run(synceasgd);
    for (int r = 0; r < workers; ++r) {
      EXPECT_TRUE(bit_identical(a.final_parameters[static_cast<std::size_t>(r)],
                                b.final_parameters[static_cast<std::size_t>(r)]));
    }
    EXPECT_EQ(a.plan, "");
    EXPECT_EQ(a.allreduce_calls, 1u);
    EXPECT_EQ(b.plan, "single: 1 bucket: [13..0]");
    EXPECT_EQ(b.allreduce_calls, 1u);
  }
}

TEST(LayerWise, ReportsThePlanAndItsPrediction) {
  TrainConfig config = tiny_config("wfbp", 2);
  config.method.profile_iterations = 4;
  const RunSummary wfbp = run(config);
  EXPECT_EQ(wfbp.plan,
            "wfbp: 14 buckets: [13] [12] [11] [10] [9] [8] [7] [6] [5] [4] [3] [2] [1] [0]");
  EXPECT_EQ(wfbp.allreduce_calls, 14u);
  EXPECT_GT(wfbp.predicted_iteration, 0);
  EXPECT_GE(wfbp.predicted_non_overlapped_comm, 0);
  EXPECT_EQ(wfbp.non_overlapped_comm, wfbp.mean.wait);
  // The profiled iterations (single bucket) are not among the measured ones.
  EXPECT_LE(wfbp.measured_iterations, 25 - 4);
}

// A model that reports no segment ready: every bucket is sent after backward, same weights.
class SilentModel final : public Model {
 public:
  explicit SilentModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn&) override {
    return inner_->forward_backward(batch, gradients, {});
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
};

TEST(LayerWise, ModelWithoutReadinessReportsStillTrains) {
  const ModelFactory silent = [](std::uint64_t seed) -> std::unique_ptr<Model> {
    return std::make_unique<SilentModel>(resegmented_softmax_factory(kPieces)(seed));
  };
  TrainConfig config = tiny_config("wfbp", 2);
  config.method.profile_iterations = 2;
  const RunSummary quiet = run_training(config, silent, small_data());
  const RunSummary reporting = run(config);
  EXPECT_TRUE(bit_identical(quiet.final_parameters[0], reporting.final_parameters[0]));
}

TEST(LayerWise, UsageErrors) {
  auto message = [](TrainConfig config) {
    try {
      run(config);
    } catch (const UsageError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  TrainConfig config = tiny_config("wfbp", 2);
  config.method.buckets = "optimal";
  EXPECT_EQ(message(config),
            "method 'wfbp' is dsync with the wfbp plan; for the optimal plan use dsync+optimal");
  config = tiny_config("dsync", 2);
  config.method.buckets = "fastest";
  EXPECT_EQ(message(config).rfind("unknown bucket plan \"fastest\"", 0), 0u) << message(config);
  config = tiny_config("mgwfbp", 2);
  config.method.profile_iterations = 0;
  EXPECT_EQ(message(config), "--profile-iters must be in [1, 10000000], got 0");
  config = tiny_config("mgwfbp", 2);
  config.method.replan_every = -1;
  EXPECT_EQ(message(config), "--replan-every must be in [0, 10000000] (0: never), got -1");
  config = tiny_config("pipe", 2);
  config.method.buckets = "wfbp";
  EXPECT_EQ(message(config), "bucket plans apply to dsync (and wfbp, synceasgd, mgwfbp) and sapipe only, not 'pipe'");
}

TEST(LayerWise, MethodSpecsNamePlansAndCodecs) {
  TrainConfig config;
  apply_method_spec("dsync+optimal+int8", config);
  EXPECT_EQ(config.method.name, "dsync");
  EXPECT_EQ(config.method.buckets, "optimal");
  EXPECT_EQ(config.method.codec, "int8");
  apply_method_spec("wfbp+bf16", config);
  EXPECT_EQ(config.method.buckets, "wfbp");
  EXPECT_EQ(config.method.codec, "bf16");
  apply_method_spec("dsync+fixed:25", config);
  EXPECT_EQ(config.method.buckets, "fixed:25");
  EXPECT_THROW(apply_method_spec("dsync+optimal+wfbp", config), UsageError);
  EXPECT_THROW(apply_method_spec("pipe+optimal", config), UsageError);
}

// The cost probes cover the smallest layer (at least 4 KiB) to the whole gradient.
TEST(LayerWise, CostProbeSizesSpanTheLayers) {
  LayerProfile profile;
  profile.bytes = {40, 400000, 4000000};
  profile.backward_seconds = {0, 0, 0};
  const std::vector<double> sizes = cost_probe_sizes(profile);
  ASSERT_EQ(sizes.size(), static_cast<std::size_t>(kCostProbes));
  EXPECT_EQ(sizes.front(), 4096);
  EXPECT_EQ(sizes.back(), 4400040);
  for (std::size_t k = 1; k < sizes.size(); ++k) EXPECT_GT(sizes[k], sizes[k - 1]);
  // a + b*M recovered from exact timings.
  std::vector<double> seconds;
  for (double m : sizes) seconds.push_back(0.002 + 1e-8 * m);
  const LinearCost cost = fit_measured_cost(sizes, seconds, "ring", 4);
  EXPECT_NEAR(cost.a, 0.002, 1e-6);
  EXPECT_NEAR(cost.b, 1e-8, 1e-11);
}

}  // namespace
}  // namespace pipesgd
