#include "pipesgd/models/softmax_regression.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

constexpr std::size_t test_features = 7;
constexpr std::size_t test_classes = 4;
constexpr std::size_t test_rows = 5;

// Owns the memory a Batch points into.
struct OwnedBatch {
  std::vector<float> inputs;
  std::vector<std::int32_t> labels;
  std::size_t features = 0;

  Batch view() const {
    return labelled_batch(inputs, labels, labels.size(), features);
  }
};

// Deterministic inputs in [0, 1) and labels cycling through the classes.
OwnedBatch make_batch(std::size_t rows, std::size_t features, std::size_t classes,
                      std::uint32_t salt) {
  OwnedBatch batch;
  batch.features = features;
  std::uint32_t state = 12345u + salt * 7919u;
  for (std::size_t i = 0; i < rows * features; ++i) {
    state = state * 1664525u + 1013904223u;
    batch.inputs.push_back(static_cast<float>(state >> 8) / static_cast<float>(1u << 24));
  }
  for (std::size_t row = 0; row < rows; ++row) {
    batch.labels.push_back(static_cast<std::int32_t>((row * 3 + salt) % classes));
  }
  return batch;
}

// Independent double-precision re-computation of the mean loss, written from the definition.
double reference_loss(const std::vector<double>& params, const OwnedBatch& batch,
                      std::size_t features, std::size_t classes) {
  const std::size_t rows = batch.labels.size();
  double total = 0;
  for (std::size_t row = 0; row < rows; ++row) {
    std::vector<double> logits(classes);
    for (std::size_t c = 0; c < classes; ++c) {
      logits[c] = params[classes * features + c];
      for (std::size_t f = 0; f < features; ++f) {
        logits[c] += params[c * features + f] * batch.inputs[row * features + f];
      }
    }
    double exp_sum = 0;
    for (double logit : logits) exp_sum += std::exp(logit);
    total += std::log(exp_sum) - logits[static_cast<std::size_t>(batch.labels[row])];
  }
  return total / static_cast<double>(rows);
}

TEST(SoftmaxRegression, LayoutHasWeightThenBiasSegments) {
  SoftmaxRegression model(test_features, test_classes, 1);
  const Layout& layout = model.layout();
  ASSERT_EQ(layout.segment_count(), 2u);
  EXPECT_EQ(layout.segment(0).name, "linear.weight");
  EXPECT_EQ(layout.segment(0).offset, 0u);
  EXPECT_EQ(layout.segment(0).count, test_features * test_classes);
  EXPECT_EQ(layout.segment(1).name, "linear.bias");
  EXPECT_EQ(layout.segment(1).offset, test_features * test_classes);
  EXPECT_EQ(layout.segment(1).count, test_classes);
  EXPECT_EQ(model.parameters().size(), layout.total());
  for (float value : model.parameters()) {
    EXPECT_GE(value, -0.05f);
    EXPECT_LE(value, 0.05f);
  }
}

TEST(SoftmaxRegression, GradientMatchesCentralFiniteDifferences) {
  SoftmaxRegression model(test_features, test_classes, 3);
  // Larger parameters than the initial ones, so the softmax is far from uniform.
  for (std::size_t i = 0; i < model.parameters().size(); ++i) {
    model.parameters()[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i)));
  }
  const OwnedBatch batch = make_batch(test_rows, test_features, test_classes, 1);
  std::vector<float> gradients(model.layout().total(), -1.0f);
  const StepResult result = model.forward_backward(batch.view(), gradients, {});

  std::vector<double> params(model.parameters().begin(), model.parameters().end());
  EXPECT_NEAR(result.loss, reference_loss(params, batch, test_features, test_classes), 1e-12);
  const double step = 1e-5;
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<double> plus = params;
    std::vector<double> minus = params;
    plus[i] += step;
    minus[i] -= step;
    const double numeric = (reference_loss(plus, batch, test_features, test_classes) -
                            reference_loss(minus, batch, test_features, test_classes)) /
                           (2 * step);
    EXPECT_NEAR(gradients[i], numeric, 1e-6) << "parameter " << i;
  }
}

TEST(SoftmaxRegression, LossIsStableForLargeLogits) {
  SoftmaxRegression model(2, 3, 0);
  const std::vector<float> params = {1000, 0, -1000, 0, 0, 1000, 0, 0, 0};
  std::copy(params.begin(), params.end(), model.parameters().begin());
  const std::vector<float> inputs = {1, 0};
  const std::vector<std::int32_t> labels = {1};  // logits are 1000, -1000, 0
  std::vector<float> gradients(model.layout().total());
  const StepResult result = model.forward_backward(labelled_batch(inputs, labels, 1, 2), gradients, {});
  EXPECT_NEAR(result.loss, 2000.0, 1e-9);
  for (float value : gradients) EXPECT_TRUE(std::isfinite(value));
}

TEST(SoftmaxRegression, ReportsBiasThenWeight) {
  SoftmaxRegression model(test_features, test_classes, 5);
  const OwnedBatch batch = make_batch(test_rows, test_features, test_classes, 2);
  std::vector<float> gradients(model.layout().total());
  std::vector<std::size_t> order;
  std::vector<double> times;
  model.forward_backward(batch.view(), gradients, [&](std::size_t segment, double seconds) {
    order.push_back(segment);
    times.push_back(seconds);
  });
  EXPECT_EQ(order, (std::vector<std::size_t>{1, 0}));
  for (double seconds : times) EXPECT_GE(seconds, 0.0);
}

TEST(SoftmaxRegression, GradientForIsBitIdenticalToForwardBackward) {
  SoftmaxRegression model(test_features, test_classes, 6);
  const OwnedBatch batch = make_batch(test_rows, test_features, test_classes, 3);
  std::vector<float> gradients(model.layout().total(), 123.0f);  // must be overwritten
  model.forward_backward(batch.view(), gradients, {});
  const std::vector<float> params(model.parameters().begin(), model.parameters().end());
  const std::vector<float> expected =
      SoftmaxRegression::gradient_for(params, batch.view(), test_features, test_classes);
  ASSERT_EQ(expected.size(), gradients.size());
  EXPECT_EQ(std::memcmp(expected.data(), gradients.data(), gradients.size() * sizeof(float)), 0);
  EXPECT_DOUBLE_EQ(SoftmaxRegression::loss_for(params, batch.view(), test_features, test_classes),
                   model.forward_backward(batch.view(), gradients, {}).loss);
}

TEST(SoftmaxRegression, SameSeedSameParametersAndDifferentSeedsDiffer) {
  const ModelFactory factory = softmax_regression_factory(test_features, test_classes);
  const auto first = factory(42);
  const auto second = factory(42);
  const auto other = factory(43);
  ASSERT_EQ(first->parameters().size(), second->parameters().size());
  EXPECT_EQ(std::memcmp(first->parameters().data(), second->parameters().data(),
                        first->parameters().size() * sizeof(float)),
            0);
  EXPECT_NE(std::memcmp(first->parameters().data(), other->parameters().data(),
                        first->parameters().size() * sizeof(float)),
            0);

  // Repeated steps on the same parameters give the same gradient.
  const OwnedBatch batch = make_batch(test_rows, test_features, test_classes, 4);
  std::vector<float> gradients_a(first->layout().total());
  std::vector<float> gradients_b(first->layout().total());
  first->forward_backward(batch.view(), gradients_a, {});
  second->forward_backward(batch.view(), gradients_b, {});
  EXPECT_EQ(gradients_a, gradients_b);
}

TEST(SoftmaxRegression, OneSgdStepLowersTheLoss) {
  SoftmaxRegression model(test_features, test_classes, 9);
  const OwnedBatch batch = make_batch(test_rows, test_features, test_classes, 5);
  std::vector<float> gradients(model.layout().total());
  const double before = model.forward_backward(batch.view(), gradients, {}).loss;
  for (std::size_t i = 0; i < gradients.size(); ++i) model.parameters()[i] -= 0.5f * gradients[i];
  const double after = model.forward_backward(batch.view(), gradients, {}).loss;
  EXPECT_LT(after, before);
}

TEST(SoftmaxRegression, EvaluateSumsLossAndCountsCorrect) {
  SoftmaxRegression model(2, 2, 0);
  // Class 0 wins when x0 > x1, class 1 otherwise.
  const std::vector<float> params = {1, -1, -1, 1, 0, 0};
  std::copy(params.begin(), params.end(), model.parameters().begin());
  const std::vector<float> inputs = {1, 0, 0, 1, 1, 0};
  const std::vector<std::int32_t> labels = {0, 1, 1};
  const Batch batch = labelled_batch(inputs, labels, 3, 2);
  const Evaluation evaluation = model.evaluate(batch);
  EXPECT_EQ(evaluation.count, 3u);
  EXPECT_EQ(evaluation.correct, 2u);
  std::vector<float> gradients(model.layout().total());
  const double mean = model.forward_backward(batch, gradients, {}).loss;
  EXPECT_NEAR(evaluation.loss_sum, 3 * mean, 1e-12);

  const Evaluation empty = model.evaluate(labelled_batch({}, {}, 0, 2));
  EXPECT_EQ(empty.count, 0u);
  EXPECT_EQ(empty.correct, 0u);
  EXPECT_EQ(empty.loss_sum, 0.0);
}

TEST(SoftmaxRegression, RejectsMalformedBatches) {
  SoftmaxRegression model(test_features, test_classes, 0);
  std::vector<float> gradients(model.layout().total());
  OwnedBatch batch = make_batch(test_rows, test_features, test_classes, 0);

  Batch wrong_features = batch.view();
  wrong_features.features = test_features + 1;
  EXPECT_THROW(model.forward_backward(wrong_features, gradients, {}), UsageError);
  EXPECT_THROW(model.evaluate(wrong_features), UsageError);

  OwnedBatch label_too_large = batch;
  label_too_large.labels[2] = static_cast<std::int32_t>(test_classes);
  EXPECT_THROW(model.forward_backward(label_too_large.view(), gradients, {}), UsageError);
  EXPECT_THROW(model.evaluate(label_too_large.view()), UsageError);
  OwnedBatch negative_label = batch;
  negative_label.labels[0] = -1;
  EXPECT_THROW(model.forward_backward(negative_label.view(), gradients, {}), UsageError);
  const std::vector<float> params(model.parameters().begin(), model.parameters().end());
  EXPECT_THROW(
      SoftmaxRegression::gradient_for(params, negative_label.view(), test_features, test_classes),
      UsageError);

  Batch too_few_inputs = batch.view();
  too_few_inputs.inputs = too_few_inputs.inputs.first(test_features);
  EXPECT_THROW(model.forward_backward(too_few_inputs, gradients, {}), UsageError);

  EXPECT_THROW(model.forward_backward(labelled_batch({}, {}, 0, test_features), gradients, {}),
               UsageError);
  EXPECT_THROW(SoftmaxRegression(0, 3, 0), UsageError);
  EXPECT_THROW(softmax_regression_factory(5, 1), UsageError);
}

}  // namespace
}  // namespace pipesgd
