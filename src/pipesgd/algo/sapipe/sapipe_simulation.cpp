#include "pipesgd/algo/sapipe/sapipe_simulation.h"

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/sapipe/sapipe_options.h"
#include "pipesgd/algo/sapipe/sapipe_partition.h"
#include "pipesgd/collective/codec.h"

namespace pipesgd {
namespace {

class SimulatedSapipe final : public SimulatedMethod {
 public:
  enum Event { kBucketReady, kBucketReduced, kStaleReady, kStaleReduced };

  explicit SimulatedSapipe(const SimulationContext& context)
      : options_(options_as<SapipeOptions>(context.options)),
        layout_(profile_layout(context.profile)),
        partition_(layout_, bytes_per_element(*make_codec(context.common.codec)), options_.sync_plan,
                   context.allreduce_cost),
        profile_(context.profile), warmup_(context.warmup_iterations) {
    StalenessProfile profile;
    for (const ProfiledLayer& layer : context.profile.layers) {
      profile.forward_seconds.push_back(layer.forward_seconds);
      profile.backward_seconds.push_back(layer.backward_seconds);
    }
    partition_.plan(profile, context.allreduce_cost, options_.stale_layers);
    const auto& buckets = partition_.sync_buckets();  // backward order
    bucket_of_lowest_segment_.assign(context.profile.layers.size(), -1);
    for (std::size_t b = 0; b < buckets.size(); ++b) bucket_of_lowest_segment_[buckets[b].begin] = static_cast<std::int64_t>(b);
  }

  void begin_iteration(std::int64_t t, SimulatedThread& compute) override {
    next_unapplied_ = partition_.sync_buckets().size();  // applied from the last (lowest layers) down
    if (t < warmup_ || partition_.stale_layers() == 0) return;
    if (t - 2 >= warmup_) compute.wait({kStaleReduced, t - 2, 0});
    const std::size_t stale = partition_.stale().count;
    const double* measured = profile_.method_cost(sapipe_compensation_cost_name(options_.compensation));
    if (measured != nullptr) {
      // As the trainer times it: the whole stale update under "compensation" (but for none). The
      // first pipelined iteration has nothing in flight to compensate: the plain update.
      if (options_.compensation == Compensation::kNone) {
        compute.compute(*measured * static_cast<double>(stale), "update");
      } else if (t - 1 >= warmup_) {
        compute.compute(*measured * static_cast<double>(stale), "compensation");
      } else {
        compute.compute(profile_.update_seconds_of(stale), "update");
      }
      return;
    }
    const double stale_update = profile_.update_seconds_of(stale);
    compute.compute(stale_update, "update");
    if (t - 1 >= warmup_) compute.compute(stale_update * compensation_update_passes(options_.compensation), "compensation");
  }

  bool wants_forward_hooks() const override { return true; }

  void before_forward(std::int64_t t, std::size_t first, std::size_t end, SimulatedThread& compute) override {
    if (t - 1 < warmup_) return;  // the previous iteration was synchronous: applied already
    // Forward reads segments below `end`: apply iteration t-1's buckets holding them, lowest first.
    const auto& buckets = partition_.sync_buckets();
    while (next_unapplied_ > 0 && buckets[next_unapplied_ - 1].begin < end) {
      const std::size_t b = --next_unapplied_;
      compute.wait({kBucketReduced, t - 1, static_cast<std::int64_t>(b)});
      compute.compute(profile_.update_seconds_of(buckets[b].count), "update");
    }
  }

  void segment_ready(std::int64_t t, std::size_t segment, SimulatedThread& compute) override {
    if (t < warmup_) return;
    const std::int64_t bucket = bucket_of_lowest_segment_[segment];
    if (bucket >= 0) compute.signal({kBucketReady, t, bucket});
    if (segment == 0 && partition_.stale_layers() > 0) compute.signal({kStaleReady, t, 0});
  }

  void end_iteration(std::int64_t t, SimulatedThread& compute) override {
    if (t >= warmup_) return;
    compute.allreduce(profile_.parameters());
    compute.compute(profile_.update_seconds, "update");
  }

  bool has_comm_thread() const override { return true; }

  void run_comm_thread(std::int64_t iterations, SimulatedThread& comm) override {
    const auto& buckets = partition_.sync_buckets();
    for (std::int64_t t = warmup_; t < iterations; ++t) {
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        comm.wait({kBucketReady, t, static_cast<std::int64_t>(b)});
        comm.allreduce(buckets[b].count);
        comm.signal({kBucketReduced, t, static_cast<std::int64_t>(b)});
      }
      if (partition_.stale_layers() > 0) {
        comm.wait({kStaleReady, t, 0});
        comm.allreduce(partition_.stale().count);
        comm.signal({kStaleReduced, t, 0});
      }
    }
  }

  std::string describe() const override {
    return concat("k = ", partition_.stale_layers(), " of ", partition_.layers(), " layers stale (",
                  options_.automatic() ? "auto" : "given", "), ", compensation_name(options_.compensation), ", ",
                  describe_plan(partition_.sync_plan()));
  }

 private:
  const SapipeOptions& options_;
  const Layout layout_;  // the partition keeps a reference to it
  SapipePartition partition_;
  const ModelProfile& profile_;
  std::int64_t warmup_;
  std::vector<std::int64_t> bucket_of_lowest_segment_;  // segment -> the bucket it completes, or -1
  std::size_t next_unapplied_ = 0;  // buckets [0, next_unapplied_) of t-1 are not applied yet
};

}  // namespace

std::string sapipe_compensation_cost_name(Compensation compensation) {
  return "sapipe:" + compensation_name(compensation);
}

std::unique_ptr<SimulatedMethod> simulate_sapipe(const SimulationContext& context) {
  return std::make_unique<SimulatedSapipe>(context);
}

}  // namespace pipesgd
