#pragma once
// Test helper: a Model that behaves like `inner` but, if `fails`, throws DataError at its 5th
// forward pass, so tests can check that one failing worker stops every rank with the root cause.
#include <memory>

#include "pipesgd/core/error.h"
#include "pipesgd/core/model.h"

namespace pipesgd {

class FailingModel final : public Model {
 public:
  FailingModel(std::unique_ptr<Model> inner, bool fails) : inner_(std::move(inner)), fails_(fails) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& ready) override {
    if (fails_ && ++calls_ == 5) throw DataError("injected failure in forward");
    return inner_->forward_backward(batch, gradients, ready);
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
  bool fails_;
  int calls_ = 0;
};

}  // namespace pipesgd
