#pragma once
// `pipesgd profile`: a model's profile (timing/model_profile.h) measured on this machine, as one
// worker of a D-Sync run computes: per iteration the batch is fetched as the trainer fetches it
// (ShardedSampler of one worker, BatchAssembler), the model runs forward and backward, and plain SGD
// (optim/sgd.h) updates the whole flat parameter vector. A few untimed warm-up iterations come
// first; every figure is the median over the measured iterations.
//
//   parameters        each Layout segment's element count
//   backward_seconds  the time the model reports per segment through SegmentReadyFn; a segment it
//                     does not report in an iteration shares what is left of that iteration's
//                     backward with the other unreported ones, by parameter count
//   forward_seconds   a model that reports forward progress (FlatParameters::set_forward_hook):
//                     the time from one hook call to the next (the time before the first call goes
//                     to the first group, the time after the last one, the loss included, to the
//                     last), a group of several segments split by their backward times; otherwise
//                     the whole forward (StepResult::forward_seconds) split over the layers in
//                     proportion to their backward times (by parameter count if those are all 0)
//   data_seconds      fetching one batch
//   update_seconds    one Sgd::step over all parameters
//   codecs            every codec of collective/codec.h timed on the last gradient: encode, decode
//                     and decode_add of the whole buffer, median of `codec_repetitions` after one
//                     untimed run, divided by its fp32 bytes
//   method_costs      every registered method's own work (MethodDescriptor::measure_costs, e.g.
//                     SAPipe's stale update with each compensation) over all parameters, per
//                     parameter, median of `codec_repetitions`
// Runs on the calling thread; LibTorch's thread count is the caller's (init_torch_runtime).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/optim/sgd.h"
#include "pipesgd/timing/bucket_plan.h"
#include "pipesgd/timing/model_profile.h"
#include "pipesgd/train/run_config.h"

namespace pipesgd {

inline constexpr std::int64_t kProfilingWarmupIterations = 3;
inline constexpr std::int64_t kDefaultProfilingIterations = 20;
inline constexpr int kCodecTimingRepetitions = 9;

struct ProfilingOptions {
  std::string model;  // the profile's model name
  std::size_t batch = 25;
  std::int64_t warmup_iterations = kProfilingWarmupIterations;  // untimed, >= 0
  std::int64_t iterations = kDefaultProfilingIterations;        // measured, >= 1
  std::uint64_t seed = 1;                                       // the data order
  SgdOptions sgd;                                               // the update timed (train's defaults)
  int codec_repetitions = kCodecTimingRepetitions;              // >= 1
  // Called after every iteration (warm-up ones included: done of total = warm-up + measured) and
  // once more with phase "codecs" before the codecs are timed; profile_model adds phase "run" (0 of
  // the run's iterations) before its run starts. May be empty.
  std::function<void(const std::string& phase, std::int64_t done, std::int64_t total)> progress;
};

struct MeasuredProfile {
  ModelProfile profile;             // everything but `source` (left empty)
  int replicas = 1;                 // models measured at once (measure_concurrent_profile)
  bool forward_from_hooks = false;  // false: the whole forward split by backward times
  bool backward_all_reported = true;  // false: some segment's backward was inferred (see above)
  // adopt_run_compute: the workers of the run whose compute the profile carries (0: none), and its
  // network as describe(NetworkSpec) names it.
  int run_workers = 0;
  std::string run_network;
};

// Measures `model` on batches of `train` (UsageError for options out of range, or a batch larger
// than the data set).
MeasuredProfile measure_model_profile(Model& model, const Dataset& train, const ProfilingOptions& options);

// `models.size()` replicas measured at once, each on a thread of its own, as the trainer's workers
// compute side by side (they share the machine's cores, caches and memory bandwidth as a run's
// workers do); the profile is the mean over the replicas of each one's figures (medians), codec costs
// included. `options.progress` reports replica 0's progress. Throws as measure_model_profile (the
// first replica's error), UsageError for no model.
MeasuredProfile measure_concurrent_profile(const std::vector<Model*>& models, const Dataset& train,
                                           const ProfilingOptions& options);

// What a run of W workers measured while they computed and communicated: the layer-wise methods'
// profiling phase (algo/planning.h: D-Sync with one allreduce after backward), means over its
// iterations and workers. `run.backward_seconds` is per segment of the profiled model's layout,
// `run.forward_seconds` the time before backward (data + forward).
struct RunCompute {
  LayerProfile layers;
  double update_seconds = 0;
  double backward_tail_seconds = 0;  // PlanningInputs::backward_tail_seconds
  int workers = 0;
  std::string network;  // describe(NetworkSpec)
};

// Makes `measured` carry the run's compute (the contention of its workers, comm threads and links,
// which no side-by-side profile reproduces): each layer's backward is the run's, and backward's
// tail (after the last gradient is ready) is added to segment 0's, the one backward computes last,
// so that the layers sum to the run's whole backward; the run's forward
// (its time before backward less the profile's data time, at least 0) is split over the layers in
// the proportions of the profile's own forward times (by parameter count if those are all 0); the
// update and kappa (bucket_launch_seconds: run.layers.per_bucket_compute_seconds) are the run's. Data time and codec and method costs stay the profile's. UsageError if the
// run's layers are not the profile's, or if the model did not report every layer's backward.
void adopt_run_compute(MeasuredProfile& measured, const RunCompute& run);

// A run whose compute the profile carries (profile --in-run): the layer-wise methods' profiling method
// (cli_common.h's layer_wise_profiling_config) on config.workers threads over config.network.
struct InRunProfiling {
  TrainConfig config;
  ModelFactory factory;  // the profiled model's
};

// `pipesgd profile`'s measurement: `models` (replicas of one model, seeded alike) measured at once on
// batches of data.train (measure_concurrent_profile), then, with `in_run`, that run (run_training, on
// `data`) and its compute adopted (adopt_run_compute); the profile's `source` names this host, today's
// date and options.iterations (measured_profile_source). Throws as those do.
MeasuredProfile profile_model(const std::vector<Model*>& models, const DataSplits& data, const ProfilingOptions& options,
                              const std::optional<InRunProfiling>& in_run);

// CPU seconds per fp32 byte of encode, decode and decode_add of every codec (codec_names()) on a
// buffer holding `values`: the median of `repetitions` timed runs after one untimed one.
std::map<std::string, CodecCost> measure_codec_costs(std::span<const float> values, int repetitions);

// The profile's `source`: "measured by pipesgd profile on HOST, DATE, N iterations, batch B" (", R
// replicas at once" for R > 1), and
// how the per-layer figures were derived where the model did not report them.
std::string measured_profile_source(const MeasuredProfile& measured, const std::string& host, const std::string& date,
                                    std::int64_t iterations);

}  // namespace pipesgd
