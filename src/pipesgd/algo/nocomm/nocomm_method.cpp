#include "pipesgd/algo/nocomm/nocomm_method.h"

#include <vector>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/algo/method_report.h"
#include "pipesgd/algo/simulated_method.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/optim/optimizer.h"

namespace pipesgd {
namespace {

// One worker: steps its parameters with its own gradient on the compute thread.
class NoCommunication final : public TrainingMethod {
 public:
  explicit NoCommunication(const MethodContext& context)
      : model_(context.model),
        optimizer_(make_optimizer(context.common.optimizer, context.model.layout())),
        schedule_(context.learning_rate_schedule),
        gradients_(context.model.layout().total()) {}

  std::span<float> begin_iteration(std::int64_t, IterationTimes&) override { return gradients_; }

  void end_iteration(std::int64_t t, IterationTimes& times) override {
    TraceArgs args;
    args.iteration = t;
    TracedStopwatch stepping("update", kTraceCompute, args);
    optimizer_->set_learning_rate_factor(schedule_.factor(t));
    optimizer_->step(model_.parameters(), gradients_, 1.0f, 0);
    times.update = stepping.stop();
  }

  void finish(IterationTimes&) override {}
  void save_state(CheckpointWriter& out) override { optimizer_->save_state(out, "method."); }
  void load_state(const CheckpointReader& in, std::int64_t) override { optimizer_->load_state(in, "method."); }
  std::shared_ptr<MethodReport> report() const override { return std::make_shared<AllreduceCallsReport>(0); }

 private:
  FlatParameters& model_;
  std::unique_ptr<Optimizer> optimizer_;
  const LrSchedule schedule_;
  std::vector<float> gradients_;
};

class SimulatedNoCommunication final : public SimulatedMethod {
 public:
  explicit SimulatedNoCommunication(const SimulationContext& context)
      : update_seconds_(context.profile.update_seconds) {}
  void end_iteration(std::int64_t, SimulatedThread& compute) override { compute.compute(update_seconds_, "update"); }
  std::string describe() const override { return "no communication"; }

 private:
  double update_seconds_;
};

}  // namespace

MethodDescriptor nocomm_method() {
  MethodDescriptor method;
  method.name = "nocomm";
  method.traits.compute_alone = true;
  method.commit = "the optimizer's state (nothing is exchanged)";
  method.summary =
      "compute alone: every worker steps on its own gradient and nothing is communicated (not data-parallel "
      "training: the reference compare's compute stretch is measured against)";
  method.options = optimizer_option_declarations();
  method.parse = [](const OptionValues&) { return std::make_shared<MethodOptions>(); };
  method.make = [](const MethodContext& context) { return std::make_unique<NoCommunication>(context); };
  method.simulate = [](const SimulationContext& context) {
    return std::make_unique<SimulatedNoCommunication>(context);
  };
  method.advise = [](int) { return std::vector<AdvisedVariant>{}; };  // never a recommendation
  return method;
}

}  // namespace pipesgd
