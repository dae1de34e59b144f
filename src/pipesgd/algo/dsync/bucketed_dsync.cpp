#include "pipesgd/algo/dsync/bucketed_dsync.h"

#include <algorithm>
#include <limits>

#include "pipesgd/algo/dsync/layer_wise_report.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/trace.h"

namespace pipesgd {
namespace {

// No profiling cycle (far enough from the int64 limit to add a cycle's length).
constexpr std::int64_t kNoCycle = std::numeric_limits<std::int64_t>::max() / 4;

// The profile's scalars after its L backward times: t_f, update, kappa, backward's tail.
constexpr std::size_t kPlanningScalars = 4;

// A zero-cost profile: the plan computed before any measurement.
LayerProfile empty_profile(const Layout& layout, double bytes_per_element) {
  LayerProfile profile;
  for (const Segment& segment : layout.segments()) {
    profile.bytes.push_back(static_cast<double>(segment.count) * bytes_per_element);
    profile.backward_seconds.push_back(0);
  }
  return profile;
}

}  // namespace

BucketedDSync::BucketedDSync(const MethodContext& context)
    : model_(context.model),
      workers_(context.transport.size()),
      plan_name_(options_as<DsyncOptions>(context.options).buckets),
      profile_iterations_(checked_profile_iterations(options_as<DsyncOptions>(context.options).profile_iterations)),
      replan_every_(options_as<DsyncOptions>(context.options).replan_every),
      layers_(context.model.layout().segment_count()),
      cost_(planning_cost(context.common, context.network, workers_,
                          static_cast<double>(context.model.layout().total()) * sizeof(float))),
      measure_cost_(context.common.calibration == nullptr),
      algorithm_(resolve_allreduce_algorithm(context.common, workers_,
                                             static_cast<double>(context.model.layout().total()) * sizeof(float))),
      codec_(make_codec(context.common.codec)),
      allreduce_(make_method_allreduce(context.common, context.transport, context.model.layout().total(), *codec_,
                                       context.options.default_segment_bytes())),
      planning_(context.transport, layers_ + kPlanningScalars + kCostProbes, context.common.timeout),
      optimizer_(make_optimizer(context.common.optimizer, context.model.layout())),
      schedule_(context.learning_rate_schedule),
      gradients_(context.model.layout().total()),
      backward_sums_(layers_),
      single_comm_seconds_(static_cast<std::size_t>(profile_iterations_ - profile_iterations_ / 2), 0.0),
      profile_buffer_(layers_ + kPlanningScalars + kCostProbes, 0.0f),
      bucket_tickets_(layers_, 0),
      comm_(context.transport, "layer-wise dsync", std::max<std::size_t>(layers_, 1), context.common.timeout,
            [this](const CommWorker::Job& job) {
              allreduce_->run(job.data, collective_tag(Channel::kGradients, job.sequence));
            },
            context.common.wait_spin) {
  if (layers_ == 0) throw UsageError("layer-wise communication needs a model with layers");
  bytes_per_element_ = bytes_per_element(*codec_);
  planned_profile_ = empty_profile(context.model.layout(), bytes_per_element_);
  make_bucket_plan(plan_name_, planned_profile_, cost_);  // an unknown plan fails here, not later
  chosen_plan_ = plan_ = single_plan(layers_);            // until the first plan
  first_cycle_start_ = context.first_iteration == 0 ? context.profile_warmup_iterations : context.first_iteration;
  if (context.planned_from != nullptr) {
    // `auto` switched here with the profile it measured: plan from it at once, as if this method's
    // first cycle had just ended.
    const PlanningInputs& measured = *context.planned_from;
    PIPESGD_ASSERT(measured.profile.backward_seconds.size() == layers_);
    planned_profile_.backward_seconds = measured.profile.backward_seconds;  // the bytes stay this codec's
    planned_profile_.forward_seconds = measured.profile.forward_seconds;
    planned_profile_.per_bucket_compute_seconds = measured.profile.per_bucket_compute_seconds;
    planned_update_seconds_ = measured.update_seconds;
    planned_backward_tail_seconds_ = measured.backward_tail_seconds;
    if (measure_cost_) cost_ = measured.cost;
    chosen_plan_ = make_bucket_plan(plan_name_, planned_profile_, cost_);
    plans_made_ = 1;
    planned_at_start_ = true;
    first_cycle_start_ = replan_every_ > 0 ? context.first_iteration + replan_every_ : kNoCycle;
  }
  cycle_start_ = first_cycle_start_;
  plan_start_ = planned_at_start_ ? context.first_iteration : first_cycle_start_ + profile_iterations_;
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
  iteration_ = t;
  next_bucket_ = 0;
  return gradients_;
}

void BucketedDSync::segment_ready(std::size_t segment, double backward_seconds) {
  if (segment < layers_ && records_single_phase(iteration_)) backward_sums_.add(segment, backward_seconds);
  submit_ready_buckets(segment);
}

void BucketedDSync::submit_ready_buckets(std::size_t lowest_ready_segment) {
  // Segments are final from the last one down to `lowest_ready_segment`: every bucket whose first
  // segment is among them can go.
  const Layout& layout = model_.layout();
  while (next_bucket_ < plan_.buckets.size() && plan_.buckets[next_bucket_].begin >= lowest_ready_segment) {
    // The plan and the gradient range of a submitted bucket do not change until it is reduced.
    const Bucket& bucket = plan_.buckets[next_bucket_];
    const std::size_t begin = layout.segment(bucket.begin).offset;
    const Segment& last = layout.segment(bucket.end - 1);
    const std::span<float> range(gradients_.data() + begin, last.offset + last.count - begin);
    const auto sequence = static_cast<std::uint64_t>(iteration_) * layers_ + next_bucket_;
    bucket_tickets_[next_bucket_] = comm_.submit({range, sequence, iteration_, next_bucket_});
    ++next_bucket_;
  }
}

void BucketedDSync::end_iteration(std::int64_t t, IterationTimes& times) {
  // Backward ended just now: what came before it since begin_iteration is data, forward and the
  // trainer's bookkeeping, the t_f of the plan's timeline.
  const double before_backward =
      std::max(0.0, Seconds(Clock::now() - iteration_start_).count() - times.backward);
  submit_ready_buckets(0);  // a model that reported no (or not every) segment: send the rest now
  TracedStopwatch waiting("wait");
  double comm_seconds = 0;
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) comm_seconds += comm_.wait(bucket_tickets_[b], "the buckets", t);
  times.comm = comm_seconds;
  times.wait = waiting.stop();
  TracedStopwatch update("update");
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) trace_gradient_flow_end(t, b);
  optimizer_->set_learning_rate_factor(schedule_.factor(t));
  optimizer_->step(model_.parameters(), gradients_, 1.0f / static_cast<float>(workers_), 0);
  times.update = update.stop();
  times.pipelined = true;  // communication overlapped with backward

  if (t < cycle_start_ || t >= cycle_start_ + profile_iterations_) return;
  // Profiling. Single-bucket phase: everything before backward (data, forward, bookkeeping), each
  // layer's backward (segment_ready) and the update. Interference phase (one bucket per layer):
  // the whole backward, slowed by the allreduces running beside it.
  if (records_single_phase(t)) {
    PIPESGD_ASSERT(static_cast<std::size_t>(single_iterations_) < single_comm_seconds_.size());
    single_comm_seconds_[static_cast<std::size_t>(single_iterations_)] = comm_seconds;
    before_backward_sum_ += before_backward;
    update_sum_ += times.update;
    single_backward_sum_ += times.backward;
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
  TraceArgs args;
  args.iteration = iteration_;
  trace_instant("plan", kTraceRun, args);
  // Every worker averages the same numbers, so every worker computes the same plan.
  const double n = static_cast<double>(std::max<std::int64_t>(1, single_iterations_));
  double backward = 0;
  for (std::size_t s = 0; s < layers_; ++s) {
    profile_buffer_[s] = static_cast<float>(backward_sums_.sum(s) / n);
    backward += backward_sums_.sum(s) / n;
  }
  profile_buffer_[layers_] = static_cast<float>(before_backward_sum_ / n);
  profile_buffer_[layers_ + 1] = static_cast<float>(update_sum_ / n);
  // Backward's tail: the whole backward (trainer's clock) past its layers' readiness intervals.
  const double whole_backward = single_iterations_ > 0 ? single_backward_sum_ / n : backward;
  const double tail = std::max(0.0, whole_backward - backward);
  // kappa: the backward time each of the L - 1 buckets launched during backward took from it (the
  // whole backward of the interference phase against that of the single phase, one clock).
  double kappa = 0;
  if (interference_iterations_ > 0 && layers_ > 1) {
    const double slowed = interference_backward_sum_ / static_cast<double>(interference_iterations_);
    kappa = std::max(0.0, slowed - (backward + tail)) / static_cast<double>(layers_ - 1);
  }
  profile_buffer_[layers_ + 2] = static_cast<float>(kappa);
  profile_buffer_[layers_ + 3] = static_cast<float>(tail);
  // Planning sequences: 64 per plan, the first for the profile, then the probes.
  const auto sequence = static_cast<std::uint64_t>(plan_number) * 64;
  const std::size_t first_probe = layers_ + kPlanningScalars;
  const std::vector<double> sizes = cost_probe_sizes(planned_profile_.bytes);
  if (measure_cost_) {
    // The largest size is the whole gradient, which the single phase allreduced in every
    // iteration: the median of those is its probe (the slowest to time again; for mlp at
    // 1 Gbit/s, 3 more allreduces of 21 ms). The gradients were applied: the buffer is free until
    // the next backward.
    const std::span<double> single(single_comm_seconds_.data(), static_cast<std::size_t>(single_iterations_));
    const bool single_timed = !single.empty() && std::ranges::all_of(single, [](double s) { return s >= 0; });
    const std::size_t timed = single_timed ? kCostProbes - 1 : kCostProbes;
    const std::vector<double> medians = measure_allreduce_seconds(
        *allreduce_, gradients_, std::span(sizes).first(timed), bytes_per_element_, 3, sequence + 1);
    std::copy(medians.begin(), medians.end(), profile_buffer_.begin() + static_cast<std::ptrdiff_t>(first_probe));
    if (single_timed) {
      std::sort(single.begin(), single.end());
      profile_buffer_[first_probe + timed] = static_cast<float>(single[single.size() / 2]);
    }
  }
  planning_.sum(profile_buffer_, sequence);
  const float workers = static_cast<float>(workers_);
  if (measure_cost_) {
    std::vector<double> seconds(kCostProbes);
    for (int k = 0; k < kCostProbes; ++k) {
      seconds[static_cast<std::size_t>(k)] = profile_buffer_[first_probe + static_cast<std::size_t>(k)] / workers;
    }
    cost_ = fit_measured_cost(sizes, seconds, algorithm_, workers_);
    probe_bytes_ = sizes;
    probe_seconds_ = std::move(seconds);
  }
  for (std::size_t s = 0; s < layers_; ++s) {
    planned_profile_.backward_seconds[s] = profile_buffer_[s] / workers;
  }
  planned_profile_.forward_seconds = profile_buffer_[layers_] / workers;
  planned_update_seconds_ = profile_buffer_[layers_ + 1] / workers;
  planned_profile_.per_bucket_compute_seconds = profile_buffer_[layers_ + 2] / workers;
  planned_backward_tail_seconds_ = profile_buffer_[layers_ + 3] / workers;
  chosen_plan_ = make_bucket_plan(plan_name_, planned_profile_, cost_);
  backward_sums_.clear();
  before_backward_sum_ = update_sum_ = interference_backward_sum_ = single_backward_sum_ = 0;
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
  out.add_doubles(prefix + "planned.backward_seconds", planned_profile_.backward_seconds);
  out.add_double(prefix + "planned.forward_seconds", planned_profile_.forward_seconds);
  out.add_double(prefix + "planned.kappa_seconds", planned_profile_.per_bucket_compute_seconds);
  out.add_double(prefix + "planned.update_seconds", planned_update_seconds_);
  out.add_double(prefix + "planned.backward_tail_seconds", planned_backward_tail_seconds_);
  out.add_double(prefix + "cost.a", cost_.a);
  out.add_double(prefix + "cost.b", cost_.b);
  backward_sums_.save(out, prefix + "cycle.backward_sums");
  out.add_double(prefix + "cycle.before_backward_sum", before_backward_sum_);
  out.add_double(prefix + "cycle.update_sum", update_sum_);
  out.add_double(prefix + "cycle.interference_backward_sum", interference_backward_sum_);
  out.add_double(prefix + "cycle.single_backward_sum", single_backward_sum_);
  out.add_int(prefix + "cycle.single_iterations", single_iterations_);
  out.add_doubles(prefix + "cycle.single_comm_seconds", single_comm_seconds_);
  out.add_int(prefix + "cycle.interference_iterations", interference_iterations_);
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
  // The first plan is made at the end of the first cycle's last iteration (or was given).
  const bool first_plan_due = planned_at_start_ || next_iteration >= first_cycle_start_ + profile_iterations_;
  if (plans_made < 0 || plans_made > next_iteration || (plans_made > 0) != first_plan_due) {
    throw refuse(concat(plans_made, " plans made before iteration ", next_iteration, " with --profile-iters ",
                        profile_iterations_));
  }
  const bool cycle_valid = replan_every_ == 0
                               ? cycle_start == first_cycle_start_
                               : cycle_start >= first_cycle_start_ && cycle_start <= next_iteration + replan_every_;
  if (!cycle_valid) {
    throw refuse(concat("profiling cycle starting at iteration ", cycle_start, " before iteration ", next_iteration,
                        " with --replan-every ", replan_every_));
  }
  const std::int64_t single_iterations = in.integer(prefix + "cycle.single_iterations");
  const std::int64_t interference_iterations = in.integer(prefix + "cycle.interference_iterations");
  if (single_iterations < 0 || interference_iterations < 0 ||
      single_iterations + interference_iterations > profile_iterations_) {
    throw refuse(concat(single_iterations, " + ", interference_iterations, " profiled iterations with --profile-iters ",
                        profile_iterations_));
  }
  BucketPlan chosen = load_bucket_plan(in, prefix + "chosen_plan.", layers_);
  std::vector<double> backward = in.doubles(prefix + "planned.backward_seconds", layers_);
  LayerSums backward_sums(layers_);
  backward_sums.load(in, prefix + "cycle.backward_sums");

  plans_made_ = plans_made;
  cycle_start_ = cycle_start;
  chosen_plan_ = std::move(chosen);
  planned_profile_.backward_seconds = std::move(backward);
  planned_profile_.forward_seconds = in.real(prefix + "planned.forward_seconds");
  planned_profile_.per_bucket_compute_seconds = in.real(prefix + "planned.kappa_seconds");
  planned_update_seconds_ = in.real(prefix + "planned.update_seconds");
  planned_backward_tail_seconds_ = in.real(prefix + "planned.backward_tail_seconds");
  cost_ = LinearCost{in.real(prefix + "cost.a"), in.real(prefix + "cost.b")};
  backward_sums_ = std::move(backward_sums);
  // A checkpoint of an earlier version has no such times (-1: the plan times that size again).
  const std::string single_comm = prefix + "cycle.single_comm_seconds";
  if (in.has(single_comm)) {
    single_comm_seconds_ = in.doubles(single_comm, single_comm_seconds_.size());
  } else {
    std::fill(single_comm_seconds_.begin(), single_comm_seconds_.end(), -1.0);
  }
  before_backward_sum_ = in.real(prefix + "cycle.before_backward_sum");
  update_sum_ = in.real(prefix + "cycle.update_sum");
  interference_backward_sum_ = in.real(prefix + "cycle.interference_backward_sum");
  single_backward_sum_ = in.real(prefix + "cycle.single_backward_sum");
  single_iterations_ = single_iterations;
  interference_iterations_ = interference_iterations;
  // begin_iteration copies the plan the next iteration needs.
  plan_ = single_plan(layers_);
  plan_in_use_ = PlanInUse::kSingle;
  plan_version_ = -1;
}

std::shared_ptr<MethodReport> BucketedDSync::report() const {
  auto report = std::make_shared<LayerWiseReport>();
  report->plan_name = plan_name_;
  report->plan_start = plan_start_;
  // Before the first plan, what the last iteration ran (one bucket, or one per layer while profiling).
  const BucketPlan& ran = plans_made_ > 0 ? chosen_plan_ : plan_;
  report->plan = concat(plans_made_ > 0 ? plan_name_ : ran.name, ": ", describe_plan(ran));
  report->calls = ran.buckets.size();
  if (plans_made_ > 0) {
    const PlanTimeline timeline = simulate_plan(planned_profile_, cost_, chosen_plan_);
    report->predicted = timeline.iteration + planned_update_seconds_;
    report->predicted_non_overlapped = timeline.non_overlapped;
    report->planned = true;
    report->planned_from = *planning_inputs();
  }
  return report;
}

std::optional<PlanningInputs> BucketedDSync::planning_inputs() const {
  if (plans_made_ == 0) return std::nullopt;
  return PlanningInputs{planned_profile_, cost_, planned_update_seconds_, planned_backward_tail_seconds_,
                        probe_bytes_, probe_seconds_};
}

}  // namespace pipesgd
