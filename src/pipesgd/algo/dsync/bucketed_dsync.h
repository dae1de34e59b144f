#pragma once
// D-Sync with layer-wise communication (MG-WFBP paper): as backward reports each layer's gradient
// final, the gradient of a bucket (a contiguous range of layers, timing/bucket_plan.h) is allreduced
// on this worker's comm thread while backward goes on with the earlier layers; end_iteration waits
// for the last bucket (that wait is the non-overlapped communication t_c^no), then updates. The
// training methods `wfbp`, `synceasgd` and `mgwfbp` are this with the wfbp, single and mgwfbp plans;
// `dsync+optimal`, `dsync+fixed:25` etc. choose another plan. Every plan composes with every codec.
//
// Planning: after kProfileWarmupIterations (MethodContext::profile_warmup_iterations),
// `profile_iterations` P iterations profile. The first P - P/2 run one bucket and record each
// layer's backward time (from the model's readiness reports), the time before backward (data,
// forward, bookkeeping), the update and the allreduce of the whole gradient; the other P/2 run one
// bucket per layer and record how much the allreduces running beside backward slow it: kappa per
// bucket (LayerProfile::per_bucket_compute_seconds; 0 if P < 2). Then, unless a calibration file
// gives the cost model (algo/planning.h, planning_cost), the workers time their allreduce at
// kCostProbes sizes (the cost of this transport and network as it is, software overheads included)
// for a + b·M: the largest, the whole gradient, is the median of the single phase's allreduces; the
// others are timed after the cycle. The workers average their profiles and timings
// (PlanningExchange, so every worker computes the same plan from the same numbers) and compute the
// plan. With `replan_every` N > 0 a new profiling cycle starts N iterations after each plan. A plan
// is never changed while a bucket is in flight.
//
// Tags: bucket b of iteration t uses sequence t * L + b on Channel::kGradients (L = the model's
// layer count, an upper bound of the bucket count).
//
// Threads: the compute thread calls begin/end/finish and the segment-ready callback (from inside
// forward_backward); the worker's CommWorker runs the buckets' allreduces in launch order. The hot
// path does not allocate.
#include <memory>
#include <vector>

#include "pipesgd/algo/dsync/dsync_options.h"
#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/collective/allreduce.h"
#include "pipesgd/comm/comm_worker.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/timing/bucket_plan.h"

namespace pipesgd {

class BucketedDSync final : public TrainingMethod {
 public:
  // Throws UsageError for an unknown plan, codec or algorithm, or a model without layers.
  explicit BucketedDSync(const MethodContext& context);
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  void finish(IterationTimes&) override {}
  const SegmentReadyFn* segment_ready() override { return &on_segment_ready_; }
  std::shared_ptr<MethodReport> report() const override;
  std::optional<PlanningInputs> planning_inputs() const override;
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    return static_cast<std::uint64_t>(t) * layers_;
  }
  // Nothing is in flight after end_iteration. Saved: the optimizer state and the planning state
  // (the chosen plan and what it came from, the profiling cycle and its partial sums), so a resumed
  // run uses the same buckets as the uninterrupted one (bucket boundaries change how the
  // allreduce sums, hence the rounding) and never profiles again what was profiled.
  void save_state(CheckpointWriter& out) override;
  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override;
  Optimizer* optimizer() override { return optimizer_.get(); }

 private:
  void segment_ready(std::size_t segment, double backward_seconds);
  void submit_ready_buckets(std::size_t lowest_ready_segment);
  void replan(std::int64_t plan_number);
  // Profiling cycles: iterations [cycle_start_, cycle_start_ + P) profile, the first P - P/2 with
  // one bucket, the rest with one bucket per layer; the plan is made at the end of the cycle; with
  // replan_every N the next cycle starts N iterations later.
  bool in_single_phase(std::int64_t t) const;
  bool records_single_phase(std::int64_t t) const;  // t is profiled in the single-bucket phase

  FlatParameters& model_;
  const int workers_;
  const std::string plan_name_;
  const std::int64_t profile_iterations_;
  const std::int64_t replan_every_;
  const std::size_t layers_;
  // The cost model: from the calibration file or the network model (planning_cost) if a
  // calibration file was given, else measured at every planning step (measure_cost_).
  LinearCost cost_;
  const bool measure_cost_;
  std::string algorithm_;
  double bytes_per_element_ = 4;  // the codec's encoded bytes per element
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Allreduce> allreduce_;
  PlanningExchange planning_;
  std::unique_ptr<Optimizer> optimizer_;
  const LrSchedule schedule_;
  std::vector<float> gradients_;
  SegmentReadyFn on_segment_ready_;

  // The plan in use (replaced only between iterations) and what it was computed from.
  BucketPlan plan_;
  LayerProfile planned_profile_;
  double planned_update_seconds_ = 0;
  double planned_backward_tail_seconds_ = 0;  // PlanningInputs::backward_tail_seconds
  std::int64_t plans_made_ = 0;
  // The first profiling cycle's start: after kProfileWarmupIterations from iteration 0; at once when
  // built mid-run (MethodContext::first_iteration); none when built with `auto`'s profile
  // (MethodContext::planned_from), which is the first plan (planned_at_start_), until a re-plan.
  std::int64_t first_cycle_start_ = kProfileWarmupIterations;
  bool planned_at_start_ = false;
  std::int64_t plan_start_ = 0;  // the first iteration with a plan of plan_name_
  std::int64_t cycle_start_ = kProfileWarmupIterations;
  enum class PlanInUse { kSingle, kOnePerLayer, kChosen };
  PlanInUse plan_in_use_ = PlanInUse::kSingle;  // what plan_ holds
  std::int64_t plan_version_ = 0;               // plans_made_ when plan_ was last copied
  BucketPlan chosen_plan_;  // the plan made at the end of the last cycle
  // The profiling cycle's sums (compute thread only).
  LayerSums backward_sums_;
  // single_backward_sum_: the single phase's whole backward (the trainer's clock, beside the
  // layers' readiness intervals in backward_sums_).
  double before_backward_sum_ = 0, update_sum_ = 0, interference_backward_sum_ = 0, single_backward_sum_ = 0;
  std::int64_t single_iterations_ = 0, interference_iterations_ = 0;
  // The single phase's allreduce of the whole gradient, seconds per iteration (the first
  // single_iterations_ of P - P/2): the cost probe at the largest size, timed by the training.
  std::vector<double> single_comm_seconds_;
  // The last plan's cost probes (PlanningInputs::probe_bytes, probe_seconds; not checkpointed).
  std::vector<double> probe_bytes_, probe_seconds_;
  // The averaged profile's wire form: L backward times, t_f, update, kappa, backward's tail,
  // kCostProbes probe medians.
  std::vector<float> profile_buffer_;
  // This iteration (compute thread only).
  std::int64_t iteration_ = 0;
  std::size_t next_bucket_ = 0;  // the next bucket to hand to the comm thread
  Clock::time_point iteration_start_{};

  std::vector<CommWorker::Ticket> bucket_tickets_;  // this iteration's, by bucket (the first next_bucket_)
  CommWorker comm_;  // last: its thread stops before the buffers go
};

}  // namespace pipesgd
