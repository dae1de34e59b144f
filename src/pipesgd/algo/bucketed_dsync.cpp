#include "pipesgd/algo/bucketed_dsync.h"

#include <algorithm>
#include <cmath>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/thread_priority.h"

namespace pipesgd {
namespace {

std::int64_t checked_replan_every(std::int64_t every) {
  if (every < 0) throw UsageError(concat("--replan-every must be >= 0 (0: never), got ", every));
  return every;
}

// A zero-cost profile of `layers` layers: the plan computed before any measurement.
LayerProfile empty_profile(const Layout& layout, double bytes_per_element) {
  LayerProfile profile;
  for (const Segment& segment : layout.segments()) {
    profile.bytes.push_back(static_cast<double>(segment.count) * bytes_per_element);
    profile.backward_seconds.push_back(0);
  }
  return profile;
}

}  // namespace

std::int64_t checked_profile_iterations(std::int64_t iterations) {
  if (iterations < 1) throw UsageError(concat("--profile-iters must be >= 1, got ", iterations));
  return iterations;
}

std::vector<double> cost_probe_sizes(const LayerProfile& profile) {
  double smallest = 0, total = 0;
  for (double bytes : profile.bytes) {
    total += bytes;
    if (bytes > 0 && (smallest == 0 || bytes < smallest)) smallest = bytes;
  }
  smallest = std::max(smallest, 4096.0);
  total = std::max(total, smallest);
  std::vector<double> sizes;
  for (int k = 0; k < kCostProbes; ++k) {
    const double fraction = static_cast<double>(k) / (kCostProbes - 1);
    const double bytes = smallest * std::pow(total / smallest, fraction);
    sizes.push_back(std::max(4.0, std::floor(bytes / 4.0) * 4.0));
  }
  return sizes;
}

std::vector<double> measure_allreduce_seconds(Allreduce& allreduce, std::span<float> scratch,
                                              std::span<const double> sizes, double bytes_per_element,
                                              int repeats, std::uint64_t sequence_base) {
  std::vector<double> medians;
  std::vector<double> runs(static_cast<std::size_t>(repeats));
  std::uint64_t sequence = sequence_base;
  for (double bytes : sizes) {
    const auto count = std::min(scratch.size(), static_cast<std::size_t>(bytes / bytes_per_element));
    for (int r = 0; r < repeats; ++r) {
      Stopwatch run;
      allreduce.run(scratch.first(count), collective_tag(Channel::kPlanning, sequence++));
      runs[static_cast<std::size_t>(r)] = run.seconds();
    }
    std::sort(runs.begin(), runs.end());
    medians.push_back(runs[runs.size() / 2]);
  }
  return medians;
}

LinearCost fit_measured_cost(std::span<const double> sizes, std::span<const double> seconds,
                             const std::string& algorithm, int workers) {
  if (workers < 2) return LinearCost{};  // one rank: the allreduce is free
  std::vector<TimingSample> samples;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    samples.push_back({algorithm, workers, sizes[k], std::max(seconds[k], 1e-9)});
  }
  try {
    return fit_linear_cost(samples);
  } catch (const DataError&) {  // e.g. a one-layer model: all probe sizes equal
    return LinearCost{seconds.empty() ? 0.0 : seconds.back(), 0.0};
  }
}

BucketedDSync::BucketedDSync(const MethodConfig& config, Model& model, Transport& transport)
    : model_(model),
      transport_(transport),
      plan_name_(config.buckets),
      cost_(config.bucket_cost),
      measure_cost_(config.calibration == nullptr),
      profile_iterations_(checked_profile_iterations(config.profile_iterations)),
      replan_every_(checked_replan_every(config.replan_every)),
      timeout_(config.allreduce.timeout),
      layers_(model.layout().segment_count()),
      codec_(make_codec(config.codec)),
      allreduce_(make_method_allreduce(config, transport, model.layout().total(), *codec_)),
      planning_codec_(make_codec("none")),
      planning_allreduce_(transport, layers_ + 3 + kCostProbes, *planning_codec_, config.allreduce),
      optimizer_(make_optimizer(optimizer_options(config), model.layout())),
      gradients_(model.layout().total()),
      backward_sums_(layers_, 0.0),
      profile_buffer_(layers_ + 3 + kCostProbes, 0.0f) {
  algorithm_ = resolve_allreduce_algorithm(config, transport.size(),
                                           static_cast<double>(model.layout().total()) * sizeof(float));
  if (layers_ == 0) throw UsageError("layer-wise communication needs a model with layers");
  bytes_per_element_ = static_cast<double>(codec_->encoded_bytes(1000)) / 1000.0;
  planned_profile_ = empty_profile(model.layout(), bytes_per_element_);
  make_bucket_plan(plan_name_, planned_profile_, cost_);  // an unknown plan fails here, not later
  chosen_plan_ = plan_ = single_plan(layers_);            // until the first plan
  on_segment_ready_ = [this](std::size_t segment, double seconds) { segment_ready(segment, seconds); };
  comm_thread_ = std::thread([this] { comm_loop(); });
}

BucketedDSync::~BucketedDSync() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  bucket_submitted_.notify_all();
  comm_thread_.join();
}

void BucketedDSync::comm_loop() {
  if (transport_.waits_sleep()) raise_communication_thread_priority();
  for (;;) {
    std::size_t bucket_index;
    std::int64_t iteration;
    {
      std::unique_lock lock(mutex_);
      bucket_submitted_.wait(lock, [&] { return stopping_ || submitted_ > reduced_; });
      if (stopping_) return;
      bucket_index = reduced_;
      iteration = iteration_;
    }
    // The plan and the gradient range of a submitted bucket do not change until it is reduced.
    const Bucket& bucket = plan_.buckets[bucket_index];
    const Layout& layout = model_.layout();
    const std::size_t begin = layout.segment(bucket.begin).offset;
    const Segment& last = layout.segment(bucket.end - 1);
    const std::span<float> range(gradients_.data() + begin, last.offset + last.count - begin);
    const auto sequence = static_cast<std::uint64_t>(iteration) * layers_ + bucket_index;
    Stopwatch communication;
    std::exception_ptr failure;
    try {
      allreduce_->run(range, collective_tag(Channel::kGradients, sequence));
    } catch (const std::exception& error) {
      failure = std::current_exception();
      transport_.report_failure(error.what());
    }
    {
      std::lock_guard lock(mutex_);
      comm_seconds_ += communication.seconds();
      ++reduced_;
      if (failure && !comm_failure_) comm_failure_ = failure;
    }
    bucket_reduced_.notify_all();
    if (failure) return;
  }
}

std::span<float> BucketedDSync::begin_iteration(std::int64_t t, IterationTimes&) {
  iteration_start_ = Clock::now();
  // The plan of this iteration (the comm thread is idle: the last iteration waited for it). It is
  // copied only when it changes, so the steady state does not allocate.
  PlanInUse wanted = PlanInUse::kChosen;
  if (t >= cycle_start_ && t < cycle_start_ + profile_iterations_) {
    wanted = in_single_phase(t) ? PlanInUse::kSingle : PlanInUse::kOnePerLayer;
  }
  if (wanted != plan_in_use_ || (wanted == PlanInUse::kChosen && plan_version_ != plans_made_)) {
    plan_ = wanted == PlanInUse::kSingle        ? single_plan(layers_)
            : wanted == PlanInUse::kOnePerLayer ? wfbp_plan(layers_)
                                                : chosen_plan_;
    plan_in_use_ = wanted;
    plan_version_ = plans_made_;
  }
  {
    std::lock_guard lock(mutex_);  // the comm thread is idle: the last iteration waited for it
    iteration_ = t;
    submitted_ = reduced_ = 0;
    comm_seconds_ = 0;
  }
  next_bucket_ = 0;
  return gradients_;
}

void BucketedDSync::segment_ready(std::size_t segment, double backward_seconds) {
  if (segment < layers_ && records_single_phase(iteration_)) backward_sums_[segment] += backward_seconds;
  submit_ready_buckets(segment);
}

void BucketedDSync::submit_ready_buckets(std::size_t lowest_ready_segment) {
  // Segments are final from the last one down to `lowest_ready_segment`: every bucket whose first
  // segment is among them can go.
  std::size_t ready = next_bucket_;
  while (ready < plan_.buckets.size() && plan_.buckets[ready].begin >= lowest_ready_segment) ++ready;
  if (ready == next_bucket_) return;
  next_bucket_ = ready;
  {
    std::lock_guard lock(mutex_);
    submitted_ = ready;
  }
  bucket_submitted_.notify_one();
}

void BucketedDSync::end_iteration(std::int64_t t, IterationTimes& times) {
  // Backward ended just now: what came before it since begin_iteration is data, forward and the
  // trainer's bookkeeping, the t_f of the plan's timeline.
  const double before_backward =
      std::max(0.0, Seconds(Clock::now() - iteration_start_).count() - times.backward);
  submit_ready_buckets(0);  // a model that reported no (or not every) segment: send the rest now
  Stopwatch waiting;
  {
    std::unique_lock lock(mutex_);
    const bool done = bucket_reduced_.wait_for(lock, comm_thread_wait(timeout_), [&] {
      return reduced_ == plan_.buckets.size() || comm_failure_ != nullptr;
    });
    if (comm_failure_) std::rethrow_exception(comm_failure_);
    if (!done) {
      throw CommTimeoutError(concat("layer-wise dsync: rank ", transport_.rank(), " waited more than ",
                                    Seconds(comm_thread_wait(timeout_)).count(), " s for bucket ", reduced_, " of ",
                                    plan_.buckets.size(), " of iteration ", t));
    }
    times.comm = comm_seconds_;
  }
  times.wait = waiting.seconds();
  Stopwatch update;
  optimizer_->step(model_.parameters(), gradients_, 1.0f / static_cast<float>(transport_.size()), 0);
  times.update = update.seconds();
  times.pipelined = true;  // communication overlapped with backward

  if (t < cycle_start_ || t >= cycle_start_ + profile_iterations_) return;
  // Profiling. Single-bucket phase: everything before backward (data, forward, bookkeeping), each
  // layer's backward (segment_ready) and the update. Interference phase (one bucket per layer):
  // the whole backward, slowed by the allreduces running beside it.
  if (records_single_phase(t)) {
    before_backward_sum_ += before_backward;
    update_sum_ += times.update;
    ++single_iterations_;
  } else if (!in_single_phase(t)) {
    interference_backward_sum_ += times.backward;
    ++interference_iterations_;
  }
  if (t + 1 == cycle_start_ + profile_iterations_) {
    replan(plans_made_++);
    if (replan_every_ > 0) cycle_start_ = t + 1 + replan_every_;
  }
}

bool BucketedDSync::in_single_phase(std::int64_t t) const {
  return t - cycle_start_ < profile_iterations_ - profile_iterations_ / 2;
}

bool BucketedDSync::records_single_phase(std::int64_t t) const {
  return t >= cycle_start_ && t < cycle_start_ + profile_iterations_ && in_single_phase(t);
}

void BucketedDSync::replan(std::int64_t plan_number) {
  // Every worker averages the same numbers, so every worker computes the same plan.
  const double n = static_cast<double>(std::max<std::int64_t>(1, single_iterations_));
  double backward = 0;
  for (std::size_t s = 0; s < layers_; ++s) {
    profile_buffer_[s] = static_cast<float>(backward_sums_[s] / n);
    backward += backward_sums_[s] / n;
  }
  profile_buffer_[layers_] = static_cast<float>(before_backward_sum_ / n);
  profile_buffer_[layers_ + 1] = static_cast<float>(update_sum_ / n);
  // kappa: the backward time each of the L - 1 buckets launched during backward took from it.
  double kappa = 0;
  if (interference_iterations_ > 0 && layers_ > 1) {
    const double slowed = interference_backward_sum_ / static_cast<double>(interference_iterations_);
    kappa = std::max(0.0, slowed - backward) / static_cast<double>(layers_ - 1);
  }
  profile_buffer_[layers_ + 2] = static_cast<float>(kappa);
  // Planning sequences: 64 per plan, the first for the profile, then the probes.
  const auto sequence = static_cast<std::uint64_t>(plan_number) * 64;
  const std::size_t kFirstProbe = layers_ + 3;
  const std::vector<double> sizes = cost_probe_sizes(planned_profile_);
  if (measure_cost_) {
    // The gradients were applied: the buffer is free until the next backward.
    const std::vector<double> medians =
        measure_allreduce_seconds(*allreduce_, gradients_, sizes, bytes_per_element_, 3, sequence + 1);
    for (int k = 0; k < kCostProbes; ++k) {
      profile_buffer_[kFirstProbe + static_cast<std::size_t>(k)] = static_cast<float>(medians[static_cast<std::size_t>(k)]);
    }
  }
  planning_allreduce_.run(profile_buffer_, collective_tag(Channel::kPlanning, sequence));
  const float workers = static_cast<float>(transport_.size());
  if (measure_cost_) {
    std::vector<double> seconds(kCostProbes);
    for (int k = 0; k < kCostProbes; ++k) {
      seconds[static_cast<std::size_t>(k)] = profile_buffer_[kFirstProbe + static_cast<std::size_t>(k)] / workers;
    }
    cost_ = fit_measured_cost(sizes, seconds, algorithm_, transport_.size());
  }
  for (std::size_t s = 0; s < layers_; ++s) {
    planned_profile_.backward_seconds[s] = profile_buffer_[s] / workers;
  }
  planned_profile_.forward_seconds = profile_buffer_[layers_] / workers;
  planned_update_seconds_ = profile_buffer_[layers_ + 1] / workers;
  planned_profile_.per_bucket_compute_seconds = profile_buffer_[layers_ + 2] / workers;
  chosen_plan_ = make_bucket_plan(plan_name_, planned_profile_, cost_);
  std::fill(backward_sums_.begin(), backward_sums_.end(), 0.0);
  before_backward_sum_ = update_sum_ = interference_backward_sum_ = 0;
  single_iterations_ = interference_iterations_ = 0;
}

MethodReport BucketedDSync::report() const {
  MethodReport report;
  report.plan = concat(plan_name_, ": ", describe_plan(chosen_plan_));
  report.allreduce_calls = chosen_plan_.buckets.size();
  if (plans_made_ > 0) {
    const PlanTimeline timeline = simulate_plan(planned_profile_, cost_, chosen_plan_);
    report.predicted_iteration = timeline.iteration + planned_update_seconds_;
    report.predicted_non_overlapped = timeline.non_overlapped;
    report.planned = true;
    report.profile = planned_profile_;
    report.cost = cost_;
    report.update_seconds = planned_update_seconds_;
  }
  return report;
}

}  // namespace pipesgd
