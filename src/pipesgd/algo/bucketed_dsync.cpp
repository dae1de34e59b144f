#include "pipesgd/algo/bucketed_dsync.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

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

void save_doubles(CheckpointWriter& out, std::string name, std::span<const double> values) {
  out.add(std::move(name), std::as_bytes(values));
}

std::vector<double> load_doubles(const CheckpointReader& in, const std::string& name, std::size_t count) {
  const std::span<const std::byte> bytes = in.bytes(name);
  if (bytes.size() != count * sizeof(double)) {
    throw DataError(concat("checkpoint '", in.origin(), "': section '", name, "' holds ", bytes.size(),
                           " bytes, expected ", count, " doubles"));
  }
  std::vector<double> values(count);
  if (count > 0) std::memcpy(values.data(), bytes.data(), bytes.size());
  for (double value : values) {
    if (!std::isfinite(value)) {
      throw DataError(concat("checkpoint '", in.origin(), "': section '", name, "' holds a non-finite value"));
    }
  }
  return values;
}

void save_bucket_plan(CheckpointWriter& out, const std::string& prefix, const BucketPlan& plan) {
  std::vector<std::int64_t> bounds;
  for (const Bucket& bucket : plan.buckets) {
    bounds.push_back(static_cast<std::int64_t>(bucket.begin));
    bounds.push_back(static_cast<std::int64_t>(bucket.end));
  }
  out.add_string(prefix + "name", plan.name);
  out.add(prefix + "bounds", std::as_bytes(std::span<const std::int64_t>(bounds)));
}

BucketPlan load_bucket_plan(const CheckpointReader& in, const std::string& prefix, std::size_t layers) {
  BucketPlan plan;
  plan.name = std::string(in.string(prefix + "name"));
  const std::span<const std::byte> bytes = in.bytes(prefix + "bounds");
  const std::size_t pair_bytes = 2 * sizeof(std::int64_t);
  auto invalid = [&](const std::string& why) {
    return DataError(concat("checkpoint '", in.origin(), "': bucket plan '", prefix, "' ", why, " (a plan over ",
                            layers, " layers)"));
  };
  if (bytes.size() % pair_bytes != 0 || bytes.size() / pair_bytes > layers) {
    throw invalid(concat("of ", bytes.size(), " bytes"));
  }
  std::vector<std::int64_t> bounds(bytes.size() / sizeof(std::int64_t));
  if (!bounds.empty()) std::memcpy(bounds.data(), bytes.data(), bytes.size());
  // Launch order: the first bucket ends at `layers`, each next one ends where the previous began.
  auto expected_end = static_cast<std::int64_t>(layers);
  for (std::size_t k = 0; k < bounds.size(); k += 2) {
    if (bounds[k + 1] != expected_end || bounds[k] < 0 || bounds[k] >= bounds[k + 1]) {
      throw invalid(concat("has bucket [", bounds[k], ", ", bounds[k + 1], ") where one ending at ",
                           expected_end, " belongs"));
    }
    plan.buckets.push_back({static_cast<std::size_t>(bounds[k]), static_cast<std::size_t>(bounds[k + 1])});
    expected_end = bounds[k];
  }
  if (expected_end != 0) throw invalid(concat("leaves layers [0, ", expected_end, ") out"));
  return plan;
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
      profile_buffer_(layers_ + 3 + kCostProbes, 0.0f),
      bucket_tickets_(layers_, 0),
      comm_(transport, "layer-wise dsync", std::max<std::size_t>(layers_, 1), config.allreduce.timeout,
            [this](const CommWorker::Job& job) {
              allreduce_->run(job.data, collective_tag(Channel::kGradients, job.sequence));
            }) {
  algorithm_ = resolve_allreduce_algorithm(config, transport.size(),
                                           static_cast<double>(model.layout().total()) * sizeof(float));
  if (layers_ == 0) throw UsageError("layer-wise communication needs a model with layers");
  bytes_per_element_ = static_cast<double>(codec_->encoded_bytes(1000)) / 1000.0;
  planned_profile_ = empty_profile(model.layout(), bytes_per_element_);
  make_bucket_plan(plan_name_, planned_profile_, cost_);  // an unknown plan fails here, not later
  chosen_plan_ = plan_ = single_plan(layers_);            // until the first plan
  on_segment_ready_ = [this](std::size_t segment, double seconds) { segment_ready(segment, seconds); };
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
  iteration_ = t;  // the comm thread is idle: the last iteration waited for every bucket
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
  const Layout& layout = model_.layout();
  for (; next_bucket_ < ready; ++next_bucket_) {
    // The plan and the gradient range of a submitted bucket do not change until it is reduced.
    const Bucket& bucket = plan_.buckets[next_bucket_];
    const std::size_t begin = layout.segment(bucket.begin).offset;
    const Segment& last = layout.segment(bucket.end - 1);
    const std::span<float> range(gradients_.data() + begin, last.offset + last.count - begin);
    const auto sequence = static_cast<std::uint64_t>(iteration_) * layers_ + next_bucket_;
    bucket_tickets_[next_bucket_] = comm_.submit({range, sequence, iteration_, next_bucket_});
  }
}

void BucketedDSync::end_iteration(std::int64_t t, IterationTimes& times) {
  // Backward ended just now: what came before it since begin_iteration is data, forward and the
  // trainer's bookkeeping, the t_f of the plan's timeline.
  const double before_backward =
      std::max(0.0, Seconds(Clock::now() - iteration_start_).count() - times.backward);
  submit_ready_buckets(0);  // a model that reported no (or not every) segment: send the rest now
  Stopwatch waiting;
  double comm_seconds = 0;
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
    comm_seconds += comm_.wait(bucket_tickets_[b], "the buckets", t);
  }
  times.comm = comm_seconds;
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

void BucketedDSync::save_state(CheckpointWriter& out) {
  comm_.drain("the buckets before a checkpoint");  // end_iteration waited for every bucket
  optimizer_->save_state(out, "method.");
  const std::string prefix = "method.layerwise.";
  out.add_int(prefix + "layers", static_cast<std::int64_t>(layers_));
  out.add_int(prefix + "profile_iterations", profile_iterations_);
  out.add_int(prefix + "replan_every", replan_every_);
  out.add_int(prefix + "plans_made", plans_made_);
  out.add_int(prefix + "cycle_start", cycle_start_);
  save_bucket_plan(out, prefix + "chosen_plan.", chosen_plan_);
  save_doubles(out, prefix + "planned_backward_seconds", planned_profile_.backward_seconds);
  const double planned[] = {planned_profile_.forward_seconds, planned_profile_.per_bucket_compute_seconds,
                            planned_update_seconds_, cost_.a, cost_.b};
  save_doubles(out, prefix + "planned_scalars", planned);
  save_doubles(out, prefix + "backward_sums", backward_sums_);
  const double sums[] = {before_backward_sum_, update_sum_, interference_backward_sum_};
  save_doubles(out, prefix + "profiling_sums", sums);
  out.add_int(prefix + "single_iterations", single_iterations_);
  out.add_int(prefix + "interference_iterations", interference_iterations_);
}

void BucketedDSync::load_state(const CheckpointReader& in, std::int64_t next_iteration) {
  optimizer_->load_state(in, "method.");
  const std::string prefix = "method.layerwise.";
  auto refuse = [&](const std::string& why) { return DataError(concat("checkpoint '", in.origin(), "': ", why)); };
  auto expect_setting = [&](const char* name, const char* option, std::int64_t expected) {
    const std::int64_t saved = in.integer(prefix + name);
    if (saved != expected) throw refuse(concat("written with ", option, " ", saved, ", this run has ", expected));
  };
  if (in.integer(prefix + "layers") != static_cast<std::int64_t>(layers_)) {
    throw refuse(concat("written for a model of ", in.integer(prefix + "layers"), " layers, this one has ", layers_));
  }
  expect_setting("profile_iterations", "--profile-iters", profile_iterations_);
  expect_setting("replan_every", "--replan-every", replan_every_);
  const std::int64_t plans_made = in.integer(prefix + "plans_made");
  const std::int64_t cycle_start = in.integer(prefix + "cycle_start");
  // The first plan is made at the end of iteration kProfileWarmupIterations + P - 1.
  const bool first_plan_due = next_iteration >= kProfileWarmupIterations + profile_iterations_;
  if (plans_made < 0 || plans_made > next_iteration || (plans_made > 0) != first_plan_due) {
    throw refuse(concat(plans_made, " plans made before iteration ", next_iteration, " with --profile-iters ",
                        profile_iterations_));
  }
  const bool cycle_valid = replan_every_ == 0
                               ? cycle_start == kProfileWarmupIterations
                               : cycle_start >= kProfileWarmupIterations && cycle_start <= next_iteration + replan_every_;
  if (!cycle_valid) {
    throw refuse(concat("profiling cycle starting at iteration ", cycle_start, " before iteration ", next_iteration,
                        " with --replan-every ", replan_every_));
  }
  const std::int64_t single_iterations = in.integer(prefix + "single_iterations");
  const std::int64_t interference_iterations = in.integer(prefix + "interference_iterations");
  if (single_iterations < 0 || interference_iterations < 0 ||
      single_iterations + interference_iterations > profile_iterations_) {
    throw refuse(concat(single_iterations, " + ", interference_iterations, " profiled iterations with --profile-iters ",
                        profile_iterations_));
  }
  BucketPlan chosen = load_bucket_plan(in, prefix + "chosen_plan.", layers_);
  const std::vector<double> backward = load_doubles(in, prefix + "planned_backward_seconds", layers_);
  const std::vector<double> planned = load_doubles(in, prefix + "planned_scalars", 5);
  const std::vector<double> backward_sums = load_doubles(in, prefix + "backward_sums", layers_);
  const std::vector<double> sums = load_doubles(in, prefix + "profiling_sums", 3);

  plans_made_ = plans_made;
  cycle_start_ = cycle_start;
  chosen_plan_ = std::move(chosen);
  planned_profile_.backward_seconds = backward;
  planned_profile_.forward_seconds = planned[0];
  planned_profile_.per_bucket_compute_seconds = planned[1];
  planned_update_seconds_ = planned[2];
  cost_ = LinearCost{planned[3], planned[4]};
  backward_sums_ = backward_sums;
  before_backward_sum_ = sums[0];
  update_sum_ = sums[1];
  interference_backward_sum_ = sums[2];
  single_iterations_ = single_iterations;
  interference_iterations_ = interference_iterations;
  // begin_iteration copies the plan the next iteration needs.
  plan_ = single_plan(layers_);
  plan_in_use_ = PlanInUse::kSingle;
  plan_version_ = -1;
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
