#pragma once
// D-Sync (Pipe-SGD's synchronous baseline): compute g(w_t), allreduce it, update, next iteration.
// Everything runs on the compute thread: there is nothing to overlap.
#include <memory>
#include <vector>

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/collective/allreduce.h"

namespace pipesgd {

class DSync final : public TrainingMethod {
 public:
  // Throws UsageError for an unknown codec or algorithm.
  explicit DSync(const MethodContext& context);
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  void finish(IterationTimes&) override {}
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    return static_cast<std::uint64_t>(t);
  }
  // Nothing is in flight between iterations: the optimizer's state is all.
  void save_state(CheckpointWriter& out) override { optimizer_->save_state(out, "method."); }
  void load_state(const CheckpointReader& in, std::int64_t) override { optimizer_->load_state(in, "method."); }
  std::shared_ptr<MethodReport> report() const override;
  Optimizer* optimizer() override { return optimizer_.get(); }

 private:
  FlatParameters& model_;
  const float gradient_scale_;  // 1 / workers
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Allreduce> allreduce_;
  std::unique_ptr<Optimizer> optimizer_;
  const LrSchedule schedule_;
  std::vector<float> gradients_;
};

}  // namespace pipesgd
