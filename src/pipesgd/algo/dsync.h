#pragma once
// D-Sync (Pipe-SGD's synchronous baseline): compute g(w_t), allreduce it, update, next iteration.
#include "pipesgd/algo/training_method.h"
#include "pipesgd/collective/allreduce.h"

namespace pipesgd {

class DSync final : public TrainingMethod {
 public:
  DSync(const MethodConfig& config, Model& model, Transport& transport);
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  void finish(IterationTimes&) override {}
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    return static_cast<std::uint64_t>(t);
  }
  void save_state(CheckpointWriter& out) override { optimizer_->save_state(out, "method."); }
  void load_state(const CheckpointReader& in, std::int64_t) override { optimizer_->load_state(in, "method."); }
  MethodReport report() const override {
    MethodReport report;
    report.allreduce_calls = 1;
    return report;
  }

 private:
  Model& model_;
  Transport& transport_;
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Allreduce> allreduce_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<float> gradients_;
};

}  // namespace pipesgd
