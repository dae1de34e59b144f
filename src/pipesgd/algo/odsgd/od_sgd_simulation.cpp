#include "pipesgd/algo/odsgd/od_sgd_simulation.h"

#include <algorithm>

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/odsgd/od_sgd.h"
#include "pipesgd/algo/ps_methods/ps_simulation.h"

namespace pipesgd {
namespace {

class SimulatedOdSgd final : public SimulatedMethod {
 public:
  enum Event { kHanded, kPulled };

  explicit SimulatedOdSgd(const SimulationContext& context)
      : options_(options_as<OdSgdOptions>(context.options)),
        shards_(simulated_shard_sizes(context.profile, options_.server_count)),
        profile_(context.profile),
        switch_(std::max<std::int64_t>(context.warmup_iterations, 1) - 1) {}

  void end_iteration(std::int64_t t, SimulatedThread& compute) override {
    if (t < switch_) {
      simulate_push_and_pull(shards_, compute);
      return;
    }
    compute.signal({kHanded, t, 0});
    if (t > switch_) compute.wait({kPulled, t, 0});  // G_t, pulled by iteration t - 1's job
    if (options_.local_updater != "sgd") compute.compute(profile_.update_seconds, "compensation");
    compute.compute(profile_.update_seconds, "local update");
  }

  bool has_comm_thread() const override { return true; }

  void run_comm_thread(std::int64_t iterations, SimulatedThread& comm) override {
    for (std::int64_t t = switch_; t < iterations; ++t) {
      comm.wait({kHanded, t, 0});
      simulate_push_and_pull(shards_, comm);
      comm.signal({kPulled, t + 1, 0});
    }
  }

  int servers() const override { return options_.server_count; }

  void run_server(int server, std::int64_t iterations, SimulatedServer& thread) override {
    const std::size_t shard = shards_[static_cast<std::size_t>(server)];
    const double update = profile_.update_seconds_of(shard);
    simulate_synchronous_server(shard, update, iterations, thread);
  }

  std::string describe() const override {
    return concat(options_.server_count, options_.server_count == 1 ? " server" : " servers", ", local updater ",
                  options_.local_updater, ", overlapped from iteration ", switch_);
  }

 private:
  const OdSgdOptions& options_;
  std::vector<std::size_t> shards_;
  const ModelProfile& profile_;
  std::int64_t switch_;  // N - 1: the switching stage
};

}  // namespace

std::unique_ptr<SimulatedMethod> simulate_od_sgd(const SimulationContext& context) {
  return std::make_unique<SimulatedOdSgd>(context);
}

}  // namespace pipesgd
