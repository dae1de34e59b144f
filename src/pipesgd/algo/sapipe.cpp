#include "pipesgd/algo/sapipe.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "pipesgd/algo/bucketed_dsync.h"
#include "pipesgd/core/error.h"
#include "pipesgd/optim/fused_update.h"

namespace pipesgd {
namespace {

std::int64_t checked_warmup(std::int64_t iterations) {
  if (iterations < 0) throw UsageError(concat("warm-up iterations must be >= 0, got ", iterations));
  return iterations;
}

float checked_lambda(float lambda) {
  if (!(lambda >= 0) || !std::isfinite(lambda)) {
    throw UsageError(concat("--dc-lambda must be >= 0 and finite, got ", lambda));
  }
  return lambda;
}

// The plan of the synchronous layers: --buckets, or the exact optimum by default.
std::string sync_plan_name(const MethodConfig& config) {
  const std::string name = config.buckets.empty() ? "optimal" : config.buckets;
  check_bucket_plan_name(name);
  return name;
}

// Plans that need measured times (the others follow from the layer sizes alone).
bool plan_needs_profile(const std::string& plan) { return plan == "optimal" || plan == "mgwfbp"; }

}  // namespace

std::int64_t sapipe_pipeline_start(const MethodConfig& config) {
  const bool needs_profile = config.stale_layers == "auto" || plan_needs_profile(sync_plan_name(config));
  return needs_profile ? std::max(config.warmup_iterations, kProfileWarmupIterations + config.profile_iterations)
                       : config.warmup_iterations;
}

std::vector<std::string> compensation_names() { return {"none", "dc", "wp1", "wp2", "wp3"}; }

namespace {
// --compensation's value as the enum (declared in the order of compensation_names()).
SaPipe::Compensation parse_compensation(const std::string& name) {
  const std::vector<std::string> names = compensation_names();
  const auto found = std::find(names.begin(), names.end(), name);
  if (found == names.end()) {
    throw UsageError(concat("unknown --compensation '", name, "' (expected ", join(names), ")"));
  }
  return static_cast<SaPipe::Compensation>(found - names.begin());
}
}  // namespace

long parse_stale_layers(const std::string& text, std::size_t layers) {
  if (text == "auto") return -1;
  long value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool parsed = error == std::errc() && end == text.data() + text.size() && value >= 0;
  if (layers == kLayersUnknown) {
    if (!parsed) throw UsageError(concat("--stale-layers must be auto or a layer count >= 0, got '", text, "'"));
  } else if (!parsed || static_cast<std::size_t>(value) > layers) {
    throw UsageError(concat("--stale-layers must be auto or a layer count in [0, ", layers,
                            "] (the model has ", layers, " layers), got '", text, "'"));
  }
  return value;
}

SaPipe::SaPipe(const MethodConfig& config, Model& model, Transport& transport)
    : model_(model),
      transport_(transport),
      layers_(model.layout().segment_count()),
      requested_stale_layers_(parse_stale_layers(config.stale_layers, layers_)),
      plan_name_(sync_plan_name(config)),
      compensation_(parse_compensation(config.compensation)),
      lambda_(checked_lambda(config.delay_compensation.lambda)),
      profile_iterations_(checked_profile_iterations(config.profile_iterations)),
      measure_cost_(config.calibration == nullptr),
      timeout_(config.allreduce.timeout),
      gradient_scale_(1.0f / static_cast<float>(transport.size())),
      cost_(config.bucket_cost),
      codec_(make_codec(config.codec)),
      allreduce_(make_method_allreduce(config, transport, model.layout().total(), *codec_)),
      planning_codec_(make_codec("none")),
      planning_allreduce_(transport, 2 * layers_ + kCostProbes, *planning_codec_, config.allreduce),
      optimizer_(make_optimizer(optimizer_options(config), model.layout())),
      forward_sums_(layers_, 0.0),
      backward_sums_(layers_, 0.0),
      profile_buffer_(2 * layers_ + kCostProbes, 0.0f),
      comm_(transport, "sapipe", layers_ + 3, config.allreduce.timeout, [this](const CommWorker::Job& job) {
        allreduce_->run(job.data, collective_tag(Channel::kGradients, job.sequence));
      }) {
  if (layers_ == 0) throw UsageError("sapipe needs a model with layers");
  checked_warmup(config.warmup_iterations);
  algorithm_ = resolve_allreduce_algorithm(config, transport.size(),
                                           static_cast<double>(model.layout().total()) * sizeof(float));
  bytes_per_element_ = static_cast<double>(codec_->encoded_bytes(1000)) / 1000.0;
  const std::size_t total = model.layout().total();
  for (auto& slot : slots_) slot.assign(total, 0.0f);
  // The compensation history covers the whole buffer: any layer may become stale (at the plan or a
  // stall check), and its local gradients and last step must be known by then.
  if (predicts()) {
    for (auto& local : local_) local.assign(total, 0.0f);
  }
  if (compensation_ == Compensation::kDelay || compensation_ == Compensation::kPredictCombined) {
    last_step_.assign(total, 0.0f);
  }
  for (std::size_t s = 0; s < layers_; ++s) {
    planned_profile_.forward_seconds.push_back(0);
    planned_profile_.backward_seconds.push_back(0);
    planned_profile_.bytes.push_back(static_cast<double>(model.layout().segment(s).count) * bytes_per_element_);
  }
  pipeline_start_ = sapipe_pipeline_start(config);
  if (!(requested_stale_layers_ < 0 || plan_needs_profile(plan_name_))) {
    const auto k = static_cast<std::size_t>(requested_stale_layers_);
    BucketPlan plan;
    if (k < layers_) plan = make_bucket_plan(plan_name_, synchronous_layer_profile(planned_profile_, k), cost_);
    use_stale_layers(k, plan);
  }
  on_segment_ready_ = [this](std::size_t segment, double seconds) { segment_ready(segment, seconds); };
  if (model_.reports_forward_progress()) {
    model_.set_forward_hook([this](std::size_t first, std::size_t end) { forward_needs(first, end); });
  }
}

SaPipe::~SaPipe() {
  if (model_.reports_forward_progress()) model_.set_forward_hook({});
}

SaPipe::Range SaPipe::segment_range(std::size_t begin, std::size_t end) const {
  const Layout& layout = model_.layout();
  Range range{begin, end, 0, 0};
  if (begin < end) {
    range.offset = layout.segment(begin).offset;
    const Segment& last = layout.segment(end - 1);
    range.count = last.offset + last.count - range.offset;
  } else if (begin < layout.segment_count()) {
    range.offset = layout.segment(begin).offset;
  } else {
    range.offset = layout.total();
  }
  return range;
}

void SaPipe::use_stale_layers(std::size_t stale_layers, const BucketPlan& sync_plan) {
  stale_layers_ = stale_layers;
  stale_ = segment_range(0, stale_layers);
  sync_plan_ = sync_plan;
  sync_buckets_.clear();
  if (stale_layers < layers_) {
    for (const Bucket& bucket : sync_plan.buckets) {
      sync_buckets_.push_back(segment_range(stale_layers + bucket.begin, stale_layers + bucket.end));
    }
  }
  sync_jobs_.assign(sync_buckets_.size(), 0);
  previous_sync_jobs_.assign(sync_buckets_.size(), 0);
  // Called between iterations with nothing in flight: the model holds the true weights.
  const std::span<const float> weights = model_.parameters();
  if (predicts()) {
    true_weights_.assign(weights.begin(), weights.begin() + static_cast<std::ptrdiff_t>(stale_.count));
  }
  planned_ = true;
}

std::uint64_t SaPipe::submit(std::span<float> range, std::uint64_t sequence) {
  return comm_.submit({range, sequence, iteration_, 0});
}

double SaPipe::wait_for(std::uint64_t job, const char* what, std::int64_t iteration, IterationTimes& times) {
  Stopwatch waiting;
  const double comm_seconds = comm_.wait(job, what, iteration);
  times.wait += waiting.seconds();
  times.comm += comm_seconds;
  return comm_seconds;
}

bool SaPipe::profiling(std::int64_t t) const {
  return !planned_ && t >= kProfileWarmupIterations && t < kProfileWarmupIterations + profile_iterations_;
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
    step_synchronous_range(segment_range(stale_layers_, layers_), slots_[(t - 1) % 2], times);
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
  if (previous_sync_pending_ && !model_.reports_forward_progress()) {
    apply_sync_buckets(layers_, times);
  }
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
  while (previous_sync_applied_ < sync_buckets_.size()) {
    const std::size_t index = sync_buckets_.size() - 1 - previous_sync_applied_;
    const Range& bucket = sync_buckets_[index];
    if (bucket.begin >= end) break;  // forward has not reached it yet
    wait_for(previous_sync_jobs_[index], "the allreduce of a synchronous bucket", iteration_ - 1, times);
    step_synchronous_range(bucket, slots_[(iteration_ - 1) % 2], times);
    ++previous_sync_applied_;
  }
  if (previous_sync_applied_ == sync_buckets_.size()) previous_sync_pending_ = false;
}

void SaPipe::segment_ready(std::size_t segment, double backward_seconds) {
  if (segment < layers_ && profiling(iteration_)) {
    profile_buffer_[layers_ + segment] += static_cast<float>(backward_seconds);
    if (!first_ready_seen_ && model_.reports_forward_progress()) {
      // Forward ended `backward_seconds` before this first report: the last group's forward.
      const double seconds =
          std::max(0.0, Seconds(Clock::now() - hook_exit_).count() - backward_seconds);
      for (std::size_t s = last_group_first_; s < layers_; ++s) {
        profile_buffer_[s] += static_cast<float>(seconds / static_cast<double>(layers_ - last_group_first_));
      }
    }
  }
  first_ready_seen_ = true;
  submit_ready(segment);
}

bool SaPipe::predicts() const {
  return compensation_ == Compensation::kPredictLocal || compensation_ == Compensation::kPredictSynchronized ||
         compensation_ == Compensation::kPredictCombined;
}

bool SaPipe::partition_may_change() const { return !planned_ || (check_start_ >= 0 && !monitoring_); }

void SaPipe::record_local_gradient(std::span<const float> slot, std::size_t offset, std::size_t count) {
  if (local_[0].empty() || count == 0) return;
  std::copy_n(slot.begin() + static_cast<std::ptrdiff_t>(offset), count,
              local_[iteration_ % 2].begin() + static_cast<std::ptrdiff_t>(offset));
}

void SaPipe::step_synchronous_range(const Range& range, std::span<const float> slot, IterationTimes& times) {
  if (range.count == 0) return;
  Stopwatch update;
  std::span<float> weights = model_.parameters().subspan(range.offset, range.count);
  std::span<const float> gradient = slot.subspan(range.offset, range.count);
  if (last_step_.empty() || !partition_may_change()) {
    optimizer_->step(weights, gradient, gradient_scale_, range.offset);
  } else {
    // These layers may become stale: keep their last step for dc / wp3.
    float* const w = model_.parameters().data();
    float* const step = last_step_.data();
    const float* const g = slot.data();
    const float scale = gradient_scale_;
    fused_update(*optimizer_, range.offset, range.count, /*steps=*/true, [&](std::size_t i, auto& kernel) {
      const float old = w[i];
      w[i] = kernel.step(i, old, g[i] * scale);
      step[i] = w[i] - old;
    });
  }
  times.update += update.seconds();
}

void SaPipe::submit_ready(std::size_t lowest_ready_segment) {
  const std::int64_t t = iteration_;
  const auto base = static_cast<std::uint64_t>(t) * (layers_ + 1);
  std::span<float> slot = slots_[t % 2];
  if (!pipelined(t)) {
    // Synchronous iteration: the whole gradient in one allreduce once backward is done.
    if (lowest_ready_segment == 0 && !single_submitted_) {
      record_local_gradient(slot, 0, partition_may_change() ? slot.size() : stale_.count);
      stale_job_[t % 2] = submit(slot, base);
      single_submitted_ = true;
    }
    return;
  }
  while (next_bucket_ < sync_buckets_.size() && sync_buckets_[next_bucket_].begin >= lowest_ready_segment) {
    const Range& bucket = sync_buckets_[next_bucket_];
    if (partition_may_change()) record_local_gradient(slot, bucket.offset, bucket.count);
    sync_jobs_[next_bucket_] = submit(slot.subspan(bucket.offset, bucket.count), base + next_bucket_);
    ++next_bucket_;
  }
  if (!stale_submitted_ && lowest_ready_segment == 0 && stale_.count > 0) {
    record_local_gradient(slot, 0, stale_.count);
    stale_job_[t % 2] = submit(slot.subspan(0, stale_.count), base + layers_);
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
          const double share = backward > 0 ? profile_buffer_[layers_ + s] / backward : 1.0 / static_cast<double>(layers_);
          profile_buffer_[s] = static_cast<float>(before_backward * share);
        }
      }
      for (std::size_t s = 0; s < layers_; ++s) {
        forward_sums_[s] += profile_buffer_[s];
        backward_sums_[s] += profile_buffer_[layers_ + s];
      }
      ++profiled_iterations_;
      if (t + 1 == kProfileWarmupIterations + profile_iterations_) plan_from_profile();
    }
    return;
  }
  times.pipelined = true;
  // The synchronous buckets of t are applied in the next forward (or begin_iteration).
  std::swap(sync_jobs_, previous_sync_jobs_);
  previous_sync_applied_ = 0;
  previous_sync_pending_ = !sync_buckets_.empty();
  if (check_start_ >= 0 && t >= check_start_) check_for_stalls(t, times);
}

double SaPipe::predicted_communication(const LinearCost& cost) const {
  double seconds = 0;
  const double bytes_per_element = bytes_per_element_;
  auto add = [&](const Range& range) {
    if (range.count > 0) seconds += cost.time(static_cast<double>(range.count) * bytes_per_element);
  };
  add(stale_);
  for (const Range& bucket : sync_buckets_) add(bucket);
  return seconds;
}

void SaPipe::check_for_stalls(std::int64_t t, IterationTimes& times) {
  check_wait_ += times.wait;
  check_iteration_ += Seconds(Clock::now() - iteration_start_).count();
  check_comm_ += times.comm;
  if (t + 1 < check_start_ + kStallCheckIterations) return;
  // Every worker decides from the same sums (one small allreduce), so all keep the same k.
  float sums[3] = {static_cast<float>(check_wait_), static_cast<float>(check_iteration_),
                   static_cast<float>(check_comm_)};
  planning_allreduce_.run(std::span<float>(sums, 3),
                          collective_tag(Channel::kPlanning, static_cast<std::uint64_t>(1 + checks_made_++)));
  check_wait_ = check_iteration_ = check_comm_ = 0;
  StallCheck check;
  check.iteration = t;
  check.stale_layers = stale_layers_;
  check.stall_fraction = sums[1] > 0 ? sums[0] / sums[1] : 0.0;
  const double modelled = predicted_communication(cost_) * kStallCheckIterations * transport_.size();
  check.cost_scale = modelled > 0 ? std::max(1.0, static_cast<double>(sums[2]) / modelled) : 1.0;
  check.next_stale_layers = stale_layers_;
  if (check.stall_fraction <= kStallTolerance) {
    // Kept. Reported once per k; the run goes on being watched, window after window.
    if (stall_checks_.empty() || stall_checks_.back().next_stale_layers != stale_layers_ ||
        stall_checks_.back().stale_layers != stale_layers_) {
      stall_checks_.push_back(check);
    }
    monitoring_ = true;
    check_start_ = t + 1;
    return;
  }
  // Plan again with the cost as measured in the pipeline; never fewer stale layers than now + 1.
  const LinearCost scaled{cost_.a * check.cost_scale, cost_.b * check.cost_scale};
  StalenessPlan plan = plan_partial_staleness(planned_profile_, scaled, plan_name_);
  if (plan.stale_layers <= stale_layers_) {
    plan.stale_layers = stale_layers_ + 1;
    plan.sync_plan = {};
    if (plan.stale_layers < layers_) {
      plan.sync_plan = make_bucket_plan(plan_name_, synchronous_layer_profile(planned_profile_, plan.stale_layers), scaled);
    }
    plan.timeline = simulate_bucketed_staleness(planned_profile_, scaled, plan.stale_layers, plan.sync_plan);
    plan.stalls = plan.timeline.stalls;
  }
  check.next_stale_layers = plan.stale_layers;
  stall_checks_.push_back(check);
  // Drain: apply everything in flight (the model then holds the true weights), then restart the
  // pipeline with the new partition at t + 1.
  finish(times);
  if (monitoring_) {
    // The history of the newly stale layers was not kept after the first check passed: their
    // local gradients and last step start from zero.
    const Range added = segment_range(stale_layers_, plan.stale_layers);
    for (auto& local : local_) {
      if (!local.empty()) std::fill_n(local.begin() + static_cast<std::ptrdiff_t>(added.offset), added.count, 0.0f);
    }
    if (!last_step_.empty()) {
      std::fill_n(last_step_.begin() + static_cast<std::ptrdiff_t>(added.offset), added.count, 0.0f);
    }
  }
  cost_ = scaled;
  staleness_plan_ = plan;
  use_stale_layers(plan.stale_layers, plan.sync_plan);
  pipeline_start_ = t + 1;
  drained_iteration_ = t;
  previous_sync_pending_ = false;
  check_start_ = stale_layers_ < layers_ ? t + 1 + 2 : -1;
}

void SaPipe::plan_from_profile() {
  // Every worker averages the same numbers, so every worker computes the same k and plan.
  const double n = static_cast<double>(std::max<std::int64_t>(1, profiled_iterations_));
  for (std::size_t s = 0; s < layers_; ++s) {
    profile_buffer_[s] = static_cast<float>(forward_sums_[s] / n);
    profile_buffer_[layers_ + s] = static_cast<float>(backward_sums_[s] / n);
  }
  const std::size_t first_probe = 2 * layers_;
  LayerProfile sizes_profile;
  sizes_profile.bytes = planned_profile_.bytes;
  sizes_profile.backward_seconds.assign(layers_, 0.0);
  const std::vector<double> sizes = cost_probe_sizes(sizes_profile);
  if (measure_cost_) {
    // The other slot held the gradient applied at the start of this iteration: free until the
    // next backward.
    const std::vector<double> medians = measure_allreduce_seconds(
        *allreduce_, slots_[(iteration_ + 1) % 2], sizes, bytes_per_element_, 3, 1);
    for (int k = 0; k < kCostProbes; ++k) {
      profile_buffer_[first_probe + static_cast<std::size_t>(k)] = static_cast<float>(medians[static_cast<std::size_t>(k)]);
    }
  } else {
    std::fill(profile_buffer_.begin() + static_cast<std::ptrdiff_t>(first_probe), profile_buffer_.end(), 0.0f);
  }
  planning_allreduce_.run(profile_buffer_, collective_tag(Channel::kPlanning, 0));
  const double workers = transport_.size();
  for (std::size_t s = 0; s < layers_; ++s) {
    planned_profile_.forward_seconds[s] = profile_buffer_[s] / workers;
    planned_profile_.backward_seconds[s] = profile_buffer_[layers_ + s] / workers;
  }
  if (measure_cost_) {
    std::vector<double> seconds(kCostProbes);
    for (int k = 0; k < kCostProbes; ++k) {
      seconds[static_cast<std::size_t>(k)] = profile_buffer_[first_probe + static_cast<std::size_t>(k)] / workers;
    }
    cost_ = fit_measured_cost(sizes, seconds, algorithm_, transport_.size());
  }
  paper_stale_layers_ = paper_stale_layers(planned_profile_, cost_);
  if (requested_stale_layers_ < 0) {
    staleness_plan_ = plan_partial_staleness(planned_profile_, cost_, plan_name_);
    use_stale_layers(staleness_plan_.stale_layers, staleness_plan_.sync_plan);
    timeline_stale_layers_ = stale_layers_;
    if (stale_layers_ < layers_) check_start_ = pipeline_start_ + 2;
  } else {
    const auto k = static_cast<std::size_t>(requested_stale_layers_);
    BucketPlan plan;
    if (k < layers_) plan = make_bucket_plan(plan_name_, synchronous_layer_profile(planned_profile_, k), cost_);
    staleness_plan_.stale_layers = k;
    staleness_plan_.sync_plan = plan;
    staleness_plan_.timeline = simulate_bucketed_staleness(planned_profile_, cost_, k, plan);
    staleness_plan_.stalls = staleness_plan_.timeline.stalls;
    use_stale_layers(k, plan);
  }
}

float SaPipe::bounded_projection(double dot) {
  const double bound = kDelayCompensationBound / std::max(static_cast<double>(lambda_), 1e-30);
  if (std::fabs(dot) <= bound) return static_cast<float>(dot);
  ++bounded_compensations_;
  return static_cast<float>(dot > 0 ? bound : -bound);
}

void SaPipe::update_stale_range(std::int64_t gradient_iteration, bool predict, IterationTimes& times) {
  const std::size_t n = stale_.count;
  if (n == 0) return;
  const bool predicts = !true_weights_.empty();
  const bool stale = gradient_iteration >= 0 && pipelined(gradient_iteration);
  Stopwatch watch;
  float* const model_weights = model_.parameters().data();
  float* const weights = predicts ? true_weights_.data() : model_weights;
  const float* const gradient = gradient_iteration >= 0 ? slots_[gradient_iteration % 2].data() : nullptr;
  float* const step = last_step_.empty() ? nullptr : last_step_.data();
  const float scale = gradient_scale_, lambda = lambda_;
  Optimizer& optimizer = *optimizer_;

  // The true step. Synchronous gradients (warm-up, profiling) and every mode but dc step plainly.
  if (gradient != nullptr) {
    if (compensation_ == Compensation::kDelay && stale) {
      // g . D over the whole stale range (Eq. 1's scalar).
      const double dot = sum_terms(n, [&](std::size_t i) { return static_cast<double>(gradient[i] * scale) * step[i]; });
      const float projection = bounded_projection(dot);
      fused_update(optimizer, 0, n, /*steps=*/true, [&](std::size_t i, auto& kernel) {
        const float g = gradient[i] * scale;
        const float old = weights[i];
        weights[i] = kernel.step(i, old, g + lambda * g * projection);
        step[i] = weights[i] - old;
      });
    } else if (step != nullptr) {
      fused_update(optimizer, 0, n, /*steps=*/true, [&](std::size_t i, auto& kernel) {
        const float old = weights[i];
        weights[i] = kernel.step(i, old, gradient[i] * scale);
        step[i] = weights[i] - old;
      });
    } else {
      fused_update(optimizer, 0, n, /*steps=*/true, [&](std::size_t i, auto& kernel) {
        weights[i] = kernel.step(i, weights[i], gradient[i] * scale);
      });
    }
  }
  if (!predicts) {
    if (compensation_ == Compensation::kNone) {
      times.update += watch.seconds();
    } else {
      times.compensation += watch.seconds();
    }
    return;
  }

  // Weight prediction: the model computes on predict(X, g~) while a gradient is in flight.
  const std::int64_t t = iteration_;
  if (!predict || !pipelined(t - 1) || t < 1) {
    std::copy_n(weights, n, model_weights);
    times.compensation += watch.seconds();
    return;
  }
  const float* const local_previous = local_[(t - 1) % 2].data();   // L(t-1)
  const float* const local_before = t >= 2 ? local_[t % 2].data() : nullptr;  // L(t-2)
  const float* const synchronized = t >= 2 ? slots_[t % 2].data() : nullptr;  // G(t-2)
  switch (compensation_) {
    case Compensation::kPredictLocal:
      fused_update(optimizer, 0, n, /*steps=*/false, [&](std::size_t i, auto& kernel) {
        model_weights[i] = kernel.predict(i, weights[i], local_previous[i]);
      });
      break;
    case Compensation::kPredictSynchronized:
      fused_update(optimizer, 0, n, /*steps=*/false, [&](std::size_t i, auto& kernel) {
        model_weights[i] = kernel.predict(i, weights[i], synchronized ? synchronized[i] * scale : 0.0f);
      });
      break;
    case Compensation::kPredictCombined: {
      // h = G(t-2)/n - L(t-2)/n: the other workers' part of the latest synchronized gradient.
      const double dot = synchronized == nullptr ? 0.0 : sum_terms(n, [&](std::size_t i) {
        return static_cast<double>(synchronized[i] * scale - local_before[i] * scale) * step[i];
      });
      const float projection = bounded_projection(dot);
      fused_update(optimizer, 0, n, /*steps=*/false, [&](std::size_t i, auto& kernel) {
        const float h = synchronized ? synchronized[i] * scale - local_before[i] * scale : 0.0f;
        model_weights[i] = kernel.predict(i, weights[i], h + lambda * h * projection + local_previous[i] * scale);
      });
      break;
    }
    default:
      PIPESGD_ASSERT(false);
  }
  times.compensation += watch.seconds();
}

void SaPipe::finish(IterationTimes& times) {
  times_ = &times;
  const std::int64_t last = next_iteration_ - 1;
  if (last < 0 || drained_iteration_ == last) return;  // nothing in flight
  iteration_ = next_iteration_;  // as if beginning iteration T: applies what T would have applied
  if (!pipelined(last)) {
    update_stale_range(last, /*predict=*/false, times);
    step_synchronous_range(segment_range(stale_layers_, layers_), slots_[last % 2], times);
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
  if (!true_weights_.empty()) {
    std::copy(true_weights_.begin(), true_weights_.end(), model_.parameters().begin());
  }
}

void SaPipe::save_state(CheckpointWriter& out) {
  comm_.drain("its allreduces in flight before a checkpoint");
  optimizer_->save_state(out, "method.");
  const std::string prefix = "method.sapipe.";
  out.add_int(prefix + "layers", static_cast<std::int64_t>(layers_));
  out.add_int(prefix + "requested_stale_layers", requested_stale_layers_);
  out.add_int(prefix + "compensation", static_cast<std::int64_t>(compensation_));
  out.add_int(prefix + "profile_iterations", profile_iterations_);
  out.add_int(prefix + "planned", planned_ ? 1 : 0);
  out.add_int(prefix + "stale_layers", static_cast<std::int64_t>(stale_layers_));
  if (planned_) save_bucket_plan(out, prefix + "sync_plan.", sync_plan_);
  out.add_int(prefix + "pipeline_start", pipeline_start_);
  out.add_int(prefix + "drained_iteration", drained_iteration_);
  out.add_int(prefix + "check_start", check_start_);
  out.add_int(prefix + "checks_made", checks_made_);
  out.add_int(prefix + "monitoring", monitoring_ ? 1 : 0);
  out.add_int(prefix + "timeline_stale_layers", static_cast<std::int64_t>(timeline_stale_layers_));
  out.add_int(prefix + "paper_stale_layers",
              paper_stale_layers_ ? static_cast<std::int64_t>(*paper_stale_layers_) : -1);
  out.add_int(prefix + "bounded_compensations", bounded_compensations_);
  out.add_int(prefix + "profiled_iterations", profiled_iterations_);
  out.add_int(prefix + "stale_job_valid0", stale_job_valid_[0] ? 1 : 0);
  out.add_int(prefix + "stale_job_valid1", stale_job_valid_[1] ? 1 : 0);
  out.add_int(prefix + "previous_sync_pending", previous_sync_pending_ ? 1 : 0);
  const double scalars[] = {cost_.a, cost_.b, check_wait_, check_iteration_, check_comm_,
                            staleness_plan_.timeline.iteration, staleness_plan_.timeline.compute,
                            staleness_plan_.timeline.wait, staleness_plan_.stalls ? 1.0 : 0.0,
                            staleness_plan_.timeline.stalls ? 1.0 : 0.0};
  save_doubles(out, prefix + "scalars", scalars);
  save_doubles(out, prefix + "planned_forward_seconds", planned_profile_.forward_seconds);
  save_doubles(out, prefix + "planned_backward_seconds", planned_profile_.backward_seconds);
  save_doubles(out, prefix + "forward_sums", forward_sums_);
  save_doubles(out, prefix + "backward_sums", backward_sums_);
  std::vector<double> checks;
  for (const StallCheck& check : stall_checks_) {
    checks.insert(checks.end(), {static_cast<double>(check.iteration), static_cast<double>(check.stale_layers),
                                 check.stall_fraction, check.cost_scale, static_cast<double>(check.next_stale_layers)});
  }
  save_doubles(out, prefix + "stall_checks", checks);
  out.add(prefix + "slot0", std::span<const float>(slots_[0]));
  out.add(prefix + "slot1", std::span<const float>(slots_[1]));
  out.add(prefix + "local0", std::span<const float>(local_[0]));
  out.add(prefix + "local1", std::span<const float>(local_[1]));
  out.add(prefix + "true_weights", std::span<const float>(true_weights_));
  out.add(prefix + "last_step", std::span<const float>(last_step_));
}

void SaPipe::load_state(const CheckpointReader& in, std::int64_t next_iteration) {
  optimizer_->load_state(in, "method.");
  const std::string prefix = "method.sapipe.";
  auto refuse = [&](const std::string& why) { return DataError(concat("checkpoint '", in.origin(), "': ", why)); };
  auto integer = [&](const char* name) { return in.integer(prefix + name); };
  auto flag = [&](const char* name) {
    const std::int64_t value = integer(name);
    if (value != 0 && value != 1) throw refuse(concat("section '", prefix, name, "' is ", value, ", not 0 or 1"));
    return value == 1;
  };
  auto stale_layers_text = [](std::int64_t value) { return value < 0 ? std::string("auto") : concat(value); };
  // What this run was configured with.
  if (integer("layers") != static_cast<std::int64_t>(layers_)) {
    throw refuse(concat("written for a model of ", integer("layers"), " layers, this one has ", layers_));
  }
  if (integer("requested_stale_layers") != requested_stale_layers_) {
    throw refuse(concat("written with --stale-layers ", stale_layers_text(integer("requested_stale_layers")),
                        ", this run has ", stale_layers_text(requested_stale_layers_)));
  }
  const std::vector<std::string> compensations = compensation_names();
  const std::int64_t compensation = integer("compensation");
  if (compensation != static_cast<std::int64_t>(compensation_)) {
    const bool known = compensation >= 0 && compensation < static_cast<std::int64_t>(compensations.size());
    throw refuse(concat("written with --compensation ",
                        known ? compensations[static_cast<std::size_t>(compensation)] : concat("#", compensation),
                        ", this run has ", compensations[static_cast<std::size_t>(compensation_)]));
  }
  if (integer("profile_iterations") != profile_iterations_) {
    throw refuse(concat("written with --profile-iters ", integer("profile_iterations"), ", this run has ",
                        profile_iterations_));
  }
  // The partition and the iteration it was saved at.
  const bool automatic = requested_stale_layers_ < 0;
  const bool planned = flag("planned");
  const bool planned_at_construction = planned_;
  const std::int64_t plan_iteration = kProfileWarmupIterations + profile_iterations_;  // planned from then on
  if (planned != (planned_at_construction || next_iteration >= plan_iteration)) {
    throw refuse(concat(planned ? "planned" : "not planned", " before iteration ", next_iteration,
                        " (the plan is made before iteration ", plan_iteration, ")"));
  }
  const std::int64_t stale_layers = integer("stale_layers");
  if (stale_layers < 0 || stale_layers > static_cast<std::int64_t>(layers_) || (!planned && stale_layers != 0) ||
      (planned && !automatic && stale_layers != requested_stale_layers_)) {
    throw refuse(concat("k = ", stale_layers, " stale layers, which this run (--stale-layers ",
                        stale_layers_text(requested_stale_layers_), ", a model of ", layers_,
                        " layers) cannot have"));
  }
  const auto k = static_cast<std::size_t>(stale_layers);
  BucketPlan sync_plan;
  if (planned) sync_plan = load_bucket_plan(in, prefix + "sync_plan.", layers_ - k);
  const std::int64_t pipeline_start = integer("pipeline_start");
  const std::int64_t drained_iteration = integer("drained_iteration");
  // The pipeline starts where this run's configuration says, or later where a stall check of
  // --stale-layers auto drained and restarted it (after the previous iteration).
  const bool restarted = automatic && drained_iteration >= 0 && drained_iteration == pipeline_start - 1 &&
                         pipeline_start > pipeline_start_ && pipeline_start <= next_iteration;
  if (!(pipeline_start == pipeline_start_ && drained_iteration == -1) && !restarted) {
    throw refuse(concat("pipeline started at iteration ", pipeline_start, " (drained after ", drained_iteration,
                        "), this run starts it at ", pipeline_start_, " and resumes at ", next_iteration));
  }
  const std::int64_t check_start = integer("check_start");
  const std::int64_t checks_made = integer("checks_made");
  if (check_start < -1 || (check_start >= 0 && (!automatic || check_start > next_iteration + 2)) || checks_made < 0 ||
      checks_made > next_iteration) {
    throw refuse(concat("stall check state (window from ", check_start, ", ", checks_made,
                        " checks) impossible before iteration ", next_iteration));
  }
  const std::int64_t timeline_stale_layers = integer("timeline_stale_layers");
  const std::int64_t paper = integer("paper_stale_layers");
  if (timeline_stale_layers < 0 || timeline_stale_layers > stale_layers || paper < -1 ||
      paper > static_cast<std::int64_t>(layers_)) {
    throw refuse(concat("k from the timeline ", timeline_stale_layers, " / the paper's ", paper, " with k = ",
                        stale_layers, " of ", layers_, " layers"));
  }
  const std::int64_t profiled_iterations = integer("profiled_iterations");
  const std::int64_t bounded_compensations = integer("bounded_compensations");
  if (profiled_iterations < 0 || profiled_iterations > profile_iterations_ || bounded_compensations < 0) {
    throw refuse(concat(profiled_iterations, " profiled iterations, ", bounded_compensations, " bounded compensations"));
  }
  // Reduced stale gradients still to apply: G(g) in slot g % 2 for pipelined g in [next - 2, next).
  const Range stale_range = segment_range(0, k);
  bool stale_valid[2];
  for (int slot = 0; slot < 2; ++slot) {
    stale_valid[slot] = flag(slot == 0 ? "stale_job_valid0" : "stale_job_valid1");
    const std::int64_t g = (next_iteration - 1) % 2 == slot ? next_iteration - 1 : next_iteration - 2;
    if (stale_valid[slot] && (g < pipeline_start || stale_range.count == 0)) {
      throw refuse(concat("slot ", slot, " holds a stale gradient of iteration ", g,
                          ", which is not pipelined with k = ", k, " (pipeline start ", pipeline_start, ")"));
    }
  }
  const bool sync_pending = flag("previous_sync_pending");
  if (sync_pending && (next_iteration - 1 < pipeline_start || k == layers_)) {
    throw refuse(concat("synchronous buckets of iteration ", next_iteration - 1, " pending, which is not pipelined"));
  }
  const std::vector<double> scalars = load_doubles(in, prefix + "scalars", 10);
  const std::vector<double> planned_forward = load_doubles(in, prefix + "planned_forward_seconds", layers_);
  const std::vector<double> planned_backward = load_doubles(in, prefix + "planned_backward_seconds", layers_);
  const std::vector<double> forward_sums = load_doubles(in, prefix + "forward_sums", layers_);
  const std::vector<double> backward_sums = load_doubles(in, prefix + "backward_sums", layers_);
  const std::size_t check_values = in.bytes(prefix + "stall_checks").size() / sizeof(double);
  if (check_values % 5 != 0) throw refuse(concat("stall checks of ", check_values, " values"));
  const std::vector<double> checks = load_doubles(in, prefix + "stall_checks", check_values);
  for (std::size_t c = 0; c < checks.size(); c += 5) {
    const auto layer_count = static_cast<double>(layers_);
    if (checks[c] < 0 || checks[c] >= static_cast<double>(next_iteration) || checks[c + 1] < 0 ||
        checks[c + 1] > layer_count || checks[c + 4] < 0 || checks[c + 4] > layer_count) {
      throw refuse(concat("stall check ", c / 5, " (iteration ", checks[c], ", k ", checks[c + 1], " -> ",
                          checks[c + 4], ") impossible before iteration ", next_iteration));
    }
  }
  // The buffers: each as large as this run keeps it.
  auto load_buffer = [&](const char* name, std::vector<float>& buffer) {
    const std::span<const float> values = in.floats(prefix + name);
    if (values.size() != buffer.size()) {
      throw refuse(concat("section '", prefix, name, "' holds ", values.size(), " values, this run keeps ",
                          buffer.size()));
    }
    std::copy(values.begin(), values.end(), buffer.begin());
  };
  load_buffer("slot0", slots_[0]);
  load_buffer("slot1", slots_[1]);
  load_buffer("local0", local_[0]);
  load_buffer("local1", local_[1]);
  load_buffer("last_step", last_step_);

  // Everything read is valid: restore.
  if (planned) use_stale_layers(k, sync_plan);  // sizes true_weights_ for the stale range
  planned_ = planned;
  load_buffer("true_weights", true_weights_);
  pipeline_start_ = pipeline_start;
  drained_iteration_ = drained_iteration;
  check_start_ = check_start;
  checks_made_ = checks_made;
  monitoring_ = flag("monitoring");
  timeline_stale_layers_ = static_cast<std::size_t>(timeline_stale_layers);
  paper_stale_layers_ = paper < 0 ? std::nullopt : std::optional<std::size_t>(static_cast<std::size_t>(paper));
  bounded_compensations_ = bounded_compensations;
  profiled_iterations_ = profiled_iterations;
  cost_ = LinearCost{scalars[0], scalars[1]};
  check_wait_ = scalars[2];
  check_iteration_ = scalars[3];
  check_comm_ = scalars[4];
  staleness_plan_.stale_layers = k;
  staleness_plan_.sync_plan = sync_plan;
  staleness_plan_.timeline.iteration = scalars[5];
  staleness_plan_.timeline.compute = scalars[6];
  staleness_plan_.timeline.wait = scalars[7];
  staleness_plan_.stalls = scalars[8] != 0;
  staleness_plan_.timeline.stalls = scalars[9] != 0;
  planned_profile_.forward_seconds = planned_forward;
  planned_profile_.backward_seconds = planned_backward;
  forward_sums_ = forward_sums;
  backward_sums_ = backward_sums;
  stall_checks_.clear();
  for (std::size_t c = 0; c < checks.size(); c += 5) {
    StallCheck check;
    check.iteration = static_cast<std::int64_t>(checks[c]);
    check.stale_layers = static_cast<std::size_t>(checks[c + 1]);
    check.stall_fraction = checks[c + 2];
    check.cost_scale = checks[c + 3];
    check.next_stale_layers = static_cast<std::size_t>(checks[c + 4]);
    stall_checks_.push_back(check);
  }
  // The reduced gradients still to apply, as jobs already done.
  for (int slot = 0; slot < 2; ++slot) {
    stale_job_valid_[slot] = stale_valid[slot];
    if (stale_valid[slot]) stale_job_[slot] = comm_.completed_ticket();
  }
  previous_sync_pending_ = sync_pending;
  previous_sync_applied_ = 0;
  if (sync_pending) {
    for (std::uint64_t& job : previous_sync_jobs_) job = comm_.completed_ticket();
  }
  next_iteration_ = next_iteration;
}

std::uint64_t SaPipe::replica_checksum(Model& model) const {
  if (true_weights_.empty()) return checksum_of(model.parameters());
  const std::span<const float> parameters = model.parameters();
  return checksum_of(true_weights_) * 31 + checksum_of(parameters.subspan(true_weights_.size()));
}

MethodReport SaPipe::report() const {
  MethodReport report;
  report.plan = sync_buckets_.empty() ? std::string("(no synchronous layers)")
                                      : concat(plan_name_, ": ", describe_plan(sync_plan_));
  report.allreduce_calls = sync_buckets_.size() + (stale_layers_ > 0 ? 1 : 0);
  SapipeReport sapipe;
  sapipe.layers = layers_;
  sapipe.stale_layers = stale_layers_;
  sapipe.stale_fraction = model_.layout().total() == 0
                              ? 0.0
                              : static_cast<double>(stale_.count) / static_cast<double>(model_.layout().total());
  sapipe.automatic = requested_stale_layers_ < 0;
  sapipe.profiled = std::any_of(planned_profile_.backward_seconds.begin(),
                                planned_profile_.backward_seconds.end(), [](double b) { return b > 0; });
  if (sapipe.profiled) {
    sapipe.paper_stale_layers = paper_stale_layers_;
    sapipe.predicted_iteration = staleness_plan_.timeline.iteration;
    sapipe.predicted_stall = staleness_plan_.stalls;
    sapipe.timeline_stale_layers = timeline_stale_layers_;
    sapipe.stall_checks = stall_checks_;
    sapipe.profile = planned_profile_;
    sapipe.cost = cost_;
  }
  sapipe.compensation = compensation_names()[static_cast<std::size_t>(compensation_)];
  sapipe.bounded_compensations = bounded_compensations_;
  sapipe.pipeline_start = pipeline_start_;
  report.sapipe = sapipe;
  return report;
}

}  // namespace pipesgd
