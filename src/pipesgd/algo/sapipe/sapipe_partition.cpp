#include "pipesgd/algo/sapipe/sapipe_partition.h"

#include "pipesgd/algo/planning.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

namespace {

// The plan `plan_name` of the synchronous layers k..m-1 (none when every layer is stale).
BucketPlan synchronous_plan(const StalenessProfile& profile, const std::string& plan_name, std::size_t stale_layers,
                            const LinearCost& cost) {
  if (stale_layers >= profile.bytes.size()) return {};
  return make_bucket_plan(plan_name, synchronous_layer_profile(profile, stale_layers), cost);
}

}  // namespace

StalenessProfile staleness_profile_from(const PlanningInputs& measured, const std::string& codec) {
  const LayerProfile layers = profile_for_codec(measured.profile, codec);
  const std::size_t count = layers.backward_seconds.size();
  double backward = 0;
  for (double seconds : layers.backward_seconds) backward += seconds;
  StalenessProfile profile;
  for (std::size_t s = 0; s < count; ++s) {
    const double share = backward > 0 ? layers.backward_seconds[s] / backward : 1.0 / static_cast<double>(count);
    profile.forward_seconds.push_back(layers.forward_seconds * share);
    profile.backward_seconds.push_back(layers.backward_seconds[s]);
    profile.bytes.push_back(layers.bytes[s]);
  }
  return profile;
}

StalenessPlan sapipe_staleness_plan(const StalenessProfile& profile, const LinearCost& cost,
                                    const std::string& plan_name, long requested) {
  if (requested < 0) return plan_partial_staleness(profile, cost, plan_name);
  StalenessPlan plan;
  plan.stale_layers = static_cast<std::size_t>(requested);
  plan.sync_plan = synchronous_plan(profile, plan_name, plan.stale_layers, cost);
  plan.timeline = simulate_bucketed_staleness(profile, cost, plan.stale_layers, plan.sync_plan);
  plan.stalls = plan.timeline.stalls;
  return plan;
}

SapipePartition::SapipePartition(const Layout& layout, double bytes_per_element, std::string plan_name, LinearCost cost)
    : layout_(layout),
      layers_(layout.segment_count()),
      bytes_per_element_(bytes_per_element),
      plan_name_(std::move(plan_name)),
      cost_(cost) {
  for (std::size_t s = 0; s < layers_; ++s) {
    profile_.forward_seconds.push_back(0);
    profile_.backward_seconds.push_back(0);
    profile_.bytes.push_back(static_cast<double>(layout.segment(s).count) * bytes_per_element_);
  }
}

SapipePartition::Range SapipePartition::range(std::size_t begin, std::size_t end) const {
  Range range{begin, end, 0, 0};
  if (begin < end) {
    range.offset = layout_.segment(begin).offset;
    const Segment& last = layout_.segment(end - 1);
    range.count = last.offset + last.count - range.offset;
  } else if (begin < layout_.segment_count()) {
    range.offset = layout_.segment(begin).offset;
  } else {
    range.offset = layout_.total();
  }
  return range;
}

BucketPlan SapipePartition::plan_for(std::size_t stale_layers, const LinearCost& cost) const {
  return synchronous_plan(profile_, plan_name_, stale_layers, cost);
}

void SapipePartition::use(std::size_t stale_layers, const BucketPlan& sync_plan) {
  stale_layers_ = stale_layers;
  stale_ = range(0, stale_layers);
  sync_plan_ = sync_plan;
  sync_buckets_.clear();
  if (stale_layers < layers_) {
    for (const Bucket& bucket : sync_plan.buckets) {
      sync_buckets_.push_back(range(stale_layers + bucket.begin, stale_layers + bucket.end));
    }
  }
  planned_ = true;
}

void SapipePartition::use_fixed(std::size_t stale_layers) { use(stale_layers, plan_for(stale_layers, cost_)); }

void SapipePartition::plan(const StalenessProfile& profile, const LinearCost& cost, long requested) {
  profile_.forward_seconds = profile.forward_seconds;
  profile_.backward_seconds = profile.backward_seconds;
  cost_ = cost;
  paper_stale_layers_ = pipesgd::paper_stale_layers(profile_, cost_);
  staleness_plan_ = sapipe_staleness_plan(profile_, cost_, plan_name_, requested);
  use(staleness_plan_.stale_layers, staleness_plan_.sync_plan);
  if (requested < 0) timeline_stale_layers_ = stale_layers_;
}

void SapipePartition::raise(double scale) {
  const LinearCost scaled{cost_.a * scale, cost_.b * scale};
  StalenessPlan plan = plan_partial_staleness(profile_, scaled, plan_name_);
  if (plan.stale_layers <= stale_layers_) {
    plan = sapipe_staleness_plan(profile_, scaled, plan_name_, static_cast<long>(stale_layers_ + 1));
  }
  cost_ = scaled;
  staleness_plan_ = plan;
  use(plan.stale_layers, plan.sync_plan);
}

double SapipePartition::predicted_communication() const {
  double seconds = 0;
  auto add = [&](const Range& range) {
    if (range.count > 0) seconds += cost_.time(static_cast<double>(range.count) * bytes_per_element_);
  };
  add(stale_);
  for (const Range& bucket : sync_buckets_) add(bucket);
  return seconds;
}

void SapipePartition::save(CheckpointWriter& out, const std::string& prefix) const {
  out.add_int(prefix + "planned", planned_ ? 1 : 0);
  out.add_int(prefix + "stale_layers", static_cast<std::int64_t>(stale_layers_));
  if (planned_) save_bucket_plan(out, prefix + "sync_plan.", sync_plan_);
  out.add_double(prefix + "cost.a", cost_.a);
  out.add_double(prefix + "cost.b", cost_.b);
  out.add_doubles(prefix + "profile.forward_seconds", profile_.forward_seconds);
  out.add_doubles(prefix + "profile.backward_seconds", profile_.backward_seconds);
  out.add_int(prefix + "timeline.stale_layers", static_cast<std::int64_t>(timeline_stale_layers_));
  out.add_int(prefix + "paper.stale_layers", paper_stale_layers_ ? static_cast<std::int64_t>(*paper_stale_layers_) : -1);
  out.add_double(prefix + "timeline.iteration", staleness_plan_.timeline.iteration);
  out.add_double(prefix + "timeline.compute", staleness_plan_.timeline.compute);
  out.add_double(prefix + "timeline.wait", staleness_plan_.timeline.wait);
  out.add_int(prefix + "timeline.stalls", staleness_plan_.timeline.stalls ? 1 : 0);
  out.add_int(prefix + "plan_stalls", staleness_plan_.stalls ? 1 : 0);
}

void SapipePartition::load(const CheckpointReader& in, const std::string& prefix, long requested) {
  auto refuse = [&](const std::string& why) { return DataError(concat("checkpoint '", in.origin(), "': ", why)); };
  auto flag = [&](const char* name) { return in.flag(prefix + name); };
  const bool planned = flag("planned");
  const std::int64_t stale_layers = in.integer(prefix + "stale_layers");
  if (stale_layers < 0 || stale_layers > static_cast<std::int64_t>(layers_) || (!planned && stale_layers != 0) ||
      (planned && requested >= 0 && stale_layers != requested)) {
    throw refuse(concat("k = ", stale_layers, " stale layers, which this run (--stale-layers ",
                        requested < 0 ? std::string("auto") : concat(requested), ", a model of ", layers_,
                        " layers) cannot have"));
  }
  const auto k = static_cast<std::size_t>(stale_layers);
  BucketPlan sync_plan;
  if (planned) sync_plan = load_bucket_plan(in, prefix + "sync_plan.", layers_ - k);
  const std::int64_t timeline = in.integer(prefix + "timeline.stale_layers");
  const std::int64_t paper = in.integer(prefix + "paper.stale_layers");
  if (timeline < 0 || timeline > stale_layers || paper < -1 || paper > static_cast<std::int64_t>(layers_)) {
    throw refuse(concat("k from the timeline ", timeline, " / the paper's ", paper, " with k = ", stale_layers, " of ",
                        layers_, " layers"));
  }
  std::vector<double> forward = in.doubles(prefix + "profile.forward_seconds", layers_);
  std::vector<double> backward = in.doubles(prefix + "profile.backward_seconds", layers_);

  // Everything read is valid: restore.
  if (planned) {
    use(k, sync_plan);
  } else {
    planned_ = false;
  }
  cost_ = LinearCost{in.real(prefix + "cost.a"), in.real(prefix + "cost.b")};
  profile_.forward_seconds = std::move(forward);
  profile_.backward_seconds = std::move(backward);
  timeline_stale_layers_ = static_cast<std::size_t>(timeline);
  paper_stale_layers_ = paper < 0 ? std::nullopt : std::optional<std::size_t>(static_cast<std::size_t>(paper));
  staleness_plan_.stale_layers = k;
  staleness_plan_.sync_plan = sync_plan;
  staleness_plan_.timeline.iteration = in.real(prefix + "timeline.iteration");
  staleness_plan_.timeline.compute = in.real(prefix + "timeline.compute");
  staleness_plan_.timeline.wait = in.real(prefix + "timeline.wait");
  staleness_plan_.timeline.stalls = flag("timeline.stalls");
  staleness_plan_.stalls = flag("plan_stalls");
}

}  // namespace pipesgd
