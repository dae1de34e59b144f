#pragma once
// The parameter-server methods' worker side (ps/parameter_server.h has the servers and the
// protocol). The transport given to the method is the run's full transport: workers are ranks
// 0..M-1, servers M..M+S-1 with S = MethodConfig::servers, so M = transport.size() - S.
//
//   PS-Sync (`pssync`, Pipe-SGD Sec. 4 baseline): iteration t pushes the local gradient computed on
//     weights of version t, then pulls the weights of version t + 1 into model.parameters(); the
//     servers (synchronous mode) sum the M gradients in worker order 0..M-1 and take one SGD step
//     with gradient scale 1/M, exactly D-Sync's update up to the summation order of the gradients.
//   ASGD (`asgd`) and DC-ASGD (`dcasgd`, the servers compensate each push for its delay with the
//   worker's backup weights, od-sgd.txt Eq. 4-6, MethodConfig::delay_compensation): iteration t pushes the local gradient (tagged with the version of the weights it
//     was computed on) and pulls the latest weights; the servers (asynchronous mode) apply each push
//     as it arrives with gradient scale 1/M (async_gradient_scale), so that with no staleness M
//     pushes move the weights as far as one SSGD step of global batch M x batch: the per-sample
//     learning rate equals D-Sync's. With one worker ASGD is sequential SGD.
//
// Thread contract: as TrainingMethod; every call comes from the worker's compute thread, which also
// drives the ParameterClient (no comm thread: both methods wait for their pull in end_iteration).
// The hot path does not allocate (ParameterClient's buffers are allocated at construction).
#include <cstdint>
#include <memory>

#include "pipesgd/algo/training_method.h"
#include "pipesgd/ps/parameter_server.h"
#include "pipesgd/ps/shard_plan.h"

namespace pipesgd {

// True for the methods that need server ranks (pssync, asgd, dcasgd, odsgd).
bool method_uses_servers(const std::string& name);

// The number of worker ranks M of a parameter-server method's transport (size - config.servers).
// Throws UsageError if config.servers < 1 or no worker rank is left.
int parameter_server_workers(const MethodConfig& config, const Transport& transport);

// The gradient scale of an asynchronous server with `workers` workers (see above).
inline float async_gradient_scale(int workers) { return 1.0f / static_cast<float>(workers); }

// How the servers of method `config` serve `workers` workers (mode, scale, timeout).
ServeOptions serve_options(const MethodConfig& config, int workers);

class ParameterServerMethod final : public TrainingMethod {
 public:
  // Throws UsageError if config.servers < 1, the transport has no worker ranks, this rank is a
  // server rank, or the model's layout cannot be split over config.servers servers (ShardPlan).
  ParameterServerMethod(const MethodConfig& config, Model& model, Transport& transport);
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

 private:
  Model& model_;
  bool synchronous_;
  Timeout timeout_;
  ShardPlan plan_;
  ParameterClient client_;
  std::vector<float> gradients_;
  std::uint64_t version_ = 0;  // of the weights in model.parameters()
  std::int64_t next_iteration_ = 0;
  bool closed_ = false;
};

}  // namespace pipesgd
