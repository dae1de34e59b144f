#pragma once
// Multinomial logistic regression in plain C++ (no LibTorch). It is small and exact, so the unit tests
// of the training methods can compute expected values against it (see gradient_for).
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "pipesgd/core/model.h"

namespace pipesgd {

// logits = weight * x + bias; loss = mean cross-entropy of softmax(logits).
// Parameters, flat: weight [classes x features] row-major, then bias [classes], as two segments
// "linear.weight" (index 0) and "linear.bias" (index 1).
// One instance is used by one thread at a time (the Model contract); gradient_for is a pure function
// and may be called from any thread.
class SoftmaxRegression : public Model {
 public:
  static constexpr std::size_t weight_segment = 0;
  static constexpr std::size_t bias_segment = 1;

  // Parameters are drawn uniformly from [-0.05, 0.05] by a splitmix64 stream seeded with `seed`, so
  // the same seed gives bit-identical parameters on every platform. Throws UsageError if
  // features == 0 or classes < 2.
  SoftmaxRegression(std::size_t features, std::size_t classes, std::uint64_t seed);

  const Layout& layout() const override { return layout_; }
  std::span<float> parameters() override { return parameters_; }

  // Overwrites `gradients` with d(mean loss)/d(parameters); reports the bias segment, then the weight
  // segment (backward order). Throws UsageError for an empty or malformed batch (feature count,
  // sizes, labels out of [0, classes)); that check comes before the forward hook.
  // Forward reads all parameters at once, so the forward hook is called once, as
  // hook(0, segment_count), before any parameter is read; its time counts in forward_seconds.
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& on_ready) override;

  bool reports_forward_progress() const override { return true; }
  void set_forward_hook(SegmentsNeededFn hook) override { forward_hook_ = std::move(hook); }

  // Summed loss and arg-max accuracy (ties go to the lowest class index). An empty batch gives zeros.
  Evaluation evaluate(const Batch& batch) override;

  std::size_t features() const { return features_; }
  std::size_t classes() const { return classes_; }

  // The gradient forward_backward would write for `params` (layout as above) on `batch`; bit-identical
  // to it, because both run the same code. Throws UsageError like forward_backward.
  static std::vector<float> gradient_for(const std::vector<float>& params, const Batch& batch,
                                         std::size_t features, std::size_t classes);

  // Mean cross-entropy loss of `params` on `batch`, accumulated in double precision.
  static double loss_for(std::span<const float> params, const Batch& batch, std::size_t features,
                         std::size_t classes);

 private:
  std::size_t features_;
  std::size_t classes_;
  Layout layout_;
  std::vector<float> parameters_;
  SegmentsNeededFn forward_hook_;  // empty: none
  // Scratch reused across calls: per-row class probabilities (then loss derivatives), and the weight
  // gradient accumulated in double before it is rounded into the caller's buffer.
  std::vector<double> row_scratch_;
  std::vector<double> weight_gradient_scratch_;
};

// Builds SoftmaxRegression(features, classes, seed) replicas.
ModelFactory softmax_regression_factory(std::size_t features, std::size_t classes);

}  // namespace pipesgd
