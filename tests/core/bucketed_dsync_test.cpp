// Layer-wise D-Sync (algo/dsync/bucketed_dsync.h) through run_training on the tiny softmax model cut into
// 14 layers: every bucket plan trains the same weights as the single bucket (bit for bit where the
// allreduce's per-element summation order does not depend on the bucket boundaries), the plan is
// reported, replanning mid-run is safe, a model without readiness reports still works, usage errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "pipesgd/algo/dsync/dsync_options.h"
#include "pipesgd/algo/dsync/layer_wise_report.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/core/error.h"
#include "pipesgd/report/report.h"
#include "pipesgd/train/trainer.h"
#include "pipesgd/algo/registry.h"
#include "resegmented_model.h"
#include "softmax_batches.h"
#include "test_world.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

constexpr std::size_t kPieces = 7;  // 7 weight segments + 7 bias segments: 14 layers

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TrainConfig layer_wise_config(const std::string& plan, int workers, const std::string& algorithm) {
  // Re-plans at iterations 8, 13, 18, 23: the plan changes mid-run.
  return tiny_config("dsync", workers, 0,
                     {{"--buckets", plan}, {"--allreduce", algorithm}, {"--profile-iters", "3"}, {"--replan-every", "5"}});
}

// The layer-wise report of a run.
const LayerWiseReport& layer_wise(const RunSummary& summary) {
  const auto* report = dynamic_cast<const LayerWiseReport*>(summary.figures.report.get());
  if (report == nullptr) throw std::logic_error("not a layer-wise run");
  return *report;
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
    EXPECT_FALSE(other.figures.report->bucket_plan().empty());
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
    // One profiled iteration: the single-bucket phase only (the interference phase would run one
    // bucket per layer, whose ring chunking differs for 3+ ranks).
    TrainConfig synceasgd = tiny_config("synceasgd", workers, 0, {{"--profile-iters", "1"}});
    const RunSummary b = run(synceasgd);
    for (int r = 0; r < workers; ++r) {
      EXPECT_TRUE(bit_identical(a.final_parameters[static_cast<std::size_t>(r)],
                                b.final_parameters[static_cast<std::size_t>(r)]));
    }
    EXPECT_EQ(a.figures.report->bucket_plan(), "");
    EXPECT_EQ(a.figures.report->allreduce_calls(), 1u);
    EXPECT_EQ(b.figures.report->bucket_plan(), "single: 1 bucket: [13..0]");
    EXPECT_EQ(b.figures.report->allreduce_calls(), 1u);
  }
}

TEST(LayerWise, ReportsThePlanAndItsPrediction) {
  const RunSummary wfbp = run(tiny_config("wfbp", 2, 0, {{"--profile-iters", "4"}}));
  EXPECT_EQ(wfbp.figures.report->bucket_plan(),
            "wfbp: 14 buckets: [13] [12] [11] [10] [9] [8] [7] [6] [5] [4] [3] [2] [1] [0]");
  EXPECT_EQ(wfbp.figures.report->allreduce_calls(), 14u);
  EXPECT_GT(wfbp.figures.predicted_iteration, 0);
  EXPECT_GE(layer_wise(wfbp).predicted_non_overlapped, 0);
  const nlohmann::json summary = summary_to_json(wfbp);
  EXPECT_EQ(summary["non_overlapped_comm_s"].get<double>(), wfbp.figures.mean.wait);
  EXPECT_EQ(summary["predicted_non_overlapped_comm_s"].get<double>(), layer_wise(wfbp).predicted_non_overlapped);
  // The profiled iterations (single bucket) are not among the measured ones.
  EXPECT_LE(wfbp.timing.measured_iterations, 25 - 4);
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
  const TrainConfig config = tiny_config("wfbp", 2, 0, {{"--profile-iters", "2"}});
  const RunSummary quiet = run_training(config, silent, small_data());
  const RunSummary reporting = run(config);
  EXPECT_TRUE(bit_identical(quiet.final_parameters[0], reporting.final_parameters[0]));
}

// The softmax model (2 segments: weights, bias) reporting fixed backward times per segment, so that
// a test knows what the readiness intervals sum to.
class FixedBackwardModel final : public Model {
 public:
  static constexpr double kWeightsSeconds = 3e-3, kBiasSeconds = 2e-3;
  explicit FixedBackwardModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& on_ready) override {
    StepResult result = inner_->forward_backward(batch, gradients, {});
    if (on_ready) {
      on_ready(1, kBiasSeconds);  // backward order: the last segment first
      on_ready(0, kWeightsSeconds);
    }
    return result;
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
};

// The planning profile separates backward's tail (the whole backward, the trainer's clock, past the
// readiness intervals) from kappa (what launching buckets during backward adds to the whole): the
// iteration times are given here, so the expected values are exact. Before the tail was measured,
// kappa charged the tail to the bucket launches (here 8 ms instead of 3 ms).
TEST(LayerWise, PlanningSeparatesBackwardsTailFromKappa) {
  constexpr std::int64_t kProfileIterations = 4;  // 2 single-bucket iterations, then 2 with a bucket per layer
  constexpr double kWholeBackward = 10e-3, kSlowedBackward = 13e-3;
  const MethodSelection selection =
      select_for_test("dsync", {{"--buckets", "wfbp"}, {"--profile-iters", std::to_string(kProfileIterations)}});
  const std::int64_t iterations = kProfileWarmupIterations + kProfileIterations;
  const SoftmaxBatches data = make_softmax_batches(3, 2, iterations, 784, 10, 4);
  // One slot per rank, each written by its own rank's thread (an optional per rank, not a
  // vector<bool>: its bits share words, so two ranks' writes would race).
  std::vector<std::optional<PlanningInputs>> planned(2);
  run_ranks(2, [&](int rank, Transport& transport) {
    FixedBackwardModel model(softmax_factory()(1));
    std::unique_ptr<TrainingMethod> method = make_method(selection, transport, model, 0);
    ASSERT_NE(method->segment_ready(), nullptr);
    for (std::int64_t t = 0; t < iterations; ++t) {
      IterationTimes times;
      std::span<float> gradients = method->begin_iteration(t, times);
      model.forward_backward(data.at(rank, t, 2), gradients, *method->segment_ready());
      const bool single_phase = t < kProfileWarmupIterations + kProfileIterations / 2;
      times.backward = single_phase ? kWholeBackward : kSlowedBackward;
      method->end_iteration(t, times);
    }
    IterationTimes times;
    method->finish(times);
    const std::shared_ptr<MethodReport> report = method->report();
    if (const PlanningInputs* inputs = report->planning_inputs()) planned[static_cast<std::size_t>(rank)] = *inputs;
  });
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    ASSERT_TRUE(planned[static_cast<std::size_t>(rank)].has_value()) << "no plan was made";
    const PlanningInputs& inputs = *planned[static_cast<std::size_t>(rank)];
    ASSERT_EQ(inputs.profile.backward_seconds.size(), 2u);
    // The profile travels as float: relative 1e-6.
    EXPECT_NEAR(inputs.profile.backward_seconds[0], FixedBackwardModel::kWeightsSeconds, 1e-8);
    EXPECT_NEAR(inputs.profile.backward_seconds[1], FixedBackwardModel::kBiasSeconds, 1e-8);
    const double hooks = FixedBackwardModel::kWeightsSeconds + FixedBackwardModel::kBiasSeconds;
    EXPECT_NEAR(inputs.backward_tail_seconds, kWholeBackward - hooks, 1e-8);
    // One bucket launched during backward (2 layers, wfbp's phase: a bucket per layer).
    EXPECT_NEAR(inputs.profile.per_bucket_compute_seconds, kSlowedBackward - kWholeBackward, 1e-8);
  }
}

// The cost probe at the whole gradient is the one-bucket iterations' own allreduce (each worker's
// median, averaged over the workers), not timed again after them: with rank 1's emulated link 20x
// slower during those iterations only, the probe holds their time, far above the smaller probes
// timed at the normal speed after the cycle (the fit of a + b·M weighs it as one point of four).
TEST(LayerWise, TheWholeGradientsProbeIsTheOneBucketIterationsOwnAllreduce) {
  constexpr std::int64_t kProfileIterations = 6;  // 3 one-bucket iterations, then 3 with a bucket per layer
  constexpr double kSlowdown = 20;
  NetworkSpec network;
  network.bits_per_second = 100e6;
  network.latency_seconds = 50e-6;
  network.name = "bw=100Mbit,lat=50us";
  LocalFabric fabric(2, network);
  const MethodSelection selection =
      select_for_test("dsync", {{"--buckets", "wfbp"}, {"--profile-iters", std::to_string(kProfileIterations)}});
  const std::int64_t single_begin = kProfileWarmupIterations;
  const std::int64_t single_end = single_begin + kProfileIterations - kProfileIterations / 2;
  const std::int64_t iterations = kProfileWarmupIterations + kProfileIterations;
  const SoftmaxBatches data = make_softmax_batches(5, 2, iterations, 784, 10, 4);
  std::vector<std::vector<double>> single_comm(2);  // each rank's, written by its own thread
  std::vector<std::optional<PlanningInputs>> planned(2);
  run_ranks_on(fabric, [&](int rank, Transport& transport) {
    std::unique_ptr<Model> model = softmax_factory()(1);
    std::unique_ptr<TrainingMethod> method = make_method(selection, transport, *model, 0);
    for (std::int64_t t = 0; t < iterations; ++t) {
      if (rank == 1 && t == single_begin) fabric.slow_link(1, kSlowdown);
      if (rank == 1 && t == single_end) fabric.slow_link(1, 1);
      IterationTimes times;
      std::span<float> gradients = method->begin_iteration(t, times);
      model->forward_backward(data.at(rank, t, 2), gradients, *method->segment_ready());
      method->end_iteration(t, times);
      if (t >= single_begin && t < single_end) single_comm[static_cast<std::size_t>(rank)].push_back(times.comm);
    }
    IterationTimes times;
    method->finish(times);
    if (const PlanningInputs* inputs = method->report()->planning_inputs()) planned[static_cast<std::size_t>(rank)] = *inputs;
  });
  double expected = 0;
  for (std::vector<double>& seconds : single_comm) {
    ASSERT_EQ(seconds.size(), 3u);
    std::sort(seconds.begin(), seconds.end());
    expected += seconds[1] / 2;
  }
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    ASSERT_TRUE(planned[static_cast<std::size_t>(rank)].has_value()) << "no plan was made";
    const PlanningInputs& inputs = *planned[static_cast<std::size_t>(rank)];
    ASSERT_EQ(inputs.probe_seconds.size(), static_cast<std::size_t>(kCostProbes));
    ASSERT_EQ(inputs.probe_bytes.size(), static_cast<std::size_t>(kCostProbes));
    EXPECT_EQ(inputs.probe_bytes.back(), (784 * 10 + 10) * 4);
    EXPECT_NEAR(inputs.probe_seconds.back(), expected, 1e-6 * expected);  // averaged as float
    // The slowed allreduce moves its 31 KB at 5 Mbit/s, ~50 ms; the probe before it, about half
    // the bytes at full speed, ~1.3 ms: a timing of the whole gradient after the cycle would be ~2.5 ms.
    EXPECT_GT(inputs.probe_seconds.back(), 5 * inputs.probe_seconds[kCostProbes - 2]) << inputs.probe_seconds[kCostProbes - 2];
  }
}

TEST(LayerWise, UsageErrors) {
  auto message = [](const std::string& spec, const OptionValues& options) {
    try {
      select_for_test(spec, options);
    } catch (const UsageError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("wfbp+optimal", {}),
            "method 'wfbp' is dsync with the wfbp plan; for the optimal plan use dsync+optimal");
  const std::string fastest = message("dsync", {{"--buckets", "fastest"}});
  EXPECT_EQ(fastest.rfind("unknown bucket plan \"fastest\"", 0), 0u) << fastest;
  EXPECT_EQ(message("mgwfbp", {{"--profile-iters", "0"}}), "--profile-iters must be in [1, 10000000], got 0");
  EXPECT_EQ(message("mgwfbp", {{"--replan-every", "-1"}}), "--replan-every must be in [0, 10000000] (0: never), got -1");
  EXPECT_EQ(message("pipe", {{"--buckets", "wfbp"}}), "--buckets applies only to dsync and sapipe, not 'pipe'");
  EXPECT_EQ(message("wfbp", {{"--buckets", "optimal"}}), "--buckets applies only to dsync and sapipe, not 'wfbp'");
  EXPECT_EQ(message("dsync", {{"--profile-iters", "3"}}),
            "--profile-iters applies only to layer-wise communication: add --buckets PLAN (or use wfbp, synceasgd, "
            "mgwfbp, dsync+PLAN)");
}

TEST(LayerWise, MethodSpecsNamePlansAndCodecs) {
  MethodSelection method = select_for_test("dsync+optimal+int8");
  EXPECT_EQ(method.name(), "dsync");
  EXPECT_EQ(options_as<DsyncOptions>(*method.options).buckets, "optimal");
  EXPECT_EQ(method.common.codec, "int8");
  method = select_for_test("wfbp+bf16");
  EXPECT_EQ(options_as<DsyncOptions>(*method.options).buckets, "wfbp");
  EXPECT_EQ(method.common.codec, "bf16");
  method = select_for_test("dsync+fixed:25");
  EXPECT_EQ(options_as<DsyncOptions>(*method.options).buckets, "fixed:25");
  EXPECT_THROW(select_for_test("dsync+optimal+wfbp"), UsageError);
  EXPECT_THROW(select_for_test("pipe+optimal"), UsageError);
}

// The cost probes cover the smallest layer (at least 4 KiB) to the whole gradient.
TEST(LayerWise, CostProbeSizesSpanTheLayers) {
  LayerProfile profile;
  profile.bytes = {40, 400000, 4000000};
  profile.backward_seconds = {0, 0, 0};
  const std::vector<double> sizes = cost_probe_sizes(profile.bytes);
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
