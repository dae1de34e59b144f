#include "pipesgd/algo/sapipe/sapipe.h"

#include <algorithm>

#include "pipesgd/algo/sapipe/sapipe_report.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {

SaPipe::SaPipe(const MethodContext& context)
    : model_(context.model),
      workers_(context.transport.size()),
      layers_(context.model.layout().segment_count()),
      options_(options_as<SapipeOptions>(context.options)),
      measure_cost_(context.common.calibration == nullptr),
      gradient_scale_(1.0f / static_cast<float>(workers_)),
      algorithm_(resolve_allreduce_algorithm(context.common, workers_,
                                             static_cast<double>(context.model.layout().total()) * sizeof(float))),
      codec_(make_codec(context.common.codec)),
      allreduce_(make_method_allreduce(context.common, context.transport, context.model.layout().total(), *codec_,
                                       context.options.default_segment_bytes())),
      planning_(context.transport, 2 * layers_ + kCostProbes, context.common.timeout),
      optimizer_(make_optimizer(context.common.optimizer, context.model.layout())),
      schedule_(context.learning_rate_schedule),
      partition_(context.model.layout(), bytes_per_element(*codec_), options_.sync_plan,
                 planning_cost(context.common, context.network, workers_,
                               static_cast<double>(context.model.layout().total()) * sizeof(float))),
      compensation_(options_.compensation, static_cast<float>(options_.lambda), options_.dc_bound, gradient_scale_,
                    context.model.layout().total()),
      first_iteration_(context.first_iteration),
      profile_start_(context.first_iteration + context.profile_warmup_iterations),
      drained_iteration_(context.first_iteration - 1),
      forward_sums_(layers_),
      backward_sums_(layers_),
      profile_buffer_(2 * layers_ + kCostProbes, 0.0f),
      comm_(context.transport, "sapipe", layers_ + 3, context.common.timeout, [this](const CommWorker::Job& job) {
        allreduce_->run(job.data, collective_tag(Channel::kGradients, job.sequence));
      }, context.common.wait_spin) {
  if (layers_ == 0) throw UsageError("sapipe needs a model with layers");
  if (!options_.automatic()) parse_stale_layers(concat(options_.stale_layers), layers_);  // more than the model has
  bytes_per_element_ = bytes_per_element(*codec_);
  const std::size_t total = context.model.layout().total();
  for (auto& slot : slots_) slot.assign(total, 0.0f);
  next_iteration_ = iteration_ = first_iteration_;
  pipeline_start_ = first_iteration_ + context.warmup_iterations;
  plan_iteration_ = first_iteration_;
  if (!options_.needs_profile()) {
    // k is given and its plan needs no profile: the partition is known now.
    partition_.use_fixed(static_cast<std::size_t>(options_.stale_layers));
    partition_changed();
  } else if (context.planned_from != nullptr) {
    // auto's profile: k and the plan now, from the numbers its prediction used.
    plan_partition(staleness_profile_from(*context.planned_from, context.common.codec), context.planned_from->cost);
  } else {
    plan_iteration_ = profile_start_ + options_.profile_iterations;
    pipeline_start_ = std::max(pipeline_start_, plan_iteration_);
  }
  on_segment_ready_ = [this](std::size_t segment, double seconds) { segment_ready(segment, seconds); };
  if (model_.reports_forward_progress()) {
    model_.set_forward_hook([this](std::size_t first, std::size_t end) { forward_needs(first, end); });
  }
}

SaPipe::~SaPipe() {
  if (model_.reports_forward_progress()) model_.set_forward_hook({});
}

void SaPipe::partition_changed() {
  sync_jobs_.assign(partition_.sync_buckets().size(), 0);
  previous_sync_jobs_.assign(partition_.sync_buckets().size(), 0);
  compensation_.use_stale_range(model_.parameters(), partition_.stale().count);
}

std::uint64_t SaPipe::submit(std::span<float> range, std::uint64_t sequence, std::size_t index) {
  return comm_.submit({range, sequence, iteration_, index});
}

double SaPipe::wait_for(std::uint64_t job, const char* what, std::int64_t iteration, IterationTimes& times) {
  TracedStopwatch waiting("wait");
  const double comm_seconds = comm_.wait(job, what, iteration);
  times.wait += waiting.stop();
  times.comm += comm_seconds;
  return comm_seconds;
}

bool SaPipe::profiling(std::int64_t t) const {
  return !partition_.planned() && t >= profile_start_ && t < plan_iteration_;
}

std::span<float> SaPipe::begin_iteration(std::int64_t t, IterationTimes& times) {
  PIPESGD_ASSERT(t == next_iteration_);
  iteration_start_ = hook_exit_ = Clock::now();
  times_ = &times;
  iteration_ = t;
  first_ready_seen_ = false;
  if (t >= 1 && !pipelined(t - 1) && drained_iteration_ != t - 1) {
    // The last iteration was synchronous: its gradient (the whole buffer, reduced in end_iteration)
    // is applied now, the stale range without compensation, as D-Sync does.
    update_stale_range(t - 1, /*predict=*/false, times);
    step_synchronous_range(partition_.range(partition_.stale_layers(), layers_), slots_[(t - 1) % 2], t - 1,
                           whole_gradient_flow(), times);
  } else if (t >= 2 && pipelined(t - 2) && stale_job_valid_[t % 2]) {
    // Pipelined: the stale range takes G(t-2) (reduced by now or waited for); the synchronous
    // buckets of t-1 are applied by the forward hook, or below for a model without one.
    wait_for(stale_job_[t % 2], "the allreduce of the stale layers", t - 2, times);
    stale_job_valid_[t % 2] = false;
    update_stale_range(t - 2, /*predict=*/true, times);
  } else if (t >= 1) {
    // No stale gradient due (the pipeline started at t - 1, or was drained after t - 1): only the
    // prediction, if L(t-1) is in flight.
    update_stale_range(-1, /*predict=*/true, times);
  }
  if (previous_sync_pending_ && !model_.reports_forward_progress()) apply_sync_buckets(layers_, times);
  next_bucket_ = 0;
  hook_seconds_ = 0;
  stale_submitted_ = single_submitted_ = false;
  if (profiling(t)) std::fill(profile_buffer_.begin(), profile_buffer_.end(), 0.0f);
  hook_exit_ = Clock::now();
  return slots_[t % 2];
}

void SaPipe::forward_needs(std::size_t first, std::size_t end) {
  const Clock::time_point entry = Clock::now();
  if (profiling(iteration_)) {
    // The compute since the previous hook (or the iteration's start: data loading) belongs to the
    // layers forward ran in between: the previous group, or segment 0's share for the first call.
    const double seconds = Seconds(entry - hook_exit_).count();
    const std::size_t group_first = first == 0 ? 0 : last_group_first_;
    const std::size_t group_end = first == 0 ? 1 : first;
    for (std::size_t s = group_first; s < group_end; ++s) {
      profile_buffer_[s] += static_cast<float>(seconds / static_cast<double>(group_end - group_first));
    }
  }
  last_group_first_ = first;
  if (previous_sync_pending_) apply_sync_buckets(end, *times_);
  hook_exit_ = Clock::now();
  hook_seconds_ += Seconds(hook_exit_ - entry).count();
}

void SaPipe::apply_sync_buckets(std::size_t end, IterationTimes& times) {
  // Buckets are in backward order; forward needs them from the last one (lowest segments) up.
  const std::vector<Range>& buckets = partition_.sync_buckets();
  while (previous_sync_applied_ < buckets.size()) {
    const std::size_t index = buckets.size() - 1 - previous_sync_applied_;
    const Range& bucket = buckets[index];
    if (bucket.begin >= end) break;  // forward has not reached it yet
    wait_for(previous_sync_jobs_[index], "the allreduce of a synchronous bucket", iteration_ - 1, times);
    step_synchronous_range(bucket, slots_[(iteration_ - 1) % 2], iteration_ - 1, index, times);
    ++previous_sync_applied_;
  }
  if (previous_sync_applied_ == buckets.size()) previous_sync_pending_ = false;
}

void SaPipe::segment_ready(std::size_t segment, double backward_seconds) {
  if (segment < layers_ && profiling(iteration_)) {
    profile_buffer_[layers_ + segment] += static_cast<float>(backward_seconds);
    if (!first_ready_seen_ && model_.reports_forward_progress()) {
      // Forward ended `backward_seconds` before this first report: the last group's forward.
      const double seconds = std::max(0.0, Seconds(Clock::now() - hook_exit_).count() - backward_seconds);
      for (std::size_t s = last_group_first_; s < layers_; ++s) {
        profile_buffer_[s] += static_cast<float>(seconds / static_cast<double>(layers_ - last_group_first_));
      }
    }
  }
  first_ready_seen_ = true;
  submit_ready(segment);
}

void SaPipe::step_synchronous_range(const Range& range, std::span<const float> slot, std::int64_t gradient_iteration,
                                    std::size_t job_index, IterationTimes& times) {
  if (range.count == 0) return;
  TracedStopwatch update("update");
  if (job_index != kNoFlow) trace_gradient_flow_end(gradient_iteration, job_index);
  optimizer_->set_learning_rate_factor(schedule_.factor(gradient_iteration));
  compensation_.step_synchronous(*optimizer_, model_.parameters(), slot, range.offset, range.count,
                                 partition_may_change());
  times.update += update.stop();
}

void SaPipe::submit_ready(std::size_t lowest_ready_segment) {
  const std::int64_t t = iteration_;
  const auto base = static_cast<std::uint64_t>(t) * (layers_ + 1);
  std::span<float> slot = slots_[t % 2];
  const Range& stale = partition_.stale();
  if (!pipelined(t)) {
    // Synchronous iteration: the whole gradient in one allreduce once backward is done.
    if (lowest_ready_segment == 0 && !single_submitted_) {
      compensation_.record_local_gradient(slot, 0, partition_may_change() ? slot.size() : stale.count, t);
      stale_job_[t % 2] = submit(slot, base, kStaleJob);
      single_submitted_ = true;
    }
    return;
  }
  const std::vector<Range>& buckets = partition_.sync_buckets();
  while (next_bucket_ < buckets.size() && buckets[next_bucket_].begin >= lowest_ready_segment) {
    const Range& bucket = buckets[next_bucket_];
    if (partition_may_change()) compensation_.record_local_gradient(slot, bucket.offset, bucket.count, t);
    sync_jobs_[next_bucket_] = submit(slot.subspan(bucket.offset, bucket.count), base + next_bucket_, next_bucket_);
    ++next_bucket_;
  }
  if (!stale_submitted_ && lowest_ready_segment == 0 && stale.count > 0) {
    compensation_.record_local_gradient(slot, 0, stale.count, t);
    stale_job_[t % 2] = submit(slot.subspan(0, stale.count), base + layers_, kStaleJob);
    stale_job_valid_[t % 2] = true;
    stale_submitted_ = true;
  }
}

void SaPipe::end_iteration(std::int64_t t, IterationTimes& times) {
  next_iteration_ = t + 1;
  // The model's forward time includes the hook's waits and updates, counted in wait and update.
  times.forward = std::max(0.0, times.forward - hook_seconds_);
  submit_ready(0);  // a model that reported no (or not every) segment: send the rest now
  if (!pipelined(t)) {
    // Synchronous: wait for the whole gradient; it is applied at the start of the next iteration.
    wait_for(stale_job_[t % 2], "the allreduce of the gradient", t, times);
    if (profiling(t)) {
      if (!model_.reports_forward_progress()) {
        // No forward reports: spread the time before backward over the layers like their backward.
        const double before_backward =
            std::max(0.0, Seconds(Clock::now() - iteration_start_).count() - times.backward - times.wait);
        double backward = 0;
        for (std::size_t s = 0; s < layers_; ++s) backward += profile_buffer_[layers_ + s];
        for (std::size_t s = 0; s < layers_; ++s) {
          const double share =
              backward > 0 ? profile_buffer_[layers_ + s] / backward : 1.0 / static_cast<double>(layers_);
          profile_buffer_[s] = static_cast<float>(before_backward * share);
        }
      }
      for (std::size_t s = 0; s < layers_; ++s) {
        forward_sums_.add(s, profile_buffer_[s]);
        backward_sums_.add(s, profile_buffer_[layers_ + s]);
      }
      ++profiled_iterations_;
      if (t + 1 == plan_iteration_) plan_from_profile();
    }
    return;
  }
  times.pipelined = true;
  // The synchronous buckets of t are applied in the next forward (or begin_iteration).
  std::swap(sync_jobs_, previous_sync_jobs_);
  previous_sync_applied_ = 0;
  previous_sync_pending_ = !partition_.sync_buckets().empty();
  if (monitor_.watching(t)) check_for_stalls(t, times);
}

void SaPipe::check_for_stalls(std::int64_t t, IterationTimes& times) {
  if (!monitor_.add(t, times.wait, Seconds(Clock::now() - iteration_start_).count(), times.comm)) return;
  TraceArgs stall_args;
  stall_args.iteration = t;
  trace_instant("stall check", kTraceRun, stall_args);
  // Every worker decides from the same sums (one small allreduce), so all keep the same k.
  planning_.sum(std::span<float>(monitor_.sums(), 3), monitor_.next_sequence());
  const StallCheck check =
      monitor_.check(t, partition_.stale_layers(), partition_.predicted_communication(), workers_);
  if (check.stall_fraction <= kStallTolerance) {
    monitor_.passed(check, t);
    return;
  }
  // Plan again with the cost as measured in the pipeline; never fewer stale layers than now + 1.
  // Drain first: apply everything in flight (the model then holds the true weights), then restart
  // the pipeline with the new partition at t + 1.
  const std::size_t stale_layers = partition_.stale_layers();
  finish(times);
  partition_.raise(check.cost_scale);
  if (monitor_.monitoring()) {
    // The history of the newly stale layers was not kept after the first check passed: their
    // local gradients and last step start from zero.
    const Range added = partition_.range(stale_layers, partition_.stale_layers());
    compensation_.forget(added.offset, added.count);
  }
  monitor_.raised(check, t, partition_.stale_layers(), layers_);
  TraceArgs raised;
  raised.iteration = t;
  raised.layer = static_cast<std::int64_t>(partition_.stale_layers());  // the new k
  trace_instant("replan: more stale layers", kTraceRun, raised);
  partition_changed();
  pipeline_start_ = t + 1;
  drained_iteration_ = t;
  previous_sync_pending_ = false;
}

void SaPipe::plan_from_profile() {
  // Every worker averages the same numbers, so every worker computes the same k and plan.
  const double n = static_cast<double>(std::max<std::int64_t>(1, profiled_iterations_));
  for (std::size_t s = 0; s < layers_; ++s) {
    profile_buffer_[s] = static_cast<float>(forward_sums_.sum(s) / n);
    profile_buffer_[layers_ + s] = static_cast<float>(backward_sums_.sum(s) / n);
  }
  const std::size_t first_probe = 2 * layers_;
  const std::vector<double> sizes = cost_probe_sizes(partition_.profile().bytes);
  if (measure_cost_) {
    // The other slot held the gradient applied at the start of this iteration: free until the
    // next backward.
    const std::vector<double> medians =
        measure_allreduce_seconds(*allreduce_, slots_[(iteration_ + 1) % 2], sizes, bytes_per_element_, 3, 1);
    for (int k = 0; k < kCostProbes; ++k) {
      profile_buffer_[first_probe + static_cast<std::size_t>(k)] = static_cast<float>(medians[static_cast<std::size_t>(k)]);
    }
  } else {
    std::fill(profile_buffer_.begin() + static_cast<std::ptrdiff_t>(first_probe), profile_buffer_.end(), 0.0f);
  }
  planning_.sum(profile_buffer_, 0);
  const double workers = workers_;
  StalenessProfile profile = partition_.profile();
  for (std::size_t s = 0; s < layers_; ++s) {
    profile.forward_seconds[s] = profile_buffer_[s] / workers;
    profile.backward_seconds[s] = profile_buffer_[layers_ + s] / workers;
  }
  LinearCost cost = partition_.cost();
  if (measure_cost_) {
    std::vector<double> seconds(kCostProbes);
    for (int k = 0; k < kCostProbes; ++k) {
      seconds[static_cast<std::size_t>(k)] = profile_buffer_[first_probe + static_cast<std::size_t>(k)] / workers;
    }
    cost = fit_measured_cost(sizes, seconds, algorithm_, workers_);
  }
  plan_partition(profile, cost);
}

void SaPipe::plan_partition(const StalenessProfile& profile, const LinearCost& cost) {
  partition_.plan(profile, cost, options_.stale_layers);
  partition_changed();
  TraceArgs planned;
  planned.iteration = iteration_;
  planned.layer = static_cast<std::int64_t>(partition_.stale_layers());  // k
  trace_instant("plan", kTraceRun, planned);
  if (options_.automatic() && partition_.stale_layers() < layers_) {
    monitor_.watch_from(pipeline_start_ + kStallCheckSettle);
  }
}

void SaPipe::update_stale_range(std::int64_t gradient_iteration, bool predict, IterationTimes& times) {
  const std::size_t n = partition_.stale().count;
  if (n == 0) return;
  // The whole time is the update's only without compensation and prediction (as counted below).
  const bool plain_update = compensation_.kind() == Compensation::kNone && compensation_.true_weights().empty();
  TracedStopwatch watch(plain_update ? "update" : "compensation");
  if (gradient_iteration >= 0) trace_gradient_flow_end(gradient_iteration, kStaleJob);
  const bool stale = gradient_iteration >= 0 && pipelined(gradient_iteration);
  const float* const gradient = gradient_iteration >= 0 ? slots_[gradient_iteration % 2].data() : nullptr;
  if (gradient_iteration >= 0) optimizer_->set_learning_rate_factor(schedule_.factor(gradient_iteration));
  compensation_.step_stale(*optimizer_, model_.parameters(), gradient, n, stale);
  if (compensation_.true_weights().empty()) {
    (compensation_.kind() == Compensation::kNone ? times.update : times.compensation) += watch.stop();
    return;
  }
  // Weight prediction: the model computes on predict(X, g~) while a gradient is in flight.
  const std::int64_t t = iteration_;
  if (!predict || !pipelined(t - 1) || t < 1) {
    compensation_.show_true_weights(model_.parameters(), n);
  } else {
    // The prediction anticipates the next update of the stale range, which applies G(t-1).
    optimizer_->set_learning_rate_factor(schedule_.factor(t - 1));
    compensation_.predict(*optimizer_, model_.parameters(), n, t, t >= 2 ? slots_[t % 2].data() : nullptr);
  }
  times.compensation += watch.stop();
}

void SaPipe::finish(IterationTimes& times) {
  times_ = &times;
  const std::int64_t last = next_iteration_ - 1;
  if (last < 0 || drained_iteration_ == last) return;  // nothing in flight
  iteration_ = next_iteration_;  // as if beginning iteration T: applies what T would have applied
  if (!pipelined(last)) {
    update_stale_range(last, /*predict=*/false, times);
    step_synchronous_range(partition_.range(partition_.stale_layers(), layers_), slots_[last % 2], last,
                           whole_gradient_flow(), times);
    return;
  }
  if (previous_sync_pending_) apply_sync_buckets(layers_, times);
  // The stale range: G(T-2) if it was pipelined, then G(T-1), each compensated as usual, no
  // prediction after: the model ends with the true weights.
  for (std::int64_t g = last - 1; g <= last; ++g) {
    if (g < 0 || !pipelined(g) || !stale_job_valid_[g % 2]) continue;
    wait_for(stale_job_[g % 2], "the allreduce of the stale layers", g, times);
    stale_job_valid_[g % 2] = false;
    update_stale_range(g, /*predict=*/false, times);
  }
  const std::span<const float> true_weights = compensation_.true_weights();
  if (!true_weights.empty()) std::copy(true_weights.begin(), true_weights.end(), model_.parameters().begin());
}

std::uint64_t SaPipe::replica_checksum(FlatParameters& model) const {
  const std::span<const float> true_weights = compensation_.true_weights();
  if (true_weights.empty()) return checksum_of(model.parameters());
  const std::span<const float> parameters = model.parameters();
  return checksum_of(true_weights) * 31 + checksum_of(parameters.subspan(true_weights.size()));
}

std::shared_ptr<MethodReport> SaPipe::report() const {
  auto report = std::make_shared<SapipeReport>();
  report->plan = partition_.sync_buckets().empty()
                     ? std::string("(no synchronous layers)")
                     : concat(partition_.plan_name(), ": ", describe_plan(partition_.sync_plan()));
  report->calls = partition_.sync_buckets().size() + (partition_.stale_layers() > 0 ? 1 : 0);
  SapipeFacts& facts = report->facts;
  facts.layers = layers_;
  facts.stale_layers = partition_.stale_layers();
  const std::size_t total = model_.layout().total();
  facts.stale_fraction = total == 0 ? 0.0 : static_cast<double>(partition_.stale().count) / static_cast<double>(total);
  facts.automatic = options_.automatic();
  const StalenessProfile& profile = partition_.profile();
  facts.profiled = std::any_of(profile.backward_seconds.begin(), profile.backward_seconds.end(),
                               [](double b) { return b > 0; });
  if (facts.profiled) {
    facts.paper_stale_layers = partition_.paper_stale_layers();
    facts.predicted_iteration = partition_.staleness_plan().timeline.iteration;
    facts.predicted_stall = partition_.staleness_plan().stalls;
    facts.timeline_stale_layers = partition_.timeline_stale_layers();
    facts.stall_checks = monitor_.checks();
    facts.profile = profile;
    facts.cost = partition_.cost();
  }
  facts.compensation = compensation_name(options_.compensation);
  facts.dc_term = has_dc_term(options_.compensation);
  facts.lambda = options_.lambda;
  facts.dc_bound = options_.dc_bound;
  facts.bounded_compensations = compensation_.bounded_compensations();
  facts.pipeline_start = pipeline_start_;
  // Pipelined iterations ran unless the run ended before the first (a stall check needs them).
  facts.pipelined = next_iteration_ > pipeline_start_ || !monitor_.checks().empty();
  if (!facts.pipelined) {
    report->plan = "(never pipelined: the whole gradient in one allreduce after backward)";
    report->calls = 1;
    facts.stale_layers = 0;
    facts.stale_fraction = 0;
  }
  return report;
}

}  // namespace pipesgd
