#include "pipesgd/algo/odsgd/od_sgd.h"

#include <algorithm>
#include <cstring>

#include "pipesgd/algo/odsgd/od_sgd_report.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {

std::vector<std::string> local_updater_names() { return {"sgd", "dcasgd-c", "dcasgd-a"}; }

namespace {

std::optional<DelayCompensationOptions> local_compensation(const std::string& kind,
                                                           DelayCompensationOptions options) {
  if (kind == "sgd") return std::nullopt;
  if (kind == "dcasgd-c") {
    options.variant = DelayCompensationVariant::kConstant;
    return options;
  }
  if (kind == "dcasgd-a") {
    options.variant = DelayCompensationVariant::kAdaptive;
    return options;
  }
  throw UsageError(concat("--local-updater must be sgd, dcasgd-c or dcasgd-a, got '", kind, "'"));
}

SgdOptions local_sgd(const OdSgdOptions& options, const CommonOptions& common) {
  SgdOptions sgd = common.optimizer.sgd;
  if (options.local_learning_rate != 0) sgd.learning_rate = options.local_learning_rate;
  return sgd;
}

}  // namespace

LocalUpdater::LocalUpdater(std::size_t count, const std::string& kind, SgdOptions sgd,
                           DelayCompensationOptions compensation)
    : sgd_(count, sgd) {
  if (auto options = local_compensation(kind, compensation)) {
    compensation_.emplace(count, *options);
    compensated_.assign(count, 0.0f);
  }
}

void LocalUpdater::apply(std::span<const float> base, std::span<const float> gradient, std::span<float> weights,
                         double learning_rate_factor) {
  PIPESGD_ASSERT(base.size() == weights.size() && gradient.size() == weights.size());
  std::span<const float> step_gradient = gradient;
  if (compensation_) {
    // w_now = base (the global weights), w_then = weights (what the gradient was computed on).
    compensation_->compensate(gradient, base, weights, compensated_);
    step_gradient = compensated_;
  }
  if (base.data() != weights.data()) {
    std::memcpy(weights.data(), base.data(), weights.size() * sizeof(float));
  }
  sgd_.set_learning_rate_factor(learning_rate_factor);
  sgd_.step(weights, step_gradient, 1.0f);
}

void LocalUpdater::save_state(CheckpointWriter& out, const std::string& prefix) const {
  sgd_.save_state(out, prefix);
  if (compensation_) compensation_->save_state(out, prefix);
}

void LocalUpdater::load_state(const CheckpointReader& in, const std::string& prefix) {
  sgd_.load_state(in, prefix);
  if (compensation_) compensation_->load_state(in, prefix);
}

ServerUpdateSettings od_sgd_update_settings(const OdSgdOptions& options) {
  ServerUpdateSettings settings;
  if (options.local_updater != "sgd") {
    settings.compensation = local_compensation(options.local_updater, options.local_compensation);
    settings.compensated_by = "local updater";
  }
  return settings;
}

std::string OdSgdOptions::fingerprint() const {
  return concat(ParameterServerOptions::fingerprint(), ", local updater ", local_updater, " lr ", local_learning_rate,
                ", dc lambda ", local_compensation.lambda, " momentum ", local_compensation.mean_square_decay);
}

std::optional<DeferredPhase> OdSgdOptions::deferred_phase(std::int64_t warmup_iterations) const {
  return warmup_phase(warmup_iterations, "OD-SGD trains on locally updated global weights",
                      "until then every iteration trains on the servers' synchronous global weights, as pssync");
}

OneStepDelaySgd::OneStepDelaySgd(const MethodContext& context)
    : model_(context.model),
      transport_(context.transport),
      switch_iteration_(std::max<std::int64_t>(context.warmup_iterations, 1) - 1),
      timeout_(context.common.timeout),
      plan_(context.model.layout(), context.options.servers()),
      client_(context.transport, plan_, parameter_server_workers(context.options.servers(), context.transport),
              context.common.timeout, context.learning_rate_schedule),
      updater_(context.model.layout().total(), options_as<OdSgdOptions>(context.options).local_updater,
               local_sgd(options_as<OdSgdOptions>(context.options), context.common),
               options_as<OdSgdOptions>(context.options).local_compensation),
      settings_(od_sgd_update_settings(options_as<OdSgdOptions>(context.options))),
      schedule_(context.learning_rate_schedule),
      first_job_(switch_iteration_),
      comm_(context.transport, "odsgd", 2, context.common.timeout,
            [this](const CommWorker::Job& job) { run_job(job.iteration); }, context.common.wait_spin) {
  const std::size_t count = context.model.layout().total();
  for (auto& buffer : gradients_) buffer.assign(count, 0.0f);
  for (auto& buffer : pulled_) buffer.assign(count, 0.0f);
}

void OneStepDelaySgd::run_job(std::int64_t t) {
  // Job t: push g_t (computed on W_t), pull G_{t+1}. The client copies the gradient at push(), and
  // the pull writes pulled(t + 1), which the compute thread reads only after this job.
  const auto version = static_cast<std::uint64_t>(t);
  PushHandle push = client_.push(gradients(t), version, t);
  PullHandle pull = client_.pull(pulled(t + 1), version + 1);
  push.wait(timeout_);
  const std::uint64_t got = pull.wait(timeout_);
  if (got != version + 1) {
    throw CommError(concat("odsgd: rank ", transport_.rank(), " pulled weights of version ", got, " for iteration ", t,
                           ", expected ", version + 1));
  }
}

double OneStepDelaySgd::wait_for_pull(std::int64_t version, IterationTimes& times) {
  TracedStopwatch waiting("wait");
  // Job version - 1 pulls G_version; jobs are the comm worker's tickets from first_job_ on.
  const double seconds = comm_.wait(static_cast<CommWorker::Ticket>(version - 1 - first_job_),
                                    "the pull of the weights (its push and pull)", version - 1);
  times.wait += waiting.stop();
  return seconds;
}

std::span<float> OneStepDelaySgd::begin_iteration(std::int64_t t, IterationTimes&) {
  PIPESGD_ASSERT(t == next_iteration_ && !finished_);
  return gradients(t);
}

void OneStepDelaySgd::end_iteration(std::int64_t t, IterationTimes& times) {
  next_iteration_ = t + 1;
  if (t < switch_iteration_) {  // warm-up: SSGD on this thread, W_{t+1} = G_{t+1}
    TracedStopwatch communication("wait");
    const auto version = static_cast<std::uint64_t>(t);
    PushHandle push = client_.push(gradients(t), version, t);
    PullHandle pull = client_.pull(model_.parameters(), version + 1);
    push.wait(timeout_);
    pull.wait(timeout_);
    times.wait = times.comm = communication.stop();
    times.update = 0;
    return;
  }
  times.pipelined = true;
  comm_.submit({{}, 0, t, 0});
  // The switching iteration trained on G_{N-1} itself; later ones need G_t from the previous job.
  std::span<const float> base = model_.parameters();
  if (t > switch_iteration_) {
    times.comm = wait_for_pull(t, times);
    base = pulled(t);
  }
  TracedStopwatch update("update");
  if (t > switch_iteration_) trace_gradient_flow_end(t - 1, 0);  // job t - 1 pulled G_t
  updater_.apply(base, gradients(t), model_.parameters(), schedule_.factor(t));
  times.update = update.stop();
}

void OneStepDelaySgd::save_state(CheckpointWriter& out) {
  const std::int64_t next = next_iteration_;
  if (next > switch_iteration_) {  // job next - 1 pulls G_next
    IterationTimes waited;
    wait_for_pull(next, waited);
    out.add("method.odsgd.global_weights", std::span<const float>(pulled(next)));
  }
  updater_.save_state(out, "method.odsgd.local.");
  client_.mark_checkpoint(next);
}

void OneStepDelaySgd::load_state(const CheckpointReader& in, std::int64_t next_iteration) {
  PIPESGD_ASSERT(next_iteration_ == 0 && !finished_);
  updater_.load_state(in, "method.odsgd.local.");
  next_iteration_ = next_iteration;
  if (next_iteration <= switch_iteration_) {
    if (in.has("method.odsgd.global_weights")) {
      throw DataError(concat("checkpoint '", in.origin(), "': global weights of a pipelined iteration at iteration ",
                             next_iteration, ", inside the warm-up of ", switch_iteration_ + 1, " iterations"));
    }
    return;
  }
  const std::span<const float> global = in.floats("method.odsgd.global_weights");
  if (global.size() != pulled(next_iteration).size()) {
    throw DataError(concat("checkpoint '", in.origin(), "': ", global.size(), " global weights for a model of ",
                           pulled(next_iteration).size()));
  }
  std::copy(global.begin(), global.end(), pulled(next_iteration).begin());
  // As if job next - 1 had just completed: the comm worker's next job is iteration next's.
  first_job_ = next_iteration - 1;
  comm_.completed_ticket();
}

void OneStepDelaySgd::finish(IterationTimes& times) {
  if (finished_) return;
  finished_ = true;
  const std::int64_t last = next_iteration_;  // G_last is the final global model
  if (last > switch_iteration_) {
    times.comm += wait_for_pull(last, times);
    const TraceSpan update("update", kTraceCompute);  // the global model replaces the local one
    trace_gradient_flow_end(last - 1, 0);
    std::span<const float> global = pulled(last);
    std::copy(global.begin(), global.end(), model_.parameters().begin());
  }
  // The comm thread is idle (every job it was given is done): the client is this thread's again.
  client_.close();
}

}  // namespace pipesgd

namespace pipesgd {
std::shared_ptr<MethodReport> OneStepDelaySgd::report() const {
  return std::make_shared<OdSgdReport>(switch_iteration_, settings_);
}
}  // namespace pipesgd
