#include "pipesgd/tools/model_profiling.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <ctime>
#include <exception>
#include <thread>
#include <vector>

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/algo/registry.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/data/sampler.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {
namespace {

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "an unnamed host";
  return name;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[16] = {};
  std::strftime(text, sizeof text, "%Y-%m-%d", &local);
  return text;
}

double median(std::vector<double> values) {
  PIPESGD_ASSERT(!values.empty());
  const std::size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle), values.end());
  const double upper = values[middle];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(middle));
  return (lower + upper) / 2;
}

// Splits `total` over segments [first, end) in proportion to `weights` (by parameter count where
// those are all 0, equally where those are too), adding each share to `out`.
void split(double total, std::size_t first, std::size_t end, const std::vector<double>& weights, const Layout& layout,
           std::vector<double>& out) {
  if (first >= end) return;
  double sum = 0;
  for (std::size_t s = first; s < end; ++s) sum += weights[s];
  if (sum > 0) {
    for (std::size_t s = first; s < end; ++s) out[s] += total * weights[s] / sum;
    return;
  }
  double parameters = 0;
  for (std::size_t s = first; s < end; ++s) parameters += static_cast<double>(layout.segment(s).count);
  for (std::size_t s = first; s < end; ++s) {
    const double share = parameters > 0 ? static_cast<double>(layout.segment(s).count) / parameters
                                        : 1.0 / static_cast<double>(end - first);
    out[s] += total * share;
  }
}

// A forward hook call: segments [first, end) about to be read, `at` seconds into forward_backward.
struct HookCall {
  std::size_t first, end;
  double at;
};

// Clears the model's forward hook when the profile ends (the hook refers to the profile's state).
class ForwardHookGuard {
 public:
  explicit ForwardHookGuard(FlatParameters& model) : model_(model) {}
  ~ForwardHookGuard() { model_.set_forward_hook({}); }
  ForwardHookGuard(const ForwardHookGuard&) = delete;
  ForwardHookGuard& operator=(const ForwardHookGuard&) = delete;

 private:
  FlatParameters& model_;
};

// One iteration's per-segment forward times from the hook calls; false if the calls do not cover
// every segment exactly once, in forward order.
bool forward_from_hooks(const std::vector<HookCall>& calls, double forward_seconds, const std::vector<double>& backward,
                        const Layout& layout, std::vector<double>& out) {
  std::fill(out.begin(), out.end(), 0.0);
  std::size_t next = 0;
  for (const HookCall& call : calls) {
    if (call.first != next || call.end <= call.first || call.end > layout.segment_count()) return false;
    next = call.end;
  }
  if (next != layout.segment_count()) return false;
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const double start = k == 0 ? 0.0 : calls[k].at;
    const double end = k + 1 < calls.size() ? calls[k + 1].at : forward_seconds;
    split(std::max(0.0, end - start), calls[k].first, calls[k].end, backward, layout, out);
  }
  return true;
}

}  // namespace

MeasuredProfile measure_model_profile(Model& model, const Dataset& train, const ProfilingOptions& options) {
  if (options.iterations < 1) throw UsageError(concat("profile: iterations must be >= 1, got ", options.iterations));
  if (options.warmup_iterations < 0) {
    throw UsageError(concat("profile: warm-up iterations must be >= 0, got ", options.warmup_iterations));
  }
  if (options.codec_repetitions < 1) {
    throw UsageError(concat("profile: codec repetitions must be >= 1, got ", options.codec_repetitions));
  }
  const Layout& layout = model.layout();
  const std::size_t segments = layout.segment_count();
  if (segments == 0 || layout.total() == 0) throw UsageError("profile: the model has no parameters");

  ShardedSampler sampler(train.size, 1, 0, options.batch, options.seed);  // UsageError: batch too large
  BatchAssembler assembler(train, options.batch);
  Sgd optimizer(layout.total(), options.sgd);
  std::vector<float> gradients(layout.total());

  // This iteration's reports.
  std::vector<double> backward(segments);
  std::vector<char> reported(segments);
  std::vector<HookCall> calls;
  calls.reserve(segments + 1);
  Clock::time_point call_start;
  const SegmentReadyFn on_ready = [&](std::size_t segment, double seconds) {
    if (segment >= segments) return;
    backward[segment] = seconds;
    reported[segment] = 1;
  };
  const bool hooks = model.reports_forward_progress();
  ForwardHookGuard guard(model);
  if (hooks) {
    model.set_forward_hook([&](std::size_t first, std::size_t end) {
      calls.push_back({first, end, seconds_since(call_start)});
    });
  }

  // The measured iterations' samples.
  std::vector<std::vector<double>> backward_samples(segments), forward_samples(segments);
  std::vector<double> forward_totals, data_samples, update_samples;
  std::vector<double> forward(segments);
  bool all_hooked = hooks;
  bool all_reported = true;

  const std::int64_t total = options.warmup_iterations + options.iterations;
  const auto per_epoch = static_cast<std::int64_t>(sampler.iterations_per_epoch());
  for (std::int64_t t = 0; t < total; ++t) {
    const std::int64_t i = t % per_epoch;
    if (i == 0 && t > 0) sampler.start_epoch(static_cast<std::size_t>(t / per_epoch));
    Stopwatch loading;
    const Batch batch = assembler.assemble(sampler.batch_indices(static_cast<std::size_t>(i)));
    const double data_seconds = loading.seconds();

    std::fill(backward.begin(), backward.end(), 0.0);
    std::fill(reported.begin(), reported.end(), 0);
    calls.clear();
    call_start = Clock::now();
    const StepResult step = model.forward_backward(batch, gradients, on_ready);

    Stopwatch updating;
    optimizer.step(model.parameters(), gradients, 1.0f, 0);
    const double update_seconds = updating.seconds();

    if (t >= options.warmup_iterations) {
      // Segments the model did not report share the rest of the backward, by parameter count.
      double reported_seconds = 0;
      std::vector<double> unreported_weights(segments, 0.0);
      std::size_t first_unreported = segments, last_unreported = 0;
      for (std::size_t s = 0; s < segments; ++s) {
        if (reported[s]) {
          reported_seconds += backward[s];
        } else {
          all_reported = false;
          unreported_weights[s] = static_cast<double>(layout.segment(s).count);
          first_unreported = std::min(first_unreported, s);
          last_unreported = s;
        }
      }
      if (first_unreported < segments) {
        split(std::max(0.0, step.backward_seconds - reported_seconds), first_unreported, last_unreported + 1,
              unreported_weights, layout, backward);
      }
      for (std::size_t s = 0; s < segments; ++s) backward_samples[s].push_back(backward[s]);
      if (all_hooked && forward_from_hooks(calls, step.forward_seconds, backward, layout, forward)) {
        for (std::size_t s = 0; s < segments; ++s) forward_samples[s].push_back(forward[s]);
      } else {
        all_hooked = false;
      }
      forward_totals.push_back(step.forward_seconds);
      data_samples.push_back(data_seconds);
      update_samples.push_back(update_seconds);
    }
    if (options.progress) options.progress("iterations", t + 1, total);
  }

  MeasuredProfile measured;
  measured.forward_from_hooks = all_hooked;
  measured.backward_all_reported = all_reported;
  ModelProfile& profile = measured.profile;
  profile.model = options.model;
  profile.batch = static_cast<int>(options.batch);
  profile.data_seconds = median(data_samples);
  profile.update_seconds = median(update_samples);
  std::vector<double> backward_medians(segments);
  for (std::size_t s = 0; s < segments; ++s) backward_medians[s] = median(backward_samples[s]);
  std::vector<double> forward_medians(segments, 0.0);
  if (all_hooked) {
    for (std::size_t s = 0; s < segments; ++s) forward_medians[s] = median(forward_samples[s]);
  } else {
    split(median(forward_totals), 0, segments, backward_medians, layout, forward_medians);
  }
  for (std::size_t s = 0; s < segments; ++s) {
    const Segment& segment = layout.segment(s);
    profile.layers.push_back({segment.name, segment.count, forward_medians[s], backward_medians[s]});
  }
  if (options.progress) options.progress("codecs", total, total);
  profile.codecs = measure_codec_costs(gradients, options.codec_repetitions);
  for (const MethodDescriptor* method : method_registry()) {
    if (!method->measure_costs) continue;
    for (const auto& [name, seconds] : method->measure_costs(layout.total(), options.sgd, options.codec_repetitions)) {
      profile.method_costs[name] = seconds;
    }
  }
  return measured;
}

void adopt_run_compute(MeasuredProfile& measured, const RunCompute& run) {
  ModelProfile& profile = measured.profile;
  const std::size_t layers = profile.layers.size();
  if (run.layers.backward_seconds.size() != layers) {
    throw UsageError(concat("profile: the run measured ", run.layers.backward_seconds.size(),
                            " layers, the profile has ", layers));
  }
  if (!measured.backward_all_reported) {
    throw UsageError("profile: the model does not report every layer's backward, so a run cannot measure them");
  }
  double profiled_forward = 0, parameters = 0;
  for (const ProfiledLayer& layer : profile.layers) {
    profiled_forward += layer.forward_seconds;
    parameters += static_cast<double>(layer.parameters);
  }
  const double forward = std::max(0.0, run.layers.forward_seconds - profile.data_seconds);
  for (std::size_t l = 0; l < layers; ++l) {
    ProfiledLayer& layer = profile.layers[l];
    const double share = profiled_forward > 0 ? layer.forward_seconds / profiled_forward
                         : parameters > 0     ? static_cast<double>(layer.parameters) / parameters
                                              : 1.0 / static_cast<double>(layers);
    layer.forward_seconds = forward * share;
    layer.backward_seconds = std::max(0.0, run.layers.backward_seconds[l]) +
                             (l == 0 ? std::max(0.0, run.backward_tail_seconds) : 0.0);
  }
  profile.update_seconds = std::max(0.0, run.update_seconds);
  profile.bucket_launch_seconds = std::max(0.0, run.layers.per_bucket_compute_seconds);
  measured.run_workers = run.workers;
  measured.run_network = run.network;
}

std::map<std::string, CodecCost> measure_codec_costs(std::span<const float> values, int repetitions) {
  if (repetitions < 1) throw UsageError(concat("codec timing: repetitions must be >= 1, got ", repetitions));
  std::map<std::string, CodecCost> costs;
  const double bytes = static_cast<double>(values.size() * sizeof(float));
  for (const std::string& name : codec_names()) {
    const std::unique_ptr<Codec> codec = make_codec(name);
    std::vector<std::byte> message(codec->encoded_bytes(values.size()));
    std::vector<float> destination(values.begin(), values.end());
    CodecCost& cost = costs[name];
    if (values.empty()) continue;
    cost.encode = median_seconds(repetitions, [&] { codec->encode(values, message); }) / bytes;
    cost.decode = median_seconds(repetitions, [&] { codec->decode(message, destination); }) / bytes;
    cost.decode_add = median_seconds(repetitions, [&] { codec->decode_add(message, destination); }) / bytes;
  }
  return costs;
}

MeasuredProfile measure_concurrent_profile(const std::vector<Model*>& models, const Dataset& train,
                                           const ProfilingOptions& options) {
  if (models.empty()) throw UsageError("profile: at least one model replica is needed");
  std::vector<MeasuredProfile> measured(models.size());
  std::vector<std::exception_ptr> errors(models.size());
  {
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < models.size(); ++r) {
      threads.emplace_back([&, r] {
        ProfilingOptions own = options;
        if (r > 0) own.progress = {};
        try {
          measured[r] = measure_model_profile(*models[r], train, own);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
  }
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  MeasuredProfile mean = measured.front();
  const double n = static_cast<double>(models.size());
  mean.replicas = static_cast<int>(models.size());
  mean.profile.data_seconds = mean.profile.update_seconds = 0;
  for (ProfiledLayer& layer : mean.profile.layers) layer.forward_seconds = layer.backward_seconds = 0;
  for (auto& [name, cost] : mean.profile.codecs) cost = {};
  for (auto& [name, cost] : mean.profile.method_costs) cost = 0;
  for (const MeasuredProfile& one : measured) {
    mean.forward_from_hooks = mean.forward_from_hooks && one.forward_from_hooks;
    mean.backward_all_reported = mean.backward_all_reported && one.backward_all_reported;
    mean.profile.data_seconds += one.profile.data_seconds / n;
    mean.profile.update_seconds += one.profile.update_seconds / n;
    for (std::size_t l = 0; l < mean.profile.layers.size(); ++l) {
      mean.profile.layers[l].forward_seconds += one.profile.layers[l].forward_seconds / n;
      mean.profile.layers[l].backward_seconds += one.profile.layers[l].backward_seconds / n;
    }
    for (auto& [name, cost] : mean.profile.codecs) {
      const CodecCost theirs = one.profile.codec_cost(name);
      cost.encode += theirs.encode / n;
      cost.decode += theirs.decode / n;
      cost.decode_add += theirs.decode_add / n;
    }
    for (auto& [name, cost] : mean.profile.method_costs) cost += one.profile.method_costs.at(name) / n;
  }
  return mean;
}

MeasuredProfile profile_model(const std::vector<Model*>& models, const DataSplits& data, const ProfilingOptions& options,
                              const std::optional<InRunProfiling>& in_run) {
  MeasuredProfile measured = measure_concurrent_profile(models, data.train, options);
  if (in_run) {
    if (options.progress) options.progress("run", 0, in_run->config.iterations);
    const RunSummary run = run_training(in_run->config, in_run->factory, data);
    const PlanningInputs* planned = run.figures.report->planning_inputs();
    PIPESGD_ASSERT(planned != nullptr);  // the profiling method plans within its iterations
    adopt_run_compute(measured, RunCompute{planned->profile, planned->update_seconds, planned->backward_tail_seconds,
                                           in_run->config.workers, describe(in_run->config.network)});
  }
  measured.profile.source = measured_profile_source(measured, host_name(), today(), options.iterations);
  return measured;
}

std::string measured_profile_source(const MeasuredProfile& measured, const std::string& host, const std::string& date,
                                    std::int64_t iterations) {
  std::string source = concat("measured by pipesgd profile on ", host, ", ", date, ", ", iterations,
                              iterations == 1 ? " iteration" : " iterations", ", batch ", measured.profile.batch);
  if (measured.replicas > 1) {
    source += concat(", ", measured.replicas, " replicas at once (the mean of their medians)");
  }
  if (measured.run_workers > 0) {
    source += concat("; each layer's backward, the forward and the update are means of a ", measured.run_workers,
                     "-worker D-Sync run over network ", measured.run_network,
                     " (the layer-wise profiling phase), the forward split over the layers as the profile measured it");
  }
  if (!measured.forward_from_hooks) {
    source += "; the model reports no forward progress: each layer's forward_seconds is the whole forward split in "
              "proportion to the layers' backward times";
  }
  if (!measured.backward_all_reported) {
    source += "; the model did not report every layer's backward: the rest of backward is split over those layers "
              "by parameter count";
  }
  return source;
}

}  // namespace pipesgd
