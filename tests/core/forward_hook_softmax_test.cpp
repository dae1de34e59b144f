// The forward hook of SoftmaxRegression (Model::set_forward_hook): one call for all segments, before
// forward reads any parameter; never from evaluate().
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "pipesgd/models/softmax_regression.h"

namespace pipesgd {
namespace {

constexpr std::size_t test_features = 6;
constexpr std::size_t test_classes = 3;
constexpr std::size_t test_rows = 8;

using SegmentCall = std::pair<std::size_t, std::size_t>;

struct OwnedBatch {
  std::vector<float> inputs;
  std::vector<std::int32_t> labels;
  Batch view() const { return labelled_batch(inputs, labels, labels.size(), test_features); }
};

OwnedBatch make_batch() {
  OwnedBatch batch;
  std::uint32_t state = 987654u;
  for (std::size_t i = 0; i < test_rows * test_features; ++i) {
    state = state * 1664525u + 1013904223u;
    batch.inputs.push_back(static_cast<float>(state >> 8) / static_cast<float>(1u << 24));
  }
  for (std::size_t row = 0; row < test_rows; ++row) {
    batch.labels.push_back(static_cast<std::int32_t>((row * 2 + 1) % test_classes));
  }
  return batch;
}

bool bit_identical(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SoftmaxForwardHook, OneCallForAllSegmentsPerStepAndNoneInEvaluate) {
  SoftmaxRegression model(test_features, test_classes, 3);
  EXPECT_TRUE(model.reports_forward_progress());
  std::vector<SegmentCall> calls;
  model.set_forward_hook([&](std::size_t first, std::size_t end) { calls.emplace_back(first, end); });
  const OwnedBatch batch = make_batch();
  std::vector<float> gradients(model.layout().total());

  model.forward_backward(batch.view(), gradients, {});
  EXPECT_EQ(calls, (std::vector<SegmentCall>{{0, 2}}));
  model.forward_backward(batch.view(), gradients, {});
  EXPECT_EQ(calls, (std::vector<SegmentCall>{{0, 2}, {0, 2}}));

  model.evaluate(batch.view());
  EXPECT_EQ(calls.size(), 2u);

  model.set_forward_hook({});
  model.forward_backward(batch.view(), gradients, {});
  EXPECT_EQ(calls.size(), 2u);
}

TEST(SoftmaxForwardHook, ParametersWrittenByTheHookAreTheOnesForwardReads) {
  SoftmaxRegression model(test_features, test_classes, 3);
  std::vector<float> updated(model.parameters().begin(), model.parameters().end());
  for (std::size_t i = 0; i < updated.size(); ++i) {
    updated[i] = updated[i] * 0.5f + 0.01f * static_cast<float>(i % 5);
  }
  model.set_forward_hook([&](std::size_t, std::size_t) {
    std::copy(updated.begin(), updated.end(), model.parameters().begin());
  });
  const OwnedBatch batch = make_batch();
  std::vector<float> gradients(model.layout().total());

  const StepResult result = model.forward_backward(batch.view(), gradients, {});
  EXPECT_EQ(result.loss,
            SoftmaxRegression::loss_for(updated, batch.view(), test_features, test_classes));
  EXPECT_TRUE(bit_identical(
      gradients,
      SoftmaxRegression::gradient_for(updated, batch.view(), test_features, test_classes)));
  EXPECT_TRUE(bit_identical(model.parameters(), updated));
}

TEST(SoftmaxForwardHook, WithoutAHookGradientsAreUnchanged) {
  SoftmaxRegression model(test_features, test_classes, 3);
  const std::vector<float> initial(model.parameters().begin(), model.parameters().end());
  const OwnedBatch batch = make_batch();
  std::vector<float> gradients(model.layout().total());
  model.forward_backward(batch.view(), gradients, {});
  EXPECT_TRUE(bit_identical(
      gradients,
      SoftmaxRegression::gradient_for(initial, batch.view(), test_features, test_classes)));
}

}  // namespace
}  // namespace pipesgd
