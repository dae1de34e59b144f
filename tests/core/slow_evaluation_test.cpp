// Rank 0 evaluates the test set while the other workers wait for it. An evaluation longer than the
// comm timeout (a large model on one core) must not look like a dead peer: rank 0 tells the others
// it is still evaluating between test chunks. Here each 1000-example chunk takes 300 ms and the
// whole evaluation 1.8 s against a 1 s timeout; without those words the others time out.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>

#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/train/trainer.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

constexpr auto kChunkEvaluation = std::chrono::milliseconds(300);

class SlowEvaluationModel final : public Model {
 public:
  explicit SlowEvaluationModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients, const SegmentReadyFn& ready) override {
    return inner_->forward_backward(batch, gradients, ready);
  }
  Evaluation evaluate(const Batch& batch) override {
    std::this_thread::sleep_for(kChunkEvaluation);
    return inner_->evaluate(batch);
  }

 private:
  std::unique_ptr<Model> inner_;
};

class SlowEvaluation : public ::testing::TestWithParam<int> {};

TEST_P(SlowEvaluation, LongerThanTheCommTimeoutDoesNotFailTheRun) {
  const int workers = GetParam();
  TrainConfig config = tiny_config("dsync", workers);
  config.evaluate = true;
  config.iterations = 10;
  set_timeout(config, std::chrono::seconds(1));
  const DataSplits data = make_synthetic(600, 6000, 3);  // 6 test chunks: 1.8 s of evaluation
  ModelFactory factory = [](std::uint64_t seed) -> std::unique_ptr<Model> {
    return std::make_unique<SlowEvaluationModel>(softmax_factory()(seed));
  };
  const RunSummary summary = run_training(config, factory, data);
  ASSERT_EQ(summary.epochs.size(), 1u);
  EXPECT_GT(summary.epochs[0].test_accuracy, 0.0);
  EXPECT_GT(summary.epochs[0].test_loss, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Workers, SlowEvaluation, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "_workers"; });

}  // namespace
}  // namespace pipesgd
