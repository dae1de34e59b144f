#pragma once
// The parameter-server methods' worker side (ps/parameter_server.h has the servers and the
// protocol). The transport given to the method is the run's full transport: workers are ranks
// 0..M-1, servers M..M+S-1 with S = ParameterServerOptions::server_count, so M = transport.size() - S.
//
//   PS-Sync (`pssync`, Pipe-SGD Sec. 4 baseline): iteration t pushes the local gradient computed on
//     weights of version t, then pulls the weights of version t + 1 into model.parameters(); the
//     servers (synchronous mode) sum the M gradients in worker order 0..M-1 and take one SGD step
//     with gradient scale 1/M, exactly D-Sync's update up to the summation order of the gradients.
//   ASGD (`asgd`) and DC-ASGD (`dcasgd`, the servers compensate each push for its delay with the
//   worker's backup weights, OD-SGD paper Eq. 4-6): iteration t pushes the local gradient (tagged
//     with the version of the weights it was computed on) and pulls the latest weights; the servers
//     (asynchronous mode) apply each push as it arrives with the gradient scale of --async-scale
//     (AsyncScale). With one worker ASGD is sequential SGD whatever the scale.
//
// Thread contract: as TrainingMethod; every call comes from the worker's compute thread, which also
// drives the ParameterClient (no comm thread: both methods wait for their pull in end_iteration).
// The hot path does not allocate (ParameterClient's buffers are allocated at construction).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/optim/delay_compensation.h"
#include "pipesgd/ps/parameter_server.h"
#include "pipesgd/ps/shard_plan.h"

namespace pipesgd {

// How an asynchronous server scales each push (--async-scale):
//   kOne             1: every push is one SGD step of its worker's batch-mean gradient, as MXNet's
//                    dist_async kvstore (the ASGD and DC-ASGD baseline of OD-SGD paper) applies it.
//   kInverseWorkers  1/M: with no staleness M pushes move the weights as far as one SSGD step of
//                    global batch M x batch (the per-sample learning rate of D-Sync).
enum class AsyncScale { kOne, kInverseWorkers };
inline constexpr const char* kAsyncScaleNames = "1 or 1/M";
const char* async_scale_name(AsyncScale scale);  // "1" | "1/M"
// "1" or "1/M"; UsageError naming --async-scale otherwise.
AsyncScale parse_async_scale(const std::string& text);

// The options of pssync, asgd and dcasgd (odsgd's derive from them: algo/odsgd/).
class ParameterServerOptions : public MethodOptions {
 public:
  int server_count = 1;  // S >= 1 (--servers)
  ServerMode mode = ServerMode::kSynchronous;
  AsyncScale async_scale = AsyncScale::kOne;  // asynchronous mode only
  // dcasgd: the servers' delay compensation (--dc-variant, --dc-lambda, --dc-momentum).
  std::optional<DelayCompensationOptions> delay_compensation;

  int servers() const override { return server_count; }
  std::string fingerprint() const override;
};

// The update rule a parameter-server run used, as its report states it: the asynchronous servers'
// gradient scale (asgd, dcasgd) and a delay compensation (dcasgd's servers, odsgd's dcasgd-* local
// updaters; `compensated_by` says which).
struct ServerUpdateSettings {
  std::optional<AsyncScale> async_scale;
  std::optional<DelayCompensationOptions> compensation;
  std::string compensated_by;  // "servers" | "local updater"
};

// The settings of `options` (their async scale if asynchronous, their servers' compensation).
ServerUpdateSettings server_update_settings(const ParameterServerOptions& options);

// The number of worker ranks M of a parameter-server method's transport (size - servers). Throws
// UsageError if no worker rank is left.
int parameter_server_workers(int servers, const Transport& transport);

// The gradient scale of an asynchronous server with `workers` workers (see AsyncScale).
inline float async_gradient_scale(AsyncScale scale, int workers) {
  return scale == AsyncScale::kOne ? 1.0f : 1.0f / static_cast<float>(workers);
}

// How the servers of a parameter-server method with `options` serve `workers` workers.
ServeOptions serve_options(const ParameterServerOptions& options, Timeout timeout, int workers);

class ParameterServerMethod final : public TrainingMethod {
 public:
  // Throws UsageError if the transport has no worker ranks, this rank is a server rank, or the
  // model's layout cannot be split over the servers (ShardPlan).
  explicit ParameterServerMethod(const MethodContext& context);
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  // Closes the client (servers return once every worker closed). Idempotent.
  void finish(IterationTimes& times) override;
  // Synchronous: iteration t pushes version t. Asynchronous: the version depends on the others' pushes.
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    if (!synchronous_) return std::nullopt;
    return static_cast<std::uint64_t>(t);
  }
  // Checkpoints: the version of the weights in model.parameters(); save_state also sends the
  // servers this worker's checkpoint marker (ps/parameter_server.h, "Checkpoints").
  void save_state(CheckpointWriter& out) override;
  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override;
  std::shared_ptr<MethodReport> report() const override;

 private:
  FlatParameters& model_;
  bool synchronous_;
  ServerUpdateSettings settings_;  // for its report
  Timeout timeout_;
  ShardPlan plan_;
  ParameterClient client_;
  std::vector<float> gradients_;
  std::uint64_t version_ = 0;  // of the weights in model.parameters()
  std::int64_t next_iteration_ = 0;
  bool closed_ = false;
};

}  // namespace pipesgd
