#pragma once
// SAPipe (SAPipe paper Sec. 3): partial staleness with staleness compensation.
//
// Layers 0..k-1 (forward order; the "stale range", elements [0, S) of the flat buffers) train on
// 1-step-stale aggregated gradients exactly as Pipe-SGD with K = 2: the update at the start of
// iteration t applies the aggregated gradient of iteration t-2. Layers k..m-1 are synchronous: their
// gradient is allreduced in buckets (timing/bucket_plan.h) launched as backward produces them, and
// each bucket's update is applied inside the next forward, just before forward first reads those
// layers (FlatParameters::set_forward_hook), so their communication overlaps the backward of the
// earlier layers and the forward of the stale ones (SAPipe paper Fig. 2). A model that does not report
// forward progress gets the synchronous update at the start of the iteration instead.
//
// The method is built from four parts, each in its own file:
//   sapipe_partition.h   k, the stale range, the synchronous buckets, and what decided them: with
//                        --stale-layers auto, after kProfileWarmupIterations synchronous iterations
//                        the next profile_iterations measure each layer's forward and backward time
//                        and the cost a + b·M of this run's allreduce (or take it from
//                        --calibration), averaged over the workers; k is the least number of first
//                        layers for which the simulated pipeline never stalls (k and the synchronous
//                        plan enumerated together on the timeline);
//   stall_monitor.h      auto's stall checks, which raise k when the measured pipeline stalls (the
//                        pipeline is then drained, as finish() does, and restarted with the new k);
//   stale_compensation.h the stale range's update: none, dc, wp1, wp2, wp3, and its history;
//   sapipe_state.cpp     checkpoints (each part saves and checks its own sections).
// Pipelining starts after the warm-up and (when k or the plan needs measured times) the profiling;
// iterations before run synchronously (every layer in one allreduce after backward, waited for in
// end_iteration, applied at the start of the next). No prediction while nothing is in flight (the
// first pipelined iteration). finish() applies the last gradients (stale ones with their
// compensation) and leaves the true weights in the model.
//
// Built mid-run (MethodContext::first_iteration F > 0, `auto` switching to it): nothing is in flight,
// as after a drain; with MethodContext::planned_from (auto's profile) k and the plan are made at once
// from it (staleness_profile_from) and pipelining starts at F, else the profiling starts
// profile_warmup_iterations after F.
//
// Tags: job j of iteration t uses sequence t * (m + 1) + j on Channel::kGradients, j = the bucket
// index (backward order) for synchronous buckets and m for the stale range.
//
// Threads: the compute thread calls begin/end/finish, the segment-ready callback and the forward
// hook (both from inside forward_backward); the worker's CommWorker runs the allreduces in
// submission order. The hot path does not allocate.
#include <memory>
#include <vector>

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/algo/sapipe/sapipe_options.h"
#include "pipesgd/algo/sapipe/sapipe_partition.h"
#include "pipesgd/algo/sapipe/stale_compensation.h"
#include "pipesgd/algo/sapipe/stall_monitor.h"
#include "pipesgd/comm/comm_worker.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/optim/optimizer.h"

namespace pipesgd {

class SaPipe final : public TrainingMethod {
 public:
  static constexpr std::size_t kStaleJob = 0xfff;  // the job index of the stale range (above any bucket's)
  static constexpr std::size_t kNoFlow = SIZE_MAX;   // an update whose arrow another update ends
  // Throws UsageError for more stale layers than the model has, an unknown plan, codec or
  // algorithm, or a model without layers.
  explicit SaPipe(const MethodContext& context);
  ~SaPipe() override;
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  void finish(IterationTimes& times) override;
  const SegmentReadyFn* segment_ready() override { return &on_segment_ready_; }
  std::shared_ptr<MethodReport> report() const override;
  Optimizer* optimizer() override { return optimizer_.get(); }
  // With weight prediction the model's stale range holds this worker's prediction: the true weights
  // are checked instead.
  std::uint64_t replica_checksum(FlatParameters& model) const override;
  // save_state waits for the allreduces in flight (applying nothing) and saves the optimizer, both
  // gradient slots, which reduced gradients are still to be applied, the pipeline's start and
  // drain, the profiling sums, and each part's sections (partition, stall checks, compensation).
  // load_state restores them after checking them against this run (--stale-layers,
  // --compensation, the model's layers) and `next_iteration`: a resumed run goes on with the same k
  // and plan without profiling again.
  void save_state(CheckpointWriter& out) override;
  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override;

 private:
  using Range = SapipePartition::Range;

  bool pipelined(std::int64_t t) const { return t >= pipeline_start_; }
  // True until the partition is final (before the plan; while the first stall window is pending):
  // then the compensation history is kept for every layer.
  bool partition_may_change() const { return !partition_.planned() || monitor_.first_window_pending(); }
  bool profiling(std::int64_t t) const;
  // After the partition changed (between iterations, nothing in flight).
  void partition_changed();
  // Jobs (compute thread): submit returns the job's ticket; wait_for blocks until it is reduced
  // (adding the wait and the allreduce's time to `times`) and returns the allreduce's seconds.
  // (`index`: the synchronous bucket, or kStaleJob for the stale range or a whole synchronous
  // iteration's gradient; the trace's arrows join a job to its update by it).
  std::uint64_t submit(std::span<float> range, std::uint64_t sequence, std::size_t index);
  double wait_for(std::uint64_t job, const char* what, std::int64_t iteration, IterationTimes& times);
  // The synchronous update of `range` with the gradient of iteration `gradient_iteration` in `slot`
  // (at that iteration's learning rate); the trace's arrow of job `job_index` ends there (kNoFlow: none).
  void step_synchronous_range(const Range& range, std::span<const float> slot, std::int64_t gradient_iteration,
                              std::size_t job_index, IterationTimes& times);
  // A synchronous iteration's whole gradient (one job) is applied in two parts, the stale range's
  // update and this one: the arrow ends in the first that exists.
  std::size_t whole_gradient_flow() const { return partition_.stale().count == 0 ? kStaleJob : kNoFlow; }
  void segment_ready(std::size_t segment, double backward_seconds);
  void submit_ready(std::size_t lowest_ready_segment);
  void forward_needs(std::size_t first, std::size_t end);
  // Applies (waiting for them) the synchronous buckets of the previous iteration not yet applied
  // that start below segment `end`: forward is about to read segments below `end`.
  void apply_sync_buckets(std::size_t end, IterationTimes& times);
  // The stale range's update with G(gradient_iteration) (or none: -1) at that iteration's learning
  // rate, then the prediction (predict: something in flight), at the learning rate of the update it
  // anticipates: the next one, which applies G(t-1) at the start of t+1.
  void update_stale_range(std::int64_t gradient_iteration, bool predict, IterationTimes& times);
  void plan_from_profile();
  // k and the synchronous plan from the averaged `profile` and `cost` (at construction from auto's
  // profile, or after the profiling), and what follows from them.
  void plan_partition(const StalenessProfile& profile, const LinearCost& cost);
  // The stall check of --stale-layers auto at the end of pipelined iteration t (collective).
  void check_for_stalls(std::int64_t t, IterationTimes& times);

  FlatParameters& model_;
  const int workers_;
  const std::size_t layers_;
  const SapipeOptions options_;
  const bool measure_cost_;
  const float gradient_scale_;
  std::string algorithm_;
  double bytes_per_element_ = 4;
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Allreduce> allreduce_;
  PlanningExchange planning_;
  std::unique_ptr<Optimizer> optimizer_;
  const LrSchedule schedule_;
  SegmentReadyFn on_segment_ready_;

  SapipePartition partition_;
  StallMonitor monitor_;
  StaleCompensation compensation_;
  // The first iteration the method runs (MethodContext::first_iteration), the first profiled one,
  // and the iteration before which the partition is planned (planned at construction: the first).
  const std::int64_t first_iteration_;
  const std::int64_t profile_start_;
  std::int64_t plan_iteration_ = 0;
  std::int64_t pipeline_start_ = 0;
  std::int64_t drained_iteration_ = -1;  // the pipeline was drained after this iteration (first - 1: nothing ran)

  // Two gradient slots (iteration t writes slot t % 2) and the jobs reducing them.
  std::vector<float> slots_[2];
  std::uint64_t stale_job_[2] = {0, 0};  // the stale-range job of the iteration in each slot
  bool stale_job_valid_[2] = {false, false};
  std::vector<std::uint64_t> sync_jobs_;           // this iteration's bucket jobs (backward order)
  std::vector<std::uint64_t> previous_sync_jobs_;  // the previous iteration's, until applied
  std::size_t previous_sync_applied_ = 0;          // buckets applied, counted from the last
  bool previous_sync_pending_ = false;

  // The iteration in progress (compute thread only).
  std::int64_t iteration_ = 0;
  std::int64_t next_iteration_ = 0;
  std::size_t next_bucket_ = 0;
  bool stale_submitted_ = false;
  bool single_submitted_ = false;
  IterationTimes* times_ = nullptr;  // the times of the iteration in progress (for the hook)
  Clock::time_point iteration_start_{}, hook_exit_{};
  std::size_t last_group_first_ = 0;  // the first segment of the forward hook's last call
  double hook_seconds_ = 0;           // this iteration's time inside the forward hook
  bool first_ready_seen_ = false;

  // Profiling (compute thread only): per-layer forward and backward sums; the iteration's own
  // measurements and, at the plan, the averaged profile's wire form: L forward times, L backward
  // times, kCostProbes probe medians.
  LayerSums forward_sums_, backward_sums_;
  std::int64_t profiled_iterations_ = 0;
  std::vector<float> profile_buffer_;

  CommWorker comm_;  // last: its thread stops before the buffers go
};

}  // namespace pipesgd
