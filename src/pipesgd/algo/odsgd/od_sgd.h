#pragma once
// OD-SGD (the paper's Alg. 1-2), the worker side; the servers run the synchronous mode of
// ps/parameter_server.h unchanged (Alg. 1). Let G_v be the servers' weights of version v (G_0 the
// initial weights; G_{v+1} = SGD step of G_v with the mean of the M gradients of iteration v) and
// W_t the weights a worker trains on at iteration t, with N = max(warmup_iterations, 1):
//
//   warm-up, t < N:    W_t = G_t: iteration t pushes g_t and waits for the pull of G_{t+1} (SSGD,
//                      exactly PS-Sync).
//   t >= N:            W_t = LocalUpdate(G_{t-1}, g_{t-1}): the pulled global weights of iteration
//                      t - 1 updated locally with this worker's own gradient of iteration t - 1.
//
// Iteration N - 1 is the switching stage (Alg. 2 lines 8-14, with the paper's wp = N - 1): it trains
// on G_{N-1} like a warm-up iteration, but hands its push and pull to the comm thread and computes
// W_N = LocalUpdate(G_{N-1}, g_{N-1}) without waiting for them. From then on iteration t hands
// "push g_t, pull G_{t+1}" to the comm thread, waits only for G_t (pulled by iteration t - 1's job,
// while iteration t computed: the overlap that is OD-SGD's point), and computes W_{t+1}. N = 0 and
// N = 1 are the same: iteration 0 always trains on G_0. finish() waits for the last pull and leaves
// the global weights G_T in model.parameters(), the same on every worker.
//
// Local updaters (--local-updater, learning rate --local-lr):
//   sgd       W = SGD step of G with g (the run's momentum and weight decay, momentum kept locally)
//   dcasgd-c  the same step with g compensated per Eq. 4: g + lambda g (.) g (.) (G - W_old)
//   dcasgd-a  ... per Eq. 5-6 (adaptive lambda / sqrt(MeanSquare + eps))
// where W_old are the weights g was computed on (optim/delay_compensation.h).
// Learning-rate schedule: the local update with g_t and the servers' global update with g_t both
// scale their own learning rate by the schedule's factor(t).
//
// Threads: the compute thread calls begin/end/finish; the worker's CommWorker drives the
// ParameterClient from the switching stage on (the compute thread drives it during the warm-up and
// again in finish() and save_state() once the comm thread is idle). Gradients and pulled weights
// are double-buffered by iteration parity, so neither thread waits for the other to release a
// buffer. The hot path does not allocate.
#include <cstdint>
#include <optional>

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/ps_methods/ps_methods.h"
#include "pipesgd/comm/comm_worker.h"
#include "pipesgd/optim/delay_compensation.h"
#include "pipesgd/optim/sgd.h"
#include "pipesgd/ps/parameter_server.h"
#include "pipesgd/ps/shard_plan.h"

namespace pipesgd {

// Warm-up iterations of odsgd when neither --warmup-iters nor --warmup-epochs is given (the paper's
// setting, OD-SGD paper Sec. 4).
inline constexpr std::int64_t kOdSgdDefaultWarmupIterations = 200;

// Names accepted by --local-updater.
std::vector<std::string> local_updater_names();

// OD-SGD's options: its servers (synchronous, as pssync's), its warm-up and its local updater.
class OdSgdOptions final : public ParameterServerOptions {
 public:
  WarmUp warmup_given{0, kOdSgdDefaultWarmupIterations};
  std::string local_updater = "sgd";         // local_updater_names()
  float local_learning_rate = 0;             // --local-lr; 0 = --lr
  DelayCompensationOptions local_compensation;  // dcasgd-*: lambda and m (the variant is the updater's)

  WarmUp warmup() const override { return warmup_given; }
  std::optional<DeferredPhase> deferred_phase(std::int64_t warmup_iterations) const override;
  std::string fingerprint() const override;
};

// What odsgd's report states of its update rule: its local updater's compensation, if any (its
// servers are synchronous, with no async scale).
ServerUpdateSettings od_sgd_update_settings(const OdSgdOptions& options);

// A worker's local updater: weights = update of `base` with `gradient`, where `weights` holds on
// entry the weights `gradient` was computed on (delay compensation needs them), at --local-lr (or
// --lr) times `learning_rate_factor` (the schedule's factor for the gradient's iteration). `base`
// may alias `weights`. Not thread-safe (the compute thread owns it).
class LocalUpdater {
 public:
  // Throws UsageError for an unknown kind or bad options.
  LocalUpdater(std::size_t count, const std::string& kind, SgdOptions sgd,
               DelayCompensationOptions compensation);
  void apply(std::span<const float> base, std::span<const float> gradient, std::span<float> weights,
             double learning_rate_factor);
  // Checkpoints: the local momentum and, for dcasgd-a, MeanSquare (sections `prefix` + ...).
  void save_state(CheckpointWriter& out, const std::string& prefix) const;
  void load_state(const CheckpointReader& in, const std::string& prefix);

 private:
  Sgd sgd_;
  std::optional<DelayCompensation> compensation_;
  std::vector<float> compensated_;
};

class OneStepDelaySgd final : public TrainingMethod {
 public:
  // Throws UsageError as ParameterServerMethod does, and for a bad local updater.
  explicit OneStepDelaySgd(const MethodContext& context);
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  // Waits for the last pull, leaves G_T in model.parameters() and closes the client. Idempotent.
  void finish(IterationTimes& times) override;
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    return static_cast<std::uint64_t>(t);
  }
  // Checkpoints after iteration t (n = t + 1): past the switching stage, waits for job t and saves
  // G_n (the global weights iteration n updates locally; model.parameters() holds W_n) and the
  // local updater's state; then sends the servers this worker's checkpoint marker of n (the comm
  // thread is idle until job n is handed over, so the compute thread drives the client).
  void save_state(CheckpointWriter& out) override;
  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override;
  std::shared_ptr<MethodReport> report() const override;

 private:
  std::span<float> gradients(std::int64_t t) { return gradients_[static_cast<std::size_t>(t % 2)]; }
  std::span<float> pulled(std::int64_t version) { return pulled_[static_cast<std::size_t>(version % 2)]; }
  // Waits until the comm thread has pulled G_version; returns its job's duration. Compute thread.
  double wait_for_pull(std::int64_t version, IterationTimes& times);
  // The comm thread's job of iteration t: push g_t, pull G_{t+1}.
  void run_job(std::int64_t t);

  FlatParameters& model_;
  Transport& transport_;
  const std::int64_t switch_iteration_;  // N - 1
  const Timeout timeout_;
  ShardPlan plan_;
  ParameterClient client_;
  LocalUpdater updater_;
  ServerUpdateSettings settings_;  // for its report
  const LrSchedule schedule_;      // the local update of g_t uses factor(t), as the servers' of g_t
  std::vector<float> gradients_[2];
  std::vector<float> pulled_[2];
  std::int64_t next_iteration_ = 0;
  bool finished_ = false;

  std::int64_t first_job_;  // the iteration of the comm worker's ticket 0
  CommWorker comm_;         // last: its thread stops before the buffers and the client go
};

}  // namespace pipesgd
