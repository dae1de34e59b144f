#pragma once
// What the planning methods share (the layer-wise methods, algo/dsync/, and sapipe, algo/sapipe/):
// the cost model a + b·M they start from, the timing of their own allreduce at a few sizes (cost
// probes), the averaging of per-layer measurements over the workers (so that every worker computes
// the same plan from the same numbers), the per-layer sums of the profiling iterations, and the
// checkpoint sections of a bucket plan.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/timing/bucket_plan.h"

namespace pipesgd {

// The first iterations of a run pay one-off costs (allocations, LibTorch's kernel selection: the
// resnet's forward takes 50-60 ms in its first 7 iterations, 33 ms after): they run unprofiled, and
// the first profiling cycle starts after them.
inline constexpr std::int64_t kProfileWarmupIterations = 8;

// What a planning method computed its plan from, averaged over the workers (MethodReport::
// planning_inputs()).
struct PlanningInputs {
  LayerProfile profile;
  LinearCost cost;
  double update_seconds = 0;  // the optimizer's step per iteration
  // Backward's time after its last gradient is ready (the trainer's clock of the whole backward
  // less the layers' readiness intervals): compute that no bucket can overlap.
  double backward_tail_seconds = 0;
  // The cost probes `cost` was fitted to, averaged over the workers: message bytes and seconds (the
  // last, the whole gradient, from the profiling's own allreduces; algo/dsync/bucketed_dsync.h).
  // Empty when the cost came from elsewhere (a calibration file, a checkpoint, auto's profile).
  std::vector<double> probe_bytes, probe_seconds;
};

// Predictions from what a planning method measured (MethodDescriptor::predict, `--algo auto`):
// the compute thread's work per iteration (t_f, the layers' backward, backward's tail, the update),
// and the profile with each layer's bytes as `codec` puts them on the wire (measured with none).
double measured_compute_seconds(const PlanningInputs& measured);
LayerProfile profile_for_codec(const LayerProfile& measured, const std::string& codec);
// One allreduce of the whole gradient as `codec` puts it on the wire: a + b·M from `measured`'s cost.
double whole_gradient_allreduce_seconds(const PlanningInputs& measured, const std::string& codec);

// --profile-iters as given, or UsageError if < 1 or > kMaxProfileIterations.
inline constexpr std::int64_t kMaxProfileIterations = 10'000'000;
std::int64_t checked_profile_iterations(std::int64_t iterations);

// True if `name` is a bucket plan's name as a spec part may give it (timing/bucket_plan.h; fixed:
// with any size: make_bucket_plan checks it).
bool is_bucket_plan_name(std::string_view name);
// The --buckets and --profile-iters declarations (planning methods), with their help.
OptionDeclaration buckets_declaration(std::string help);
OptionDeclaration profile_iterations_declaration(std::string help);

// a + b·M of one allreduce of `options`' algorithm over `workers` ranks (for the whole gradient of
// `gradient_bytes`, which `auto` is resolved for), from, in this order: the calibration's measured
// a + b·M at this world size; its link parameters through Table II; the emulated network (its
// latency and bandwidth added to default_link_parameters(), which stand for the software cost of a
// message); default_link_parameters().
LinearCost planning_cost(const CommonOptions& options, const NetworkSpec& network, int workers, double gradient_bytes);
// The link parameters α, β, γ of that model: the calibration's; else default_link_parameters() with
// the emulated network's latency added to α and its byte time to β.
LinkParameters planning_link(const CommonOptions& options, const NetworkSpec& network);
// Where planning_link() took its numbers from, for reports.
std::string planning_link_source(const CommonOptions& options, const NetworkSpec& network);
// Where planning_cost() took its numbers from, for reports.
std::string planning_cost_source(const CommonOptions& options, const NetworkSpec& network, int workers);

// The message sizes (bytes, multiples of 4) at which the cost a + b·M is measured: kCostProbes
// sizes spread log-uniformly from the smallest layer's gradient (at least 4 KiB) to the whole
// gradient, so the fit covers the buckets any plan can make.
inline constexpr int kCostProbes = 4;
std::vector<double> cost_probe_sizes(std::span<const double> layer_bytes);

// Runs `allreduce` on the first size / bytes_per_element floats of `scratch` (which it overwrites;
// sizes are bytes on the wire, bytes_per_element the codec's encoded size; the allreduce must have
// been built for at least the largest count) `repeats` times per size and returns the median
// seconds per size. Collective: every rank calls it with the same sizes and `sequence_base`; the
// runs use Channel::kPlanning sequences sequence_base, sequence_base + 1, ...
std::vector<double> measure_allreduce_seconds(Allreduce& allreduce, std::span<float> scratch,
                                              std::span<const double> sizes, double bytes_per_element,
                                              int repeats, std::uint64_t sequence_base);

// a + b·M (a, b >= 0) fitted to the median `seconds` at `sizes` (relative least squares).
LinearCost fit_measured_cost(std::span<const double> sizes, std::span<const double> seconds,
                             const std::string& algorithm, int workers);

// The planning reductions of one worker: sums small float vectors over the workers with one ring
// allreduce on Channel::kPlanning (never in flight beside another planning reduction). Collective;
// compute thread.
class PlanningExchange {
 public:
  PlanningExchange(Transport& workers, std::size_t max_values, Timeout timeout);
  // Replaces `values` (at most max_values) by their sum over the workers.
  void sum(std::span<float> values, std::uint64_t sequence);

 private:
  std::unique_ptr<Codec> codec_;
  RingAllreduce allreduce_;
};

// Per-layer sums of seconds over profiled iterations.
class LayerSums {
 public:
  explicit LayerSums(std::size_t layers) : sums_(layers, 0.0) {}
  void add(std::size_t layer, double seconds) { sums_[layer] += seconds; }
  double sum(std::size_t layer) const { return sums_[layer]; }
  std::size_t layers() const { return sums_.size(); }
  void clear() { std::fill(sums_.begin(), sums_.end(), 0.0); }
  // Checkpoint section `name` (doubles, bit for bit); load throws DataError for another size.
  void save(CheckpointWriter& out, const std::string& name) const;
  void load(const CheckpointReader& in, const std::string& name);

 private:
  std::vector<double> sums_;
};

// A bucket plan as sections `prefix` + "name" and + "bounds" (begin, end per bucket).
void save_bucket_plan(CheckpointWriter& out, const std::string& prefix, const BucketPlan& plan);
// The plan saved by save_bucket_plan, checked to be a plan over `layers` layers (buckets in launch
// order, contiguous, the first ending at `layers`, the last beginning at 0; none for 0 layers);
// DataError naming the file otherwise.
BucketPlan load_bucket_plan(const CheckpointReader& in, const std::string& prefix, std::size_t layers);

}  // namespace pipesgd
