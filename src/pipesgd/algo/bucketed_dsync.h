#pragma once
// D-Sync with layer-wise communication (mg-wfbp.txt): as backward reports each layer's gradient
// final, the gradient of a bucket (a contiguous range of layers, timing/bucket_plan.h) is allreduced
// on this worker's comm thread while backward goes on with the earlier layers; end_iteration waits
// for the last bucket (that wait is the non-overlapped communication t_c^no), then updates. The
// training methods `wfbp`, `synceasgd` and `mgwfbp` are this with the wfbp, single and mgwfbp plans;
// `dsync+optimal`, `dsync+fixed:25` etc. choose another plan. Every plan composes with every codec.
//
// Planning: after kProfileWarmupIterations, `profile_iterations` P iterations profile. The first P - P/2 run one bucket
// and record each layer's backward time (from the model's readiness reports), the time before
// backward (data, forward, bookkeeping) and the update; the other P/2 run one bucket per layer and
// record how much the allreduces running beside backward slow it: kappa per bucket
// (LayerProfile::per_bucket_compute_seconds; 0 if P < 2). Then, unless a calibration file gives the cost model
// (MethodConfig::bucket_cost), the workers time their allreduce at kCostProbes sizes (the cost of
// this transport and network as it is, software overheads included) for a + b·M. The workers average
// their profiles and timings (one small allreduce on Channel::kPlanning, so every worker computes
// the same plan from the same numbers) and compute the plan. With `replan_every` N > 0 a new
// profiling cycle starts N iterations after each plan. A plan is never changed while a bucket is in
// flight.
//
// Tags: bucket b of iteration t uses sequence t * L + b on Channel::kGradients (L = the model's
// layer count, an upper bound of the bucket count).
//
// Threads: the compute thread calls begin/end/finish and the segment-ready callback (from inside
// forward_backward); the worker's CommWorker runs the buckets' allreduces in launch order. The hot
// path does not allocate.
#include "pipesgd/algo/training_method.h"
#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/comm/comm_worker.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/timing/bucket_plan.h"

namespace pipesgd {

// The message sizes (bytes, multiples of 4) at which the cost a + b·M is measured: kCostProbes
// sizes spread log-uniformly from the smallest layer's gradient (at least 4 KiB) to the whole
// gradient, so the fit covers the buckets any plan can make.
inline constexpr int kCostProbes = 4;
std::vector<double> cost_probe_sizes(const LayerProfile& profile);

// Runs `allreduce` on the first size / bytes_per_element floats of `scratch` (which it overwrites;
// sizes are bytes on the wire, bytes_per_element the codec's encoded size; the allreduce must have
// been built for at least the largest count) `repeats` times per size and returns the median
// seconds per size. Collective: every rank calls it with the same sizes and `sequence_base`; the
// runs use Channel::kPlanning sequences sequence_base, sequence_base + 1, ...
std::vector<double> measure_allreduce_seconds(Allreduce& allreduce, std::span<float> scratch,
                                              std::span<const double> sizes, double bytes_per_element,
                                              int repeats, std::uint64_t sequence_base);

// a + b·M (a, b >= 0) fitted to the median `seconds` at `sizes` (relative least squares).
LinearCost fit_measured_cost(std::span<const double> sizes, std::span<const double> seconds,
                             const std::string& algorithm, int workers);

// The first iterations of a run pay one-off costs (allocations, LibTorch's kernel selection: the
// resnet's forward takes 50-60 ms in its first 7 iterations, 33 ms after): they run the single
// bucket unprofiled, and the first profiling cycle starts after them.
inline constexpr std::int64_t kProfileWarmupIterations = 8;

// --profile-iters as given, or UsageError if < 1 (the layer-wise methods and sapipe).
std::int64_t checked_profile_iterations(std::int64_t iterations);

// Checkpoint sections shared by the layer-wise methods (and sapipe). Doubles are stored bit for bit.
void save_doubles(CheckpointWriter& out, std::string name, std::span<const double> values);
// The `count` doubles of section `name`; DataError naming the file if missing or of another count.
std::vector<double> load_doubles(const CheckpointReader& in, const std::string& name, std::size_t count);
// A bucket plan as sections `prefix` + "name" and + "bounds" (begin, end per bucket).
void save_bucket_plan(CheckpointWriter& out, const std::string& prefix, const BucketPlan& plan);
// The plan saved by save_bucket_plan, checked to be a plan over `layers` layers (buckets in launch
// order, contiguous, the first ending at `layers`, the last beginning at 0; none for 0 layers);
// DataError naming the file otherwise.
BucketPlan load_bucket_plan(const CheckpointReader& in, const std::string& prefix, std::size_t layers);

class BucketedDSync final : public TrainingMethod {
 public:
  // Throws UsageError for an unknown plan (MethodConfig::buckets), codec or algorithm.
  BucketedDSync(const MethodConfig& config, Model& model, Transport& transport);
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  void finish(IterationTimes&) override {}
  const SegmentReadyFn* segment_ready() override { return &on_segment_ready_; }
  MethodReport report() const override;
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    return static_cast<std::uint64_t>(t) * layers_;
  }
  // Nothing is in flight after end_iteration. Saved: the optimizer state and the planning state
  // (the chosen plan and what it came from, the profiling cycle and its partial sums), so a resumed
  // run uses the same buckets as the uninterrupted one (bucket boundaries change how the
  // allreduce sums, hence the rounding) and never profiles again what was profiled.
  void save_state(CheckpointWriter& out) override;
  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override;

 private:
  void segment_ready(std::size_t segment, double backward_seconds);
  void submit_ready_buckets(std::size_t lowest_ready_segment);
  void replan(std::int64_t plan_number);

  Model& model_;
  Transport& transport_;
  const std::string plan_name_;
  // The cost model: from the calibration file or the network model (config.bucket_cost) if a
  // calibration file was given, else measured at every planning step (measure_cost_).
  LinearCost cost_;
  const bool measure_cost_;
  std::string algorithm_;
  double bytes_per_element_ = 4;  // the codec's encoded bytes per element
  const std::int64_t profile_iterations_;
  const std::int64_t replan_every_;
  const Timeout timeout_;
  const std::size_t layers_;
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Allreduce> allreduce_;
  std::unique_ptr<Codec> planning_codec_;
  RingAllreduce planning_allreduce_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<float> gradients_;
  SegmentReadyFn on_segment_ready_;

  // The plan in use (replaced only between iterations) and what it was computed from.
  BucketPlan plan_;
  LayerProfile planned_profile_;
  double planned_update_seconds_ = 0;
  std::int64_t plans_made_ = 0;
  // Profiling cycles (compute thread only): iterations [cycle_start_, cycle_start_ + P) profile,
  // the first P - P/2 with one bucket, the rest with one bucket per layer; the plan is made at the
  // end of the cycle; with replan_every N the next cycle starts N iterations later.
  bool in_single_phase(std::int64_t t) const;
  bool records_single_phase(std::int64_t t) const;  // t is profiled in the single-bucket phase
  std::int64_t cycle_start_ = kProfileWarmupIterations;
  enum class PlanInUse { kSingle, kOnePerLayer, kChosen };
  PlanInUse plan_in_use_ = PlanInUse::kSingle;  // what plan_ holds
  std::int64_t plan_version_ = 0;               // plans_made_ when plan_ was last copied
  BucketPlan chosen_plan_;  // the plan made at the end of the last cycle
  std::vector<double> backward_sums_;
  double before_backward_sum_ = 0, update_sum_ = 0, interference_backward_sum_ = 0;
  std::int64_t single_iterations_ = 0, interference_iterations_ = 0;
  // The averaged profile's wire form: L backward times, t_f, update, kappa, kCostProbes probe
  // medians.
  std::vector<float> profile_buffer_;
  // This iteration (compute thread only).
  std::int64_t iteration_ = 0;
  std::size_t next_bucket_ = 0;  // the next bucket to hand to the comm thread
  Clock::time_point iteration_start_{};
  double last_update_seconds_ = 0;

  std::vector<CommWorker::Ticket> bucket_tickets_;  // this iteration's, by bucket (the first next_bucket_)
  CommWorker comm_;  // last: its thread stops before the buffers go
};

}  // namespace pipesgd
