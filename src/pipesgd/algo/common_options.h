#pragma once
// The options every method is built with beside its own (algo/method_options.h): the gradient
// codec, the allreduce algorithm and its segmenting, the optimizer, and the timeout of every wait
// on a peer. Methods that do not allreduce or take no optimizer choice do not declare the flags
// that set them, so a user cannot set them for such a method.
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "pipesgd/algo/method_options.h"
#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/optim/lr_schedule.h"
#include "pipesgd/optim/optimizer.h"
#include "pipesgd/timing/allreduce_cost_model.h"

namespace pipesgd {

struct CommonOptions {
  std::string codec = "none";  // collective/codec.h
  // Allreduce algorithm (collective/allreduce_factory.h) or "auto": the least predicted time for
  // the gradient's size from `calibration` (nullptr: default_link_parameters()).
  std::string allreduce = "ring";
  // kAutoSegmentBytes lets the method choose (MethodOptions::default_segment_bytes).
  std::size_t segment_bytes = kAutoSegmentBytes;
  std::shared_ptr<const Calibration> calibration;  // --calibration, or nullptr
  Timeout timeout = std::chrono::seconds(120);     // every wait on a peer (--comm-timeout)
  // How long the compute thread polls for its comm thread's job before it blocks
  // (comm/comm_worker.h); 0: it blocks at once. The trainer sets it (wait_spin_for).
  std::chrono::microseconds wait_spin{0};
  // The optimizer and its hyper-parameters (Adam's learning rate and L2 are SGD's --lr and
  // --weight-decay). The parameter-server methods' servers run optimizer.sgd.
  OptimizerOptions optimizer;
  // The run's learning-rate schedule (--lr-schedule, --lr-warmup; optim/lr_schedule.h): it scales
  // every learning rate of every method alike. Bound to the run's length in make_method
  // (MethodContext::learning_rate_schedule) and for the servers (ServeOptions).
  LrScheduleSpec lr_schedule;
};

// The flags that set CommonOptions, for the methods that take them: the allreduce family (--codec,
// --allreduce, --segment-bytes, --calibration) and the optimizer family (--optimizer, --adam-beta1,
// --adam-beta2, --adam-eps). --calibration is the cost model of --allreduce auto and of bucket plans:
enum class CalibrationUse {
  kWithAllreduceAuto,   // it applies with --allreduce auto only
  kWithAutoOrBuckets,   // ... or with --buckets (dsync)
  kAlways,              // the method always plans buckets
};
std::vector<OptionDeclaration> allreduce_option_declarations(CalibrationUse calibration);
std::vector<OptionDeclaration> optimizer_option_declarations();
// Both, as every allreduce method with an optimizer choice takes them.
std::vector<OptionDeclaration> allreduce_method_declarations(CalibrationUse calibration);

// --warmup-epochs and --warmup-iters as the methods with a synchronous warm-up declare them (`what`
// the warm-up iterations do, e.g. "run as D-Sync"; `iterations_default` for the help), and their
// parse: each in [0, kMaxWarmup]; `iterations_default` when neither is given.
inline constexpr std::int64_t kMaxWarmup = 10'000'000;
std::vector<OptionDeclaration> warmup_declarations(const std::string& what, const std::string& iterations_default);
WarmUp parse_warmup(const OptionValues& given, std::int64_t iterations_default);
// The phase after a warm-up of `warmup_iterations` (nullopt for none): `event` starts then, and
// until then the method runs as `before` says.
std::optional<DeferredPhase> warmup_phase(std::int64_t warmup_iterations, std::string event, std::string before);

// CommonOptions::wait_spin for a run of `workers` workers as threads of this process whose waits
// sleep: kWaitSpin when every worker has a core of its own (the processors this process may run on),
// else 0 (a spinning compute thread would take processor time from another worker's).
inline constexpr std::chrono::microseconds kWaitSpin{2000};
std::chrono::microseconds wait_spin_for(int workers);

// `base` (the run's SGD hyper-parameters and timeout) with the values given for the flags above;
// loads the calibration file. Throws UsageError naming the flag, DataError for a bad file.
CommonOptions parse_common_options(const OptionValues& given, CommonOptions base);

// The allreduce algorithm `options` run for `bytes` per rank on `world_size` ranks ("auto"
// resolved through the cost model).
std::string resolve_allreduce_algorithm(const CommonOptions& options, int world_size, double bytes);

// The allreduce options of a method whose `auto` segmenting is `default_segment_bytes`.
AllreduceOptions method_allreduce_options(const CommonOptions& options, std::size_t default_segment_bytes);

// Builds a method's gradient allreduce for `count` elements over `transport` (algorithm resolved
// for the whole gradient of `count` floats); an "allreduce" span of the trace where a run records one.
std::unique_ptr<Allreduce> make_method_allreduce(const CommonOptions& options, Transport& transport, std::size_t count,
                                                 const Codec& codec, std::size_t default_segment_bytes);

// "codec int8, allreduce ring, optimizer sgd lr 0.1 momentum 0 decay 0": what of `options`
// changes the math (a checkpoint's fingerprint); a schedule other than constant adds
// ", lr schedule step:1:0.5, warm-up 10 iterations".
std::string fingerprint(const CommonOptions& options);

}  // namespace pipesgd
