#include "pipesgd/algo/pipe/pipe_simulation.h"

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/pipe/pipe_sgd.h"

namespace pipesgd {
namespace {

class SimulatedPipe final : public SimulatedMethod {
 public:
  enum Event { kComputed, kReduced };

  explicit SimulatedPipe(const SimulationContext& context)
      : elements_(context.profile.parameters()), update_seconds_(context.profile.update_seconds),
        k_(options_as<PipeOptions>(context.options).k), warmup_(context.warmup_iterations) {}

  void begin_iteration(std::int64_t t, SimulatedThread& compute) override {
    // Slot t % K holds g[t-K] once it was pipelined (warm-up iterations updated at their end).
    if (t - k_ >= warmup_) {
      compute.wait({kReduced, t - k_, 0});
      compute.compute(update_seconds_, "update");
    }
  }

  void end_iteration(std::int64_t t, SimulatedThread& compute) override {
    if (t < warmup_) {
      compute.allreduce(elements_);
      compute.compute(update_seconds_, "update");
    } else {
      compute.signal({kComputed, t, 0});
    }
  }

  bool has_comm_thread() const override { return true; }

  void run_comm_thread(std::int64_t iterations, SimulatedThread& comm) override {
    for (std::int64_t t = warmup_; t < iterations; ++t) {
      comm.wait({kComputed, t, 0});
      comm.allreduce(elements_);
      comm.signal({kReduced, t, 0});
    }
  }

  std::string describe() const override {
    return warmup_ > 0 ? concat("K = ", k_, ", ", warmup_, " warm-up iterations as D-Sync") : concat("K = ", k_);
  }

 private:
  std::size_t elements_;
  double update_seconds_;
  int k_;
  std::int64_t warmup_;
};

}  // namespace

std::unique_ptr<SimulatedMethod> simulate_pipe(const SimulationContext& context) {
  return std::make_unique<SimulatedPipe>(context);
}

}  // namespace pipesgd
