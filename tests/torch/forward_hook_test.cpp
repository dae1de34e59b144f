// The forward hook of the LibTorch models (Model::set_forward_hook): when it is called, in which
// groups, and that parameters it changes are the ones forward then reads.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pipesgd/data/dataset.h"
#include "pipesgd/torch/torch_models.h"

namespace pipesgd {
namespace {

constexpr std::uint64_t model_seed = 7;
constexpr std::size_t batch_rows = 32;

using SegmentCall = std::pair<std::size_t, std::size_t>;  // (first, end) of one hook call

bool bit_identical(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A deterministic new value for every parameter of `segment` (different from the old one).
void perturb_segment(Model& model, std::size_t segment) {
  std::span<float> values = model.layout().slice(model.parameters(), segment);
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = values[i] * 0.75f + 0.001f * static_cast<float>(i % 13) - 0.005f;
  }
}

struct StepOutcome {
  StepResult result;
  std::vector<float> gradients;
};

StepOutcome step(Model& model, const Batch& batch) {
  StepOutcome outcome;
  outcome.gradients.assign(model.layout().total(), 0.0f);
  outcome.result = model.forward_backward(batch, outcome.gradients, /*on_ready=*/{});
  return outcome;
}

void expect_identical_steps(const StepOutcome& actual, const StepOutcome& expected) {
  EXPECT_EQ(actual.result.loss, expected.result.loss);
  EXPECT_EQ(actual.result.correct, expected.result.correct);
  EXPECT_TRUE(bit_identical(actual.gradients, expected.gradients));
}

class TorchForwardHookTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    init_torch_runtime(1);
    data_ = make_synthetic(batch_rows, 1, 5).train;
  }
  std::unique_ptr<Model> build() { return torch_model_factory(GetParam())(model_seed); }
  Batch batch() const { return labelled_batch(data_.inputs, data_.labels, data_.size, data_.features); }

  Dataset data_;
};

TEST_P(TorchForwardHookTest, CallsCoverEverySegmentOnceInForwardOrderAndNotInEvaluate) {
  const auto model = build();
  EXPECT_TRUE(model->reports_forward_progress());
  std::vector<SegmentCall> calls;
  model->set_forward_hook([&](std::size_t first, std::size_t end) { calls.emplace_back(first, end); });
  const std::size_t segment_count = model->layout().segment_count();

  for (int repetition = 0; repetition < 2; ++repetition) {
    calls.clear();
    step(*model, batch());
    ASSERT_FALSE(calls.empty());
    std::size_t next = 0;
    for (const auto& [first, end] : calls) {
      EXPECT_EQ(first, next);
      EXPECT_LT(first, end);
      next = end;
    }
    EXPECT_EQ(next, segment_count);
  }

  calls.clear();
  model->evaluate(batch());
  EXPECT_TRUE(calls.empty());
}

TEST_P(TorchForwardHookTest, GroupsAreLayersOrResNetParts) {
  const auto model = build();
  std::vector<SegmentCall> calls;
  model->set_forward_hook([&](std::size_t first, std::size_t end) { calls.emplace_back(first, end); });
  step(*model, batch());

  std::vector<SegmentCall> expected;
  if (GetParam() == "resnet") {
    expected.emplace_back(0, 2);  // stem: conv1, bn1
    for (std::size_t block = 0; block < 9; ++block) expected.emplace_back(2 + 4 * block, 6 + 4 * block);
    expected.emplace_back(38, 39);  // fc
    const Layout& layout = model->layout();
    ASSERT_EQ(layout.segment_count(), 39u);
    EXPECT_EQ(layout.segment(1).name, "bn1");
    EXPECT_EQ(layout.segment(2).name, "s1b1.conv1");
    EXPECT_EQ(layout.segment(37).name, "s3b3.bn2");
    EXPECT_EQ(layout.segment(38).name, "fc");
  } else {
    for (std::size_t s = 0; s < model->layout().segment_count(); ++s) expected.emplace_back(s, s + 1);
  }
  EXPECT_EQ(calls, expected);
}

TEST_P(TorchForwardHookTest, ResultsWithAnIdleHookOrNoHookAreUnchanged) {
  const auto plain = build();
  const auto hooked = build();
  const auto cleared = build();
  std::size_t hooked_calls = 0;
  std::size_t cleared_calls = 0;
  hooked->set_forward_hook([&](std::size_t, std::size_t) { ++hooked_calls; });
  cleared->set_forward_hook([&](std::size_t, std::size_t) { ++cleared_calls; });
  cleared->set_forward_hook({});

  for (int repetition = 0; repetition < 2; ++repetition) {  // the second step sees updated BN stats
    const StepOutcome expected = step(*plain, batch());
    expect_identical_steps(step(*hooked, batch()), expected);
    expect_identical_steps(step(*cleared, batch()), expected);
  }
  EXPECT_GT(hooked_calls, 0u);
  EXPECT_EQ(cleared_calls, 0u);
  EXPECT_EQ(hooked->evaluate(batch()).loss_sum, plain->evaluate(batch()).loss_sum);
}

// The hook rewrites exactly the segments it is called for; forward must use the new values, as if
// they had been set before forward_backward.
TEST_P(TorchForwardHookTest, ParametersWrittenByTheHookAreTheOnesForwardReads) {
  const auto hooked = build();
  const auto preset = build();
  hooked->set_forward_hook([&](std::size_t first, std::size_t end) {
    for (std::size_t segment = first; segment < end; ++segment) perturb_segment(*hooked, segment);
  });
  for (std::size_t segment = 0; segment < preset->layout().segment_count(); ++segment) {
    perturb_segment(*preset, segment);
  }
  ASSERT_FALSE(bit_identical(hooked->parameters(), preset->parameters()));

  const StepOutcome actual = step(*hooked, batch());
  const StepOutcome expected = step(*preset, batch());
  expect_identical_steps(actual, expected);
  EXPECT_TRUE(bit_identical(hooked->parameters(), preset->parameters()));
}

// At the call for [first, end) the hook rewrites segment `end` (the first one of the next call), and
// nothing else: the next layer is read only after this call, so the change takes effect.
TEST_P(TorchForwardHookTest, HookMayRewriteTheNextSegmentAtAnEarlierCall) {
  const auto hooked = build();
  const auto preset = build();
  const std::size_t segment_count = preset->layout().segment_count();
  hooked->set_forward_hook([&](std::size_t /*first*/, std::size_t end) {
    if (end < segment_count) perturb_segment(*hooked, end);
  });
  std::vector<SegmentCall> calls;
  preset->set_forward_hook([&](std::size_t first, std::size_t end) { calls.emplace_back(first, end); });
  step(*preset, batch());  // only to learn the groups; then start over from the same seed
  const auto fresh = build();
  for (std::size_t call = 1; call < calls.size(); ++call) perturb_segment(*fresh, calls[call].first);
  ASSERT_FALSE(bit_identical(hooked->parameters(), fresh->parameters()));

  const StepOutcome actual = step(*hooked, batch());
  const StepOutcome expected = step(*fresh, batch());
  expect_identical_steps(actual, expected);
  EXPECT_TRUE(bit_identical(hooked->parameters(), fresh->parameters()));
}

INSTANTIATE_TEST_SUITE_P(AllTorchModels, TorchForwardHookTest,
                         ::testing::Values("mlp", "cnn", "resnet"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace pipesgd
