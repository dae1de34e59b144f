#include "pipesgd/algo/ps_methods.h"

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
int parameter_server_workers(const MethodConfig& config, const Transport& transport) {
  if (config.servers < 1) {
    throw UsageError(concat("method '", config.name, "' needs at least one server, got ", config.servers));
  }
  const int workers = transport.size() - config.servers;
  if (workers < 1) {
    throw UsageError(concat("method '", config.name, "': ", transport.size(), " ranks leave no worker beside ",
                            config.servers, " servers"));
  }
  return workers;
}

bool method_uses_servers(const std::string& name) {
  return name == "pssync" || name == "asgd" || name == "dcasgd" || name == "odsgd";
}

namespace {
bool asynchronous(const std::string& name) { return name == "asgd" || name == "dcasgd"; }
}  // namespace

ServeOptions serve_options(const MethodConfig& config, int workers) {
  ServeOptions options;
  options.mode = asynchronous(config.name) ? ServerMode::kAsynchronous : ServerMode::kSynchronous;
  options.async_scale = async_gradient_scale(workers);
  if (config.name == "dcasgd") options.delay_compensation = config.delay_compensation;
  options.timeout = config.allreduce.timeout;
  return options;
}

ParameterServerMethod::ParameterServerMethod(const MethodConfig& config, Model& model,
                                             Transport& transport)
    : model_(model),
      synchronous_(!asynchronous(config.name)),
      timeout_(config.allreduce.timeout),
      plan_(model.layout(), config.servers),
      client_(transport, plan_, parameter_server_workers(config, transport), config.allreduce.timeout),
      gradients_(model.layout().total()) {}

std::span<float> ParameterServerMethod::begin_iteration(std::int64_t, IterationTimes&) {
  return gradients_;
}

void ParameterServerMethod::end_iteration(std::int64_t t, IterationTimes& times) {
  Stopwatch communication;
  if (synchronous_) {
    // The servers are at version t when iteration t pushes (one update per iteration).
    const auto version = static_cast<std::uint64_t>(t);
    PushHandle push = client_.push(gradients_, version);
    PullHandle pull = client_.pull(model_.parameters(), version + 1);
    push.wait(timeout_);
    version_ = pull.wait(timeout_);
  } else {
    PushHandle push = client_.push(gradients_, version_);
    // The server handles this worker's requests in order: the reply includes this push.
    PullHandle pull = client_.pull(model_.parameters(), 0);
    push.wait(timeout_);
    version_ = pull.wait(timeout_);
  }
  times.wait = times.comm = communication.seconds();
  times.update = 0;  // the update runs on the servers
  next_iteration_ = t + 1;
}

void ParameterServerMethod::save_state(CheckpointWriter& out) {
  out.add_int("method.ps.version", static_cast<std::int64_t>(version_));
  client_.mark_checkpoint(next_iteration_);
}

void ParameterServerMethod::load_state(const CheckpointReader& in, std::int64_t next_iteration) {
  const std::int64_t version = in.integer("method.ps.version");
  // Synchronous: iteration t pulled version t + 1. Asynchronous: at least one update per push made.
  if (synchronous_ ? version != next_iteration : version < 0) {
    throw DataError(concat("checkpoint '", in.origin(), "': weights of version ", version, " for iteration ",
                           next_iteration, synchronous_ ? concat(" (a synchronous run is at version ", next_iteration, ")")
                                                        : std::string()));
  }
  version_ = static_cast<std::uint64_t>(version);
  next_iteration_ = next_iteration;
}

void ParameterServerMethod::finish(IterationTimes&) {
  if (closed_) return;
  closed_ = true;
  client_.close();
}

}  // namespace pipesgd
