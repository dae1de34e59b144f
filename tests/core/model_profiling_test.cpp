// `pipesgd profile`'s measurement (tools/model_profiling.h) on the pure-C++ softmax model: per-layer
// figures from the model's reports, the fallbacks for a model that reports nothing, codec costs,
// the source line, and the profile file's round trip.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/data/sampler.h"
#include "pipesgd/models/softmax_regression.h"
#include "pipesgd/tools/model_profiling.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

// The softmax model without its reports: no segment ready, no forward hook.
class SilentModel final : public Model {
 public:
  explicit SilentModel(std::uint64_t seed) : inner_(784, 10, seed) {}
  const Layout& layout() const override { return inner_.layout(); }
  std::span<float> parameters() override { return inner_.parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients, const SegmentReadyFn&) override {
    return inner_.forward_backward(batch, gradients, {});
  }
  Evaluation evaluate(const Batch& batch) override { return inner_.evaluate(batch); }

 private:
  SoftmaxRegression inner_;
};

ProfilingOptions small_options() {
  ProfilingOptions options;
  options.model = "softmax";
  options.batch = 5;
  options.warmup_iterations = 2;
  options.iterations = 5;
  options.codec_repetitions = 3;
  return options;
}

void expect_codecs(const ModelProfile& profile) {
  ASSERT_EQ(profile.codecs.size(), codec_names().size());
  for (const std::string& name : codec_names()) {
    ASSERT_TRUE(profile.codecs.count(name)) << name;
    const CodecCost cost = profile.codec_cost(name);
    EXPECT_GT(cost.encode, 0) << name;
    EXPECT_GT(cost.decode, 0) << name;
    EXPECT_GT(cost.decode_add, 0) << name;
  }
}

// A profile of three layers whose forward splits 1 : 2 : 1 and whose data takes 1 ms.
MeasuredProfile three_layer_profile() {
  MeasuredProfile measured;
  measured.profile.model = "three";
  measured.profile.data_seconds = 1e-3;
  measured.profile.update_seconds = 5e-4;
  measured.profile.layers = {{"a", 100, 1e-3, 9e-3}, {"b", 200, 2e-3, 9e-3}, {"c", 100, 1e-3, 9e-3}};
  return measured;
}

TEST(ModelProfiling, SoftmaxFromItsReports) {
  const DataSplits data = small_data();
  SoftmaxRegression model(784, 10, 1);
  ProfilingOptions options = small_options();
  std::vector<std::pair<std::string, std::int64_t>> progress;
  options.progress = [&](const std::string& phase, std::int64_t done, std::int64_t total) {
    EXPECT_EQ(total, 7);
    progress.emplace_back(phase, done);
  };
  const MeasuredProfile measured = measure_model_profile(model, data.train, options);
  const ModelProfile& profile = measured.profile;
  EXPECT_TRUE(measured.forward_from_hooks);
  EXPECT_TRUE(measured.backward_all_reported);
  EXPECT_EQ(profile.model, "softmax");
  EXPECT_EQ(profile.batch, 5);
  ASSERT_EQ(profile.layers.size(), 2u);
  EXPECT_EQ(profile.layers[0].name, "linear.weight");
  EXPECT_EQ(profile.layers[0].parameters, 7840u);
  EXPECT_EQ(profile.layers[1].name, "linear.bias");
  EXPECT_EQ(profile.layers[1].parameters, 10u);
  EXPECT_GT(profile.forward_seconds(), 0);
  EXPECT_GT(profile.backward_seconds(), 0);
  EXPECT_GT(profile.data_seconds, 0);
  EXPECT_GT(profile.update_seconds, 0);
  expect_codecs(profile);
  // One call per iteration (warm-up included), then the codecs'.
  ASSERT_EQ(progress.size(), 8u);
  for (std::int64_t t = 0; t < 7; ++t) {
    EXPECT_EQ(progress[static_cast<std::size_t>(t)], std::make_pair(std::string("iterations"), t + 1));
  }
  EXPECT_EQ(progress.back().first, "codecs");
  // The hook is cleared afterwards: the model's forward runs without it.
  std::vector<float> gradients(model.layout().total());
  (void)model.forward_backward(dataset_range(data.train, 0, 5), gradients, {});

  EXPECT_EQ(measured_profile_source(measured, "host1", "2025-01-02", 5),
            "measured by pipesgd profile on host1, 2025-01-02, 5 iterations, batch 5");
  // What the file holds reads back as the same profile.
  const ModelProfile back = model_profile_from_json(to_json(profile), "test");
  ASSERT_EQ(back.layers.size(), 2u);
  EXPECT_EQ(back.layers[0].parameters, 7840u);
  EXPECT_DOUBLE_EQ(back.layers[1].backward_seconds, profile.layers[1].backward_seconds);
  // SAPipe's stale update with each compensation, measured with the runtime's StaleCompensation:
  // every one costs time, and wp3 (a DC pass, the step and a prediction) more than the plain step.
  for (const std::string name : {"sapipe:none", "sapipe:dc", "sapipe:wp1", "sapipe:wp2", "sapipe:wp3"}) {
    ASSERT_NE(profile.method_cost(name), nullptr) << name;
    EXPECT_GT(*profile.method_cost(name), 0) << name;
    ASSERT_NE(back.method_cost(name), nullptr) << name;
    EXPECT_DOUBLE_EQ(*back.method_cost(name), *profile.method_cost(name)) << name;
  }
  EXPECT_GT(*profile.method_cost("sapipe:wp3"), *profile.method_cost("sapipe:none"));
  EXPECT_EQ(profile.method_cost("pipe:none"), nullptr);
}

TEST(ModelProfiling, MethodCostsMustBeNumbersAtLeastZero) {
  const DataSplits data = small_data();
  SoftmaxRegression model(784, 10, 1);
  nlohmann::json file = to_json(measure_model_profile(model, data.train, small_options()).profile);
  file["method_costs"]["sapipe:wp3"] = -1.0;
  EXPECT_THROW(model_profile_from_json(file, "test"), DataError);
  file["method_costs"]["sapipe:wp3"] = "fast";
  EXPECT_THROW(model_profile_from_json(file, "test"), DataError);
  file["method_costs"] = 3;
  EXPECT_THROW(model_profile_from_json(file, "test"), DataError);
  file.erase("method_costs");  // optional: a profile without them estimates the costs
  EXPECT_TRUE(model_profile_from_json(file, "test").method_costs.empty());
}

TEST(ModelProfiling, BucketLaunchSecondsIsOptionalAndAtLeastZero) {
  MeasuredProfile measured = three_layer_profile();
  nlohmann::json file = to_json(measured.profile);
  EXPECT_FALSE(file.contains("bucket_launch_seconds"));  // 0: not written
  EXPECT_EQ(model_profile_from_json(file, "test").bucket_launch_seconds, 0);
  measured.profile.bucket_launch_seconds = 4e-5;
  file = to_json(measured.profile);
  EXPECT_DOUBLE_EQ(model_profile_from_json(file, "test").bucket_launch_seconds, 4e-5);
  EXPECT_DOUBLE_EQ(layer_profile(measured.profile, "none").per_bucket_compute_seconds, 4e-5);  // the planners'
  file["bucket_launch_seconds"] = -1.0;
  EXPECT_THROW(model_profile_from_json(file, "test"), DataError);
  file["bucket_launch_seconds"] = "slow";
  EXPECT_THROW(model_profile_from_json(file, "test"), DataError);
}

TEST(ModelProfiling, ModelWithoutReportsIsSplitAndSaysSo) {
  const DataSplits data = small_data();
  SilentModel model(1);
  const MeasuredProfile measured = measure_model_profile(model, data.train, small_options());
  const ModelProfile& profile = measured.profile;
  EXPECT_FALSE(measured.forward_from_hooks);
  EXPECT_FALSE(measured.backward_all_reported);
  ASSERT_EQ(profile.layers.size(), 2u);
  // Backward by parameter count, forward in proportion to backward: both 7840 : 10.
  ASSERT_GT(profile.layers[1].backward_seconds, 0);
  ASSERT_GT(profile.layers[1].forward_seconds, 0);
  EXPECT_NEAR(profile.layers[0].backward_seconds / profile.layers[1].backward_seconds, 784.0, 1e-6);
  EXPECT_NEAR(profile.layers[0].forward_seconds / profile.layers[1].forward_seconds, 784.0, 1e-6);
  const std::string source = measured_profile_source(measured, "h", "d", 5);
  EXPECT_NE(source.find("reports no forward progress"), std::string::npos) << source;
  EXPECT_NE(source.find("split in proportion to the layers' backward times"), std::string::npos) << source;
  EXPECT_NE(source.find("by parameter count"), std::string::npos) << source;
}

TEST(ModelProfiling, ReplicasAtOnceAreAveragedAndSaySo) {
  const DataSplits data = small_data();
  SoftmaxRegression first(784, 10, 1), second(784, 10, 1), third(784, 10, 1);
  std::int64_t calls = 0;
  ProfilingOptions options = small_options();
  options.progress = [&](const std::string&, std::int64_t, std::int64_t) { ++calls; };  // replica 0's only
  const MeasuredProfile measured = measure_concurrent_profile({&first, &second, &third}, data.train, options);
  EXPECT_EQ(measured.replicas, 3);
  EXPECT_EQ(calls, 7 + 1);  // 2 warm-up + 5 measured iterations, then "codecs": once, not three times
  const ModelProfile& profile = measured.profile;
  ASSERT_EQ(profile.layers.size(), first.layout().segment_count());
  for (std::size_t l = 0; l < profile.layers.size(); ++l) {
    EXPECT_EQ(profile.layers[l].parameters, first.layout().segment(l).count);
    EXPECT_GT(profile.layers[l].backward_seconds, 0);
  }
  EXPECT_GT(profile.update_seconds, 0);
  expect_codecs(profile);
  EXPECT_NE(measured_profile_source(measured, "host", "2026-01-01", 5).find(", 3 replicas at once"), std::string::npos);
  // One replica is measure_model_profile's profile, without the note.
  const MeasuredProfile one = measure_concurrent_profile({&first}, data.train, small_options());
  EXPECT_EQ(one.replicas, 1);
  EXPECT_EQ(measured_profile_source(one, "host", "2026-01-01", 5).find("replicas"), std::string::npos);
  EXPECT_THROW(measure_concurrent_profile({}, data.train, small_options()), UsageError);
}

TEST(ModelProfiling, RunComputeReplacesBackwardForwardAndUpdate) {
  MeasuredProfile measured = three_layer_profile();
  RunCompute run;
  run.layers.backward_seconds = {3e-3, 4e-3, 5e-3};
  run.layers.forward_seconds = 9e-3;  // data (the profile's 1 ms) + forward 8 ms
  run.update_seconds = 7e-4;
  run.layers.per_bucket_compute_seconds = 3e-5;
  run.backward_tail_seconds = 6e-4;
  run.workers = 2;
  run.network = "10gbe";
  adopt_run_compute(measured, run);
  const ModelProfile& profile = measured.profile;
  // Forward 8 ms split 1 : 2 : 1 as the profile measured it; backward and update the run's.
  EXPECT_DOUBLE_EQ(profile.layers[0].forward_seconds, 2e-3);
  EXPECT_DOUBLE_EQ(profile.layers[1].forward_seconds, 4e-3);
  EXPECT_DOUBLE_EQ(profile.layers[2].forward_seconds, 2e-3);
  // Backward's tail goes to segment 0, which backward computes last: the layers sum to the whole.
  EXPECT_DOUBLE_EQ(profile.layers[0].backward_seconds, 3e-3 + 6e-4);
  EXPECT_DOUBLE_EQ(profile.layers[1].backward_seconds, 4e-3);
  EXPECT_DOUBLE_EQ(profile.layers[2].backward_seconds, 5e-3);
  EXPECT_DOUBLE_EQ(profile.backward_seconds(), 12e-3 + 6e-4);
  EXPECT_DOUBLE_EQ(profile.update_seconds, 7e-4);
  EXPECT_DOUBLE_EQ(profile.bucket_launch_seconds, 3e-5);
  EXPECT_DOUBLE_EQ(profile.data_seconds, 1e-3);  // the profile's
  EXPECT_EQ(profile.layers[1].parameters, 200u);
  const std::string source = measured_profile_source(measured, "h", "d", 5);
  EXPECT_NE(source.find("means of a 2-worker D-Sync run over network 10gbe"), std::string::npos) << source;
}

TEST(ModelProfiling, RunComputeWithoutProfiledForwardSplitsByParameters) {
  MeasuredProfile measured = three_layer_profile();
  for (ProfiledLayer& layer : measured.profile.layers) layer.forward_seconds = 0;
  RunCompute run;
  run.layers.backward_seconds = {1e-3, 1e-3, 1e-3};
  run.layers.forward_seconds = 5e-3;
  adopt_run_compute(measured, run);
  EXPECT_DOUBLE_EQ(measured.profile.layers[0].forward_seconds, 1e-3);
  EXPECT_DOUBLE_EQ(measured.profile.layers[1].forward_seconds, 2e-3);
  // A run faster before backward than the profile's data time: forward 0, not negative.
  MeasuredProfile fast = three_layer_profile();
  run.layers.forward_seconds = 5e-4;
  adopt_run_compute(fast, run);
  for (const ProfiledLayer& layer : fast.profile.layers) EXPECT_EQ(layer.forward_seconds, 0);
}

TEST(ModelProfiling, RunComputeMustMatchTheLayers) {
  MeasuredProfile measured = three_layer_profile();
  RunCompute run;
  run.layers.backward_seconds = {1e-3, 1e-3};
  EXPECT_THROW(adopt_run_compute(measured, run), UsageError);
  run.layers.backward_seconds = {1e-3, 1e-3, 1e-3};
  measured.backward_all_reported = false;  // a model whose layers the run cannot time
  EXPECT_THROW(adopt_run_compute(measured, run), UsageError);
}

TEST(ModelProfiling, BadOptions) {
  const DataSplits data = small_data();
  SoftmaxRegression model(784, 10, 1);
  ProfilingOptions options = small_options();
  options.iterations = 0;
  EXPECT_THROW(measure_model_profile(model, data.train, options), UsageError);
  options = small_options();
  options.batch = data.train.size + 1;
  EXPECT_THROW(measure_model_profile(model, data.train, options), UsageError);
}

TEST(ModelProfiling, CodecCosts) {
  const std::vector<float> values(4096, 0.25f);
  const std::map<std::string, CodecCost> costs = measure_codec_costs(values, 3);
  ASSERT_EQ(costs.size(), 3u);
  for (const auto& [name, cost] : costs) {
    EXPECT_GT(cost.encode, 0) << name;
    EXPECT_GT(cost.decode, 0) << name;
    EXPECT_GT(cost.decode_add, 0) << name;
  }
  for (const auto& [name, cost] : measure_codec_costs({}, 3)) EXPECT_EQ(cost.encode, 0) << name;
  EXPECT_THROW(measure_codec_costs(values, 0), UsageError);
}

}  // namespace
}  // namespace pipesgd
