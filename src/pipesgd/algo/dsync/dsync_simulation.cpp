#include "pipesgd/algo/dsync/dsync_simulation.h"

#include "pipesgd/algo/dsync/dsync_options.h"
#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/timing/bucket_plan.h"

namespace pipesgd {
namespace {

class SimulatedDsync final : public SimulatedMethod {
 public:
  explicit SimulatedDsync(const SimulationContext& context)
      : elements_(context.profile.parameters()), update_seconds_(context.profile.update_seconds) {}

  void end_iteration(std::int64_t, SimulatedThread& compute) override {
    compute.allreduce(elements_);
    compute.compute(update_seconds_, "update");
  }

  std::string describe() const override { return "one allreduce after backward"; }

 private:
  std::size_t elements_;
  double update_seconds_;
};

class SimulatedBucketedDsync final : public SimulatedMethod {
 public:
  enum Event { kReady, kReduced };

  explicit SimulatedBucketedDsync(const SimulationContext& context)
      : plan_(make_bucket_plan(options_as<DsyncOptions>(context.options).buckets,
                               layer_profile(context.profile, context.common.codec), context.allreduce_cost)),
        update_seconds_(context.profile.update_seconds),
        launch_seconds_(context.profile.bucket_launch_seconds),
        bucket_of_lowest_segment_(context.profile.layers.size(), -1) {
    for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
      const Bucket& bucket = plan_.buckets[b];
      std::size_t elements = 0;
      for (std::size_t s = bucket.begin; s < bucket.end; ++s) elements += context.profile.layers[s].parameters;
      bucket_elements_.push_back(elements);
      bucket_of_lowest_segment_[bucket.begin] = static_cast<std::int64_t>(b);
    }
  }

  void segment_ready(std::int64_t t, std::size_t segment, SimulatedThread& compute) override {
    const std::int64_t bucket = bucket_of_lowest_segment_[segment];
    if (bucket < 0) return;
    compute.signal({kReady, t, bucket});
    // As the planners model it (timing/bucket_plan.h): a bucket launched while backward still runs
    // takes kappa from the layers after it; the last one is launched when backward has ended.
    if (static_cast<std::size_t>(bucket) + 1 < bucket_elements_.size() && launch_seconds_ > 0) {
      compute.compute(launch_seconds_, "bucket launch");
    }
  }

  void end_iteration(std::int64_t t, SimulatedThread& compute) override {
    for (std::size_t b = 0; b < bucket_elements_.size(); ++b) compute.wait({kReduced, t, static_cast<std::int64_t>(b)});
    compute.compute(update_seconds_, "update");
  }

  bool has_comm_thread() const override { return true; }

  void run_comm_thread(std::int64_t iterations, SimulatedThread& comm) override {
    for (std::int64_t t = 0; t < iterations; ++t) {
      for (std::size_t b = 0; b < bucket_elements_.size(); ++b) {
        const auto bucket = static_cast<std::int64_t>(b);
        comm.wait({kReady, t, bucket});
        comm.allreduce(bucket_elements_[b]);
        comm.signal({kReduced, t, bucket});
      }
    }
  }

  std::string describe() const override { return concat(plan_.name, ", ", describe_plan(plan_)); }

 private:
  BucketPlan plan_;
  double update_seconds_;
  double launch_seconds_;                              // kappa, per bucket launched during backward
  std::vector<std::size_t> bucket_elements_;           // launch order
  std::vector<std::int64_t> bucket_of_lowest_segment_;  // segment -> the bucket it completes, or -1
};

}  // namespace

std::unique_ptr<SimulatedMethod> simulate_dsync(const SimulationContext& context) {
  if (options_as<DsyncOptions>(context.options).layer_wise()) return std::make_unique<SimulatedBucketedDsync>(context);
  return std::make_unique<SimulatedDsync>(context);
}

}  // namespace pipesgd
