#include "pipesgd/algo/ps_methods/ps_methods.h"

#include "pipesgd/algo/ps_methods/parameter_server_report.h"

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {
int parameter_server_workers(int servers, const Transport& transport) {
  const int workers = transport.size() - servers;
  if (workers < 1) {
    throw UsageError(concat(transport.size(), " ranks leave no worker beside ", servers, " servers"));
  }
  return workers;
}

const char* async_scale_name(AsyncScale scale) { return scale == AsyncScale::kOne ? "1" : "1/M"; }

AsyncScale parse_async_scale(const std::string& text) {
  if (text == "1") return AsyncScale::kOne;
  if (text == "1/M") return AsyncScale::kInverseWorkers;
  throw UsageError(concat("--async-scale must be ", kAsyncScaleNames, ", got '", text, "'"));
}

std::string ParameterServerOptions::fingerprint() const {
  std::string text = concat(server_count, " servers, ", mode == ServerMode::kSynchronous ? "synchronous" : "asynchronous");
  if (mode == ServerMode::kAsynchronous) text += concat(" scale ", async_scale_name(async_scale));
  if (delay_compensation) {
    text += concat(", dc lambda ", delay_compensation->lambda, " variant ", variant_name(delay_compensation->variant),
                   " momentum ", delay_compensation->mean_square_decay);
  }
  return text;
}

ServerUpdateSettings server_update_settings(const ParameterServerOptions& options) {
  ServerUpdateSettings settings;
  if (options.mode == ServerMode::kAsynchronous) settings.async_scale = options.async_scale;
  if (options.delay_compensation) {
    settings.compensation = options.delay_compensation;
    settings.compensated_by = "servers";
  }
  return settings;
}

ServeOptions serve_options(const ParameterServerOptions& options, Timeout timeout, int workers) {
  ServeOptions serve;
  serve.mode = options.mode;
  serve.async_scale = async_gradient_scale(options.async_scale, workers);
  serve.delay_compensation = options.delay_compensation;
  serve.timeout = timeout;
  return serve;
}

ParameterServerMethod::ParameterServerMethod(const MethodContext& context)
    : model_(context.model),
      synchronous_(options_as<ParameterServerOptions>(context.options).mode == ServerMode::kSynchronous),
      settings_(server_update_settings(options_as<ParameterServerOptions>(context.options))),
      timeout_(context.common.timeout),
      plan_(context.model.layout(), context.options.servers()),
      client_(context.transport, plan_, parameter_server_workers(context.options.servers(), context.transport),
              context.common.timeout, context.learning_rate_schedule),
      gradients_(context.model.layout().total()) {}

std::span<float> ParameterServerMethod::begin_iteration(std::int64_t, IterationTimes&) {
  return gradients_;
}

void ParameterServerMethod::end_iteration(std::int64_t t, IterationTimes& times) {
  TracedStopwatch communication("wait");  // push and pull on this thread: all exposed
  if (synchronous_) {
    // The servers are at version t when iteration t pushes (one update per iteration).
    const auto version = static_cast<std::uint64_t>(t);
    PushHandle push = client_.push(gradients_, version, t);
    PullHandle pull = client_.pull(model_.parameters(), version + 1);
    push.wait(timeout_);
    version_ = pull.wait(timeout_);
  } else {
    PushHandle push = client_.push(gradients_, version_, t);
    // The server handles this worker's requests in order: the reply includes this push.
    PullHandle pull = client_.pull(model_.parameters(), 0);
    push.wait(timeout_);
    version_ = pull.wait(timeout_);
  }
  times.wait = times.comm = communication.stop();
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

namespace pipesgd {
std::shared_ptr<MethodReport> ParameterServerMethod::report() const {
  return std::make_shared<ParameterServerReport>(settings_);
}
}  // namespace pipesgd
