#include "pipesgd/algo/planning.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

bool calibrated_here(const CommonOptions& options, int workers, const std::string& algorithm) {
  return options.calibration && options.calibration->world_size == workers &&
         options.calibration->measured.count(algorithm) > 0;
}

}  // namespace

double measured_compute_seconds(const PlanningInputs& measured) {
  double backward = 0;
  for (double seconds : measured.profile.backward_seconds) backward += seconds;
  return measured.profile.forward_seconds + backward + measured.backward_tail_seconds + measured.update_seconds;
}

LayerProfile profile_for_codec(const LayerProfile& measured, const std::string& codec) {
  const double scale = bytes_per_element(*make_codec(codec)) / sizeof(float);
  LayerProfile profile = measured;
  for (double& bytes : profile.bytes) bytes *= scale;
  return profile;
}

double whole_gradient_allreduce_seconds(const PlanningInputs& measured, const std::string& codec) {
  double bytes = 0;
  for (double layer : profile_for_codec(measured.profile, codec).bytes) bytes += layer;
  return measured.cost.time(bytes);
}

std::int64_t checked_profile_iterations(std::int64_t iterations) {
  if (iterations < 1 || iterations > kMaxProfileIterations) {
    throw UsageError(concat("--profile-iters must be in [1, ", kMaxProfileIterations, "], got ", iterations));
  }
  return iterations;
}

bool is_bucket_plan_name(std::string_view name) {
  return name == "wfbp" || name == "single" || name == "mgwfbp" || name == "optimal" || name.rfind("fixed:", 0) == 0;
}

OptionDeclaration buckets_declaration(std::string help) {
  OptionDeclaration buckets("--buckets", std::move(help));
  buckets.spec_value = is_bucket_plan_name;
  buckets.spec_kind = "bucket plan";
  buckets.spec_values = join(bucket_plan_names());
  return buckets;
}

OptionDeclaration profile_iterations_declaration(std::string help) {
  OptionDeclaration profile("--profile-iters", std::move(help), "10");
  return profile;
}

LinearCost planning_cost(const CommonOptions& options, const NetworkSpec& network, int workers, double gradient_bytes) {
  const std::string algorithm = resolve_allreduce_algorithm(options, workers, gradient_bytes);
  if (calibrated_here(options, workers, algorithm)) return options.calibration->measured.at(algorithm);
  return allreduce_cost(algorithm, workers, planning_link(options, network));
}

LinkParameters planning_link(const CommonOptions& options, const NetworkSpec& network) {
  if (options.calibration) return options.calibration->link;
  LinkParameters link = default_link_parameters();
  if (network.emulated()) {
    link.alpha += network.latency_seconds;
    if (network.bits_per_second > 0) link.beta += 1.0 / network.bytes_per_second();
  }
  return link;
}

std::string planning_link_source(const CommonOptions& options, const NetworkSpec& network) {
  if (options.calibration) return "the calibration file's link parameters";
  return network.emulated() ? concat("the default link parameters plus network ", network.name)
                            : std::string("the default link parameters");
}

std::string planning_cost_source(const CommonOptions& options, const NetworkSpec& network, int workers) {
  if (options.calibration) {
    return options.calibration->world_size == workers
               ? "the calibration file's measured a + b*M"
               : "the calibration file's link parameters (Table II; it was measured at another world size)";
  }
  return concat("the allreduce timed over ", network.emulated() ? network.name : std::string("this transport"),
                " at ", kCostProbes, " sizes");
}

std::vector<double> cost_probe_sizes(std::span<const double> layer_bytes) {
  double smallest = 0, total = 0;
  for (double bytes : layer_bytes) {
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

PlanningExchange::PlanningExchange(Transport& workers, std::size_t max_values, Timeout timeout)
    : codec_(make_codec("none")), allreduce_(workers, max_values, *codec_, AllreduceOptions{timeout, kAutoSegmentBytes}) {}

void PlanningExchange::sum(std::span<float> values, std::uint64_t sequence) {
  allreduce_.run(values, collective_tag(Channel::kPlanning, sequence));
}

void LayerSums::save(CheckpointWriter& out, const std::string& name) const { out.add_doubles(name, sums_); }

void LayerSums::load(const CheckpointReader& in, const std::string& name) { sums_ = in.doubles(name, sums_.size()); }

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

}  // namespace pipesgd
