#pragma once
// SAPipe (sapipe.txt Sec. 3): partial staleness with staleness compensation.
//
// Layers 0..k-1 (forward order; the "stale range", elements [0, S) of the flat buffers) train on
// 1-step-stale aggregated gradients exactly as Pipe-SGD with K = 2: the update at the start of
// iteration t applies the aggregated gradient of iteration t-2. Layers k..m-1 are synchronous: their
// gradient is allreduced in buckets (timing/bucket_plan.h) launched as backward produces them, and
// each bucket's update is applied inside the next forward, just before forward first reads those
// layers (Model::set_forward_hook), so their communication overlaps the backward of the earlier
// layers and the forward of the stale ones (sapipe.txt Fig. 2). A model that does not report forward
// progress gets the synchronous update at the start of the iteration instead.
//
// k: --stale-layers N, or auto: after kProfileWarmupIterations synchronous iterations, the next
// profile_iterations measure each layer's forward and backward time and the cost a + b·M of this
// run's allreduce (or take it from --calibration), averaged over the workers; k is the least number
// of first layers for which the simulated pipeline never stalls (plan_partial_staleness: k and the
// bucket plan of the synchronous layers together, enumerated on the timeline). Pipelining starts
// after the warm-up and the profiling; iterations before run synchronously (every layer in one
// allreduce after backward, waited for in end_iteration, applied at the start of the next).
// The timeline's cost is measured in isolation; pipelined, communication shares the cores with
// computation and may take longer. So with auto, every window of kStallCheckIterations pipelined
// iterations (the first after 2 to settle) is checked: if the computation waited more than
// kStallTolerance of the iteration time (averaged over the workers), the cost is scaled by the
// measured / modelled communication time, k is planned again (at least k + 1), the pipeline is
// drained (as finish() does) and restarted with the new k. k only grows, so this ends by k = m.
// Until the first window passes, the compensation history (local gradients, last steps) is kept
// for every layer; a later raise starts the newly stale layers' history from zero. The report
// lists each change (and the first pass at each k).
//
// Compensation (stale range only), with n workers, G(t) the summed gradient of iteration t,
// L(t) this worker's local gradient of iteration t, X the true weights, D the last step of X:
//   none  X <- step(X, G(t-2)/n)                                   (vanilla SAPipe, Alg. 1)
//   dc    g = G(t-2)/n; X <- step(X, g + lambda * g * (g . D))      (Alg. 2, Eq. 1, full matrix:
//         the scalar g . D over the whole stale range)
//   wp1|wp2|wp3  X <- step(X, G(t-2)/n); the model computes on the prediction
//         W = predict(X, g~) (Alg. 3 line 11; the optimizer's update without changing its state):
//         wp1 g~ = L(t-1); wp2 g~ = G(t-2)/n;
//         wp3 g~ = DC(G(t-2)/n - L(t-2)/n, D) + L(t-1)/n, with D the step just taken.
// The DC term's scalar is bounded: |lambda * (g . D)| <= kDelayCompensationBound = 1 - 1/sqrt(2),
// the condition lambda * eta * V2 <= 1 - 1/sqrt(2) of sapipe.txt Theorem 3 (DC's error bound holds
// only there). Unbounded, a loss spike makes the factor 1 + lambda * g . D negative: the step goes
// uphill, the next D is larger, and the run diverges within a few iterations (seen on cnn with all
// layers stale). The report counts the bounded updates.
// No prediction while nothing is in flight (the first pipelined iteration). finish() applies the
// last gradients (stale ones with their compensation) and leaves the true weights in the model.
// The update is fused over the flat stale range (optim/fused_update.h), never per tensor: one pass
// that compensates (dc), steps and records the step; for wp one more pass that predicts; and before
// the compensated pass a reduction for the scalar g . D when dc or wp3 needs it.
//
// Tags: job j of iteration t uses sequence t * (m + 1) + j on Channel::kGradients, j = the bucket
// index (backward order) for synchronous buckets and m for the stale range.
//
// Threads: the compute thread calls begin/end/finish, the segment-ready callback and the forward
// hook (both from inside forward_backward); the worker's CommWorker runs the allreduces in
// submission order. The hot path does not allocate.
#include "pipesgd/algo/training_method.h"
#include "pipesgd/comm/comm_worker.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/optim/optimizer.h"
#include "pipesgd/timing/partial_staleness.h"

namespace pipesgd {

// --dc-lambda's default for sapipe (sapipe.txt Sec. 5.1: "lambda empirically set as 0.2").
inline constexpr float kSapipeDefaultLambda = 0.2f;

// --compensation values.
std::vector<std::string> compensation_names();

// "auto" or a layer count in [0, layers] (kLayersUnknown: any count >= 0); throws UsageError
// otherwise (naming --stale-layers). Returns -1 for auto.
inline constexpr std::size_t kLayersUnknown = static_cast<std::size_t>(-1);
long parse_stale_layers(const std::string& text, std::size_t layers);

// The first pipelined iteration of a sapipe run with `config`: the warm-up, or after the profiling
// when --stale-layers auto or the synchronous plan (optimal, mgwfbp) needs measured times.
std::int64_t sapipe_pipeline_start(const MethodConfig& config);

inline constexpr std::int64_t kStallCheckIterations = 20;
inline constexpr double kDelayCompensationBound = 0.29289321881345254;  // 1 - 1/sqrt(2)
inline constexpr double kStallTolerance = 0.05;

class SaPipe final : public TrainingMethod {
 public:
  // In the order of compensation_names().
  enum class Compensation { kNone, kDelay, kPredictLocal, kPredictSynchronized, kPredictCombined };

  // Throws UsageError for an unknown compensation, plan, codec or algorithm, a bad --stale-layers,
  // a negative warm-up or a dc-lambda that is negative or not finite.
  SaPipe(const MethodConfig& config, Model& model, Transport& transport);
  ~SaPipe() override;
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  void finish(IterationTimes& times) override;
  const SegmentReadyFn* segment_ready() override { return &on_segment_ready_; }
  MethodReport report() const override;
  // With weight prediction the model's stale range holds this worker's prediction: the true weights
  // are checked instead.
  std::uint64_t replica_checksum(Model& model) const override;
  // save_state waits for the allreduces in flight (applying nothing) and saves the optimizer, both
  // gradient slots, the compensation history (local gradients, last steps, true weights: whichever
  // the compensation keeps), which reduced gradients are still to be applied, and the partition
  // with what decides it later (k, the synchronous plan, planned or not, the pipeline start, the
  // stall checks and their window sums, the profile and cost). load_state restores them after
  // checking them against this run (--stale-layers, --compensation, the model's layers) and
  // `next_iteration`: a resumed run goes on with the same k and plan without profiling again.
  void save_state(CheckpointWriter& out) override;
  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override;

 private:
  // An absolute range of segments [begin, end) and of elements [offset, offset + count).
  struct Range {
    std::size_t begin = 0, end = 0;
    std::size_t offset = 0, count = 0;
  };

  bool pipelined(std::int64_t t) const { return t >= pipeline_start_; }
  Range segment_range(std::size_t begin, std::size_t end) const;
  void use_stale_layers(std::size_t stale_layers, const BucketPlan& sync_plan);
  // Jobs (compute thread): submit returns the job's ticket; wait_for blocks until it is reduced
  // (adding the wait and the allreduce's time to `times`) and returns the allreduce's seconds.
  std::uint64_t submit(std::span<float> range, std::uint64_t sequence);
  double wait_for(std::uint64_t job, const char* what, std::int64_t iteration, IterationTimes& times);
  bool predicts() const;  // wp1, wp2, wp3
  // True until the partition is final (before the plan; while a stall check is pending): then the
  // compensation history (local gradients, last steps) is kept for every layer.
  bool partition_may_change() const;
  // Copies this iteration's local gradient of elements [offset, offset + count) (before their
  // allreduce is submitted) for weight prediction.
  void record_local_gradient(std::span<const float> slot, std::size_t offset, std::size_t count);
  // The synchronous update of `range` with the gradient in `slot` (recording the last step where
  // the layers may become stale).
  void step_synchronous_range(const Range& range, std::span<const float> slot, IterationTimes& times);
  void segment_ready(std::size_t segment, double backward_seconds);
  void submit_ready(std::size_t lowest_ready_segment);
  void forward_needs(std::size_t first, std::size_t end);
  // Applies (waiting for them) the synchronous buckets of the previous iteration not yet applied
  // that start below segment `end`: forward is about to read segments below `end`.
  void apply_sync_buckets(std::size_t end, IterationTimes& times);
  // The stale range's update with G(gradient_iteration) (or none: -1), then the prediction
  // (predict: something in flight).
  void update_stale_range(std::int64_t gradient_iteration, bool predict, IterationTimes& times);
  void plan_from_profile();
  // g . D as used by the DC term: bounded so that |lambda * (g . D)| <= kDelayCompensationBound.
  float bounded_projection(double dot);
  // The stall check of --stale-layers auto at the end of pipelined iteration t (collective).
  void check_for_stalls(std::int64_t t, IterationTimes& times);
  // The communication per iteration the timeline predicts for the current partition under `cost`.
  double predicted_communication(const LinearCost& cost) const;

  Model& model_;
  Transport& transport_;
  const std::size_t layers_;
  const long requested_stale_layers_;  // -1: auto
  const std::string plan_name_;
  const Compensation compensation_;
  const float lambda_;
  const std::int64_t profile_iterations_;
  const bool measure_cost_;
  const Timeout timeout_;
  const float gradient_scale_;
  LinearCost cost_;
  std::string algorithm_;
  double bytes_per_element_ = 4;
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Allreduce> allreduce_;
  std::unique_ptr<Codec> planning_codec_;
  RingAllreduce planning_allreduce_;
  std::unique_ptr<Optimizer> optimizer_;
  SegmentReadyFn on_segment_ready_;

  // The partition (fixed once pipelining starts): k, the stale range, the synchronous buckets
  // (absolute segments, backward order) and what k came from.
  std::size_t stale_layers_ = 0;
  Range stale_;
  std::vector<Range> sync_buckets_;
  BucketPlan sync_plan_;
  std::int64_t pipeline_start_ = 0;
  std::int64_t drained_iteration_ = -1;  // the pipeline was drained after this iteration
  // Stall checks (auto only): the window's sums and the decisions made.
  std::int64_t check_start_ = -1;  // -1: no check pending
  double check_wait_ = 0, check_iteration_ = 0, check_comm_ = 0;
  std::int64_t checks_made_ = 0;
  bool monitoring_ = false;  // a check has passed: later windows go on watching (history not kept)
  std::size_t timeline_stale_layers_ = 0;  // k from the timeline before any check raised it
  std::vector<StallCheck> stall_checks_;
  bool planned_ = false;
  StalenessProfile planned_profile_;
  StalenessPlan staleness_plan_;
  std::optional<std::size_t> paper_stale_layers_;

  // Buffers: two gradient slots (iteration t writes slot t % 2), this worker's local gradients (wp:
  // copied before their allreduce; whole buffer), the true stale weights (wp), the last step of
  // every element (dc, wp3; kept for the stale range, and for all while the partition may change).
  std::vector<float> slots_[2];
  std::vector<float> local_[2];
  std::vector<float> true_weights_;
  std::vector<float> last_step_;
  std::uint64_t stale_job_[2] = {0, 0};  // the stale-range job of the iteration in each slot
  bool stale_job_valid_[2] = {false, false};
  std::vector<std::uint64_t> sync_jobs_;  // this iteration's bucket jobs (backward order)
  std::vector<std::uint64_t> previous_sync_jobs_;  // the previous iteration's, until applied
  std::size_t previous_sync_applied_ = 0;           // buckets applied, counted from the last
  bool previous_sync_pending_ = false;

  // The iteration in progress (compute thread only).
  std::int64_t iteration_ = 0;
  std::int64_t next_iteration_ = 0;
  std::size_t next_bucket_ = 0;
  bool stale_submitted_ = false;
  bool single_submitted_ = false;
  IterationTimes* times_ = nullptr;  // the times of the iteration in progress (for the hook)
  Clock::time_point iteration_start_{}, hook_exit_{};
  std::size_t last_group_first_ = 0;
  double hook_seconds_ = 0;
  std::int64_t bounded_compensations_ = 0;  // DC terms bounded (kDelayCompensationBound)  // this iteration's time inside the forward hook  // the first segment of the forward hook's last call
  bool first_ready_seen_ = false;

  // Profiling (compute thread only).
  bool profiling(std::int64_t t) const;
  std::vector<double> forward_sums_, backward_sums_;
  std::int64_t profiled_iterations_ = 0;
  std::vector<float> profile_buffer_;

  CommWorker comm_;  // last: its thread stops before the buffers go
};

}  // namespace pipesgd
