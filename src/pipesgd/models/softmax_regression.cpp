#include "pipesgd/models/softmax_regression.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

constexpr double initial_range = 0.05;  // parameters start uniform in [-initial_range, initial_range]

// splitmix64 (Steele, Lea, Flood 2014): a tiny generator whose output is fully specified, unlike the
// std:: distributions.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  // Uniform in [low, high): 24 random bits, so the value is exact in float before scaling.
  float uniform(double low, double high) {
    const double unit = static_cast<double>(next() >> 40) * 0x1.0p-24;
    return static_cast<float>(low + (high - low) * unit);
  }

 private:
  std::uint64_t state_;
};

// Throws UsageError unless `batch` is a well-formed batch for this model. An empty batch is allowed
// only where `allow_empty`.
void validate_batch(const Batch& batch, std::size_t features, std::size_t classes, bool allow_empty) {
  if (batch.size == 0 && !allow_empty) {
    throw UsageError("softmax regression: empty batch (the mean loss needs at least one example)");
  }
  if (batch.features != features) {
    throw UsageError(concat("softmax regression: batch has ", batch.features,
                            " features per example, model expects ", features));
  }
  if (batch.inputs.size() < batch.size * features || batch.labels.size() < batch.size) {
    throw UsageError(concat("softmax regression: batch of ", batch.size, " examples has only ",
                            batch.inputs.size(), " input values and ", batch.labels.size(),
                            " labels"));
  }
  for (std::size_t row = 0; row < batch.size; ++row) {
    const std::int32_t label = batch.labels[row];
    if (label < 0 || static_cast<std::size_t>(label) >= classes) {
      throw UsageError(concat("softmax regression: label ", label, " of example ", row,
                              " is outside [0, ", classes, ")"));
    }
  }
}

// Writes softmax(logits) of every row into `probabilities` (batch.size x classes) and returns the
// summed cross-entropy loss. Uses the max-shifted log-sum-exp, so large logits cannot overflow.
double forward_probabilities(std::span<const float> params, const Batch& batch,
                             std::size_t features, std::size_t classes,
                             std::span<double> probabilities) {
  const float* weight = params.data();
  const float* bias = params.data() + classes * features;
  double loss_sum = 0;
  for (std::size_t row = 0; row < batch.size; ++row) {
    const float* input = batch.inputs.data() + row * features;
    double* logits = probabilities.data() + row * classes;
    double max_logit = -std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < classes; ++c) {
      double logit = bias[c];
      const float* weight_row = weight + c * features;
      for (std::size_t f = 0; f < features; ++f) logit += double(weight_row[f]) * double(input[f]);
      logits[c] = logit;
      max_logit = std::max(max_logit, logit);
    }
    double exp_sum = 0;
    for (std::size_t c = 0; c < classes; ++c) exp_sum += std::exp(logits[c] - max_logit);
    const double log_sum = std::log(exp_sum);
    const std::size_t label = static_cast<std::size_t>(batch.labels[row]);
    loss_sum += log_sum - (logits[label] - max_logit);
    for (std::size_t c = 0; c < classes; ++c) logits[c] = std::exp(logits[c] - max_logit - log_sum);
  }
  return loss_sum;
}

// Turns probabilities into d(mean loss)/d(logits) = (p - one_hot(label)) / batch.size, in place.
void probabilities_to_logit_gradients(const Batch& batch, std::size_t classes,
                                      std::span<double> probabilities) {
  const double inverse_size = 1.0 / static_cast<double>(batch.size);
  for (std::size_t row = 0; row < batch.size; ++row) {
    double* values = probabilities.data() + row * classes;
    values[static_cast<std::size_t>(batch.labels[row])] -= 1.0;
    for (std::size_t c = 0; c < classes; ++c) values[c] *= inverse_size;
  }
}

void write_bias_gradient(const Batch& batch, std::size_t classes,
                         std::span<const double> logit_gradients, std::span<float> bias_gradient) {
  for (std::size_t c = 0; c < classes; ++c) {
    double sum = 0;
    for (std::size_t row = 0; row < batch.size; ++row) sum += logit_gradients[row * classes + c];
    bias_gradient[c] = static_cast<float>(sum);
  }
}

// `scratch` holds classes * features doubles.
void write_weight_gradient(const Batch& batch, std::size_t features, std::size_t classes,
                           std::span<const double> logit_gradients, std::span<double> scratch,
                           std::span<float> weight_gradient) {
  std::fill(scratch.begin(), scratch.end(), 0.0);
  for (std::size_t row = 0; row < batch.size; ++row) {
    const float* input = batch.inputs.data() + row * features;
    for (std::size_t c = 0; c < classes; ++c) {
      const double factor = logit_gradients[row * classes + c];
      double* accumulator = scratch.data() + c * features;
      for (std::size_t f = 0; f < features; ++f) accumulator[f] += factor * double(input[f]);
    }
  }
  for (std::size_t i = 0; i < classes * features; ++i) {
    weight_gradient[i] = static_cast<float>(scratch[i]);
  }
}

Layout make_layout(std::size_t features, std::size_t classes) {
  Layout layout;
  layout.add("linear.weight", classes * features);
  layout.add("linear.bias", classes);
  return layout;
}

}  // namespace

SoftmaxRegression::SoftmaxRegression(std::size_t features, std::size_t classes, std::uint64_t seed)
    : features_(features), classes_(classes) {
  if (features == 0 || classes < 2) {
    throw UsageError(concat("softmax regression needs at least 1 feature and 2 classes, got ",
                            features, " features and ", classes, " classes"));
  }
  layout_ = make_layout(features, classes);
  parameters_.resize(layout_.total());
  SplitMix64 generator(seed);
  for (float& value : parameters_) value = generator.uniform(-initial_range, initial_range);
  weight_gradient_scratch_.resize(classes * features);
}

namespace {
// Rows whose most probable class is the label (`rows` holds each row's class probabilities).
std::size_t count_correct(const Batch& batch, std::size_t classes, std::span<const double> rows) {
  std::size_t correct = 0;
  for (std::size_t row = 0; row < batch.size; ++row) {
    const double* probabilities = rows.data() + row * classes;
    const std::size_t predicted = static_cast<std::size_t>(
        std::max_element(probabilities, probabilities + classes) - probabilities);
    if (predicted == static_cast<std::size_t>(batch.labels[row])) ++correct;
  }
  return correct;
}
}  // namespace

StepResult SoftmaxRegression::forward_backward(const Batch& batch, std::span<float> gradients,
                                               const SegmentReadyFn& on_ready) {
  PIPESGD_ASSERT(gradients.size() == layout_.total());
  validate_batch(batch, features_, classes_, /*allow_empty=*/false);
  if (row_scratch_.size() < batch.size * classes_) row_scratch_.resize(batch.size * classes_);
  const std::span<double> rows(row_scratch_.data(), batch.size * classes_);

  StepResult result;
  Stopwatch forward_watch;
  if (forward_hook_) forward_hook_(0, layout_.segment_count());
  result.loss = forward_probabilities(parameters_, batch, features_, classes_, rows) /
                static_cast<double>(batch.size);
  result.forward_seconds = forward_watch.seconds();
  result.correct = count_correct(batch, classes_, rows);

  Stopwatch backward_watch;
  Stopwatch segment_watch;
  probabilities_to_logit_gradients(batch, classes_, rows);
  write_bias_gradient(batch, classes_, rows, layout_.slice(gradients, bias_segment));
  if (on_ready) on_ready(bias_segment, segment_watch.seconds());
  segment_watch.restart();
  write_weight_gradient(batch, features_, classes_, rows, weight_gradient_scratch_,
                        layout_.slice(gradients, weight_segment));
  if (on_ready) on_ready(weight_segment, segment_watch.seconds());
  result.backward_seconds = backward_watch.seconds();
  return result;
}

Evaluation SoftmaxRegression::evaluate(const Batch& batch) {
  validate_batch(batch, features_, classes_, /*allow_empty=*/true);
  if (row_scratch_.size() < batch.size * classes_) row_scratch_.resize(batch.size * classes_);
  const std::span<double> rows(row_scratch_.data(), batch.size * classes_);

  Evaluation evaluation;
  evaluation.count = batch.size;
  evaluation.loss_sum = forward_probabilities(parameters_, batch, features_, classes_, rows);
  evaluation.correct = count_correct(batch, classes_, rows);
  return evaluation;
}

std::vector<float> SoftmaxRegression::gradient_for(const std::vector<float>& params,
                                                   const Batch& batch, std::size_t features,
                                                   std::size_t classes) {
  const Layout layout = make_layout(features, classes);
  PIPESGD_ASSERT(params.size() == layout.total());
  validate_batch(batch, features, classes, /*allow_empty=*/false);
  std::vector<double> rows(batch.size * classes);
  std::vector<double> scratch(classes * features);
  std::vector<float> gradients(layout.total());
  forward_probabilities(params, batch, features, classes, rows);
  probabilities_to_logit_gradients(batch, classes, rows);
  write_bias_gradient(batch, classes, rows, layout.slice(std::span<float>(gradients), bias_segment));
  write_weight_gradient(batch, features, classes, rows, scratch,
                        layout.slice(std::span<float>(gradients), weight_segment));
  return gradients;
}

double SoftmaxRegression::loss_for(std::span<const float> params, const Batch& batch,
                                   std::size_t features, std::size_t classes) {
  PIPESGD_ASSERT(params.size() == classes * features + classes);
  validate_batch(batch, features, classes, /*allow_empty=*/false);
  std::vector<double> rows(batch.size * classes);
  return forward_probabilities(params, batch, features, classes, rows) /
         static_cast<double>(batch.size);
}

ModelFactory softmax_regression_factory(std::size_t features, std::size_t classes) {
  // Fail at configuration time rather than inside the first worker.
  if (features == 0 || classes < 2) {
    throw UsageError(concat("softmax regression needs at least 1 feature and 2 classes, got ",
                            features, " features and ", classes, " classes"));
  }
  return [features, classes](std::uint64_t seed) -> std::unique_ptr<Model> {
    return std::make_unique<SoftmaxRegression>(features, classes, seed);
  };
}

}  // namespace pipesgd
