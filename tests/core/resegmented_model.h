#pragma once
// Test helper: the tiny softmax model with more layers. SoftmaxRegression (784 x 10 weights + 10
// biases, 2 segments) with its weight segment split into `pieces` segments of consecutive rows. Only
// the layout differs: the flat vectors, gradients and updates are the inner model's. After the inner
// backward it reports every segment ready, in backward order (as a model whose layers all finish at
// the end of backward would), so layer-wise methods can be tested on it.
#include <memory>

#include "pipesgd/core/error.h"
#include "pipesgd/core/model.h"
#include "tiny_run.h"

namespace pipesgd {

class ResegmentedModel final : public Model {
 public:
  ResegmentedModel(std::unique_ptr<Model> inner, std::size_t pieces) : inner_(std::move(inner)) {
    for (const Segment& segment : inner_->layout().segments()) {
      const std::size_t parts = segment.count > pieces ? pieces : 1;
      std::size_t left = segment.count;
      for (std::size_t p = 0; p < parts; ++p) {
        const std::size_t count = p + 1 == parts ? left : segment.count / parts;
        layout_.add(concat(segment.name, ".", p), count);
        left -= count;
      }
    }
  }
  const Layout& layout() const override { return layout_; }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& on_ready) override {
    StepResult result = inner_->forward_backward(batch, gradients, {});
    if (on_ready) {
      for (std::size_t s = layout_.segment_count(); s-- > 0;) on_ready(s, 0.0);
    }
    return result;
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
  Layout layout_;
};

// The softmax model with its weight segment cut into `pieces` (more segments).
inline ModelFactory resegmented_softmax_factory(std::size_t pieces) {
  ModelFactory inner = softmax_factory();
  if (pieces == 1) return inner;
  return [inner, pieces](std::uint64_t seed) -> std::unique_ptr<Model> {
    return std::make_unique<ResegmentedModel>(inner(seed), pieces);
  };
}

}  // namespace pipesgd
