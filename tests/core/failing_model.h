#pragma once
// Test helper: a Model that behaves like `inner` but, if `fails`, throws DataError at its 5th
// forward pass, so tests can check that one failing worker stops every rank with the root cause.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "pipesgd/core/error.h"
#include "pipesgd/core/model.h"
#include "pipesgd/train/trainer.h"
#include "tiny_run.h"

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

// Runs `config` over the softmax model with rank 2's replica failing (replicas are built in rank
// order) and expects the run to throw that rank's own DataError, the root cause, rather than another
// rank's "peer failed".
inline void expect_failing_rank_is_the_reported_cause(const TrainConfig& config, const DataSplits& data) {
  std::atomic<int> built{0};
  ModelFactory factory = [&](std::uint64_t seed) -> std::unique_ptr<Model> {
    const bool fails = built++ == 2;
    return std::make_unique<FailingModel>(softmax_factory()(seed), fails);
  };
  try {
    run_training(config, factory, data);
    ADD_FAILURE() << "expected the injected failure";
  } catch (const DataError& error) {
    EXPECT_STREQ(error.what(), "injected failure in forward");
  }
}

}  // namespace pipesgd
