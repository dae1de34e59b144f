#pragma once
// A method's registry entry: everything the CLI, the trainer and the reports know
// about a method, declared in one place (its folder under algo/, listed in algo/registry.cpp). See
// docs/ARCHITECTURE.md, "Adding a method".
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/algo/method_options.h"
#include "pipesgd/algo/method_report.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/algo/simulated_method.h"
#include "pipesgd/algo/training_method.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/model.h"
#include "pipesgd/optim/sgd.h"
#include "pipesgd/ps/parameter_server.h"

namespace pipesgd {

// What one worker's method is built from.
struct MethodContext {
  // The method's transport: the workers; for a method with servers (MethodOptions::servers() > 0)
  // the run's whole transport, workers first, then the servers.
  Transport& transport;
  FlatParameters& model;         // outlives the method
  const CommonOptions& common;
  const MethodOptions& options;  // the descriptor's own options type
  std::int64_t warmup_iterations = 0;  // MethodOptions::warmup() in iterations
  // The emulated network, if any (none under MPI): the cost model planning methods start from
  // before they measure their own (algo/planning.h).
  NetworkSpec network;
  // common.lr_schedule bound to the run's length. The rule every method keeps: the update that
  // applies the gradient of iteration t uses learning_rate_schedule.factor(t)
  // (Optimizer::set_learning_rate_factor before it), whenever that update happens.
  LrSchedule learning_rate_schedule{};
  // The first iteration the method runs (begin_iteration's first t): 0, or where `auto`
  // (algo/auto/) switches to it mid-run with the model's parameters and the optimizer's state as
  // the method before left them (nothing in flight).
  std::int64_t first_iteration = 0;
  // What `auto` measured (averaged over the workers, identical on each): a planning method plans
  // its buckets from it at once instead of profiling first. nullptr: the method profiles itself.
  const PlanningInputs* planned_from = nullptr;
  // A planning method built at iteration 0 profiles after this many start-up iterations (`auto`'s
  // profiler after fewer: kAutoProfileWarmupIterations).
  std::int64_t profile_warmup_iterations = kProfileWarmupIterations;
  // Prints one line about the run as it goes (`auto`'s choices), on rank 0's stderr after
  // "pipesgd: "; empty on the other ranks and where nobody reads it.
  std::function<void(const std::string& line)> announce{};
};

// A method's prediction of its steady-state iteration, from a run's averaged measurements.
struct IterationPrediction {
  double seconds = 0;
  double compute_seconds = 0;    // the compute thread's work: t_f + backward + its tail + update
  double exposed_seconds = 0;    // communication not hidden behind computation
  std::string model;             // how it was computed: "Eq. 4: max(compute, allreduce)"
};

// Facts about a method that do not depend on its options.
struct MethodTraits {
  // Every replica holds the same weights between iterations (--check-consistency applies).
  bool replicas_identical = false;
  // Workers push to and pull from parameter servers (MethodOptions::servers() ranks) instead of
  // allreducing: --inject-fault at=push applies, at=allreduce does not.
  bool uses_servers = false;
  // Communicates nothing (nocomm): the compute-alone baseline compare measures each method's
  // compute stretch against.
  bool compute_alone = false;
  // Applies gradients K-1 steps stale with nothing compensating the staleness (pipe): momentum
  // amplifies them, so train warns at high momentum.
  bool stale_without_compensation = false;
  // Applies its synchronous layers' updates just before each layer's forward (sapipe): a caller that
  // runs forward itself (the Python API) must report each layer's forward (before_layer_forward).
  bool needs_forward_hooks = false;
};

// A configuration of a method worth simulating for `pipesgd advise`, and what it trades.
struct AdvisedVariant {
  std::string spec;           // a method spec, e.g. "pipe"
  OptionValues flags;         // e.g. --staleness-k 3
  std::string accuracy_cost;  // what it trades in accuracy and what the papers and our runs say; "" for nothing
};

struct MethodDescriptor {
  std::string name;     // as in a method spec: "pipe"
  std::string summary;  // one line for --help and docs
  // What a commit (a checkpoint set, train/elastic.h) of this method holds beyond every method's
  // part (the weights, the model's buffers, the epoch's place and sums, the run's history): the
  // state from which it goes on exactly as an uninterrupted run. One sentence, for docs and
  // `pipesgd methods`-style listings.
  std::string commit;
  MethodTraits traits;
  // The options the method takes, flags and spec parts (algo/method_options.h).
  std::vector<OptionDeclaration> options;
  // Parses and validates the method's options from what was given (defaults for the rest); throws
  // UsageError naming the flag.
  std::function<std::shared_ptr<const MethodOptions>(const OptionValues& given)> parse;
  // Builds one worker's method; throws UsageError for what only the model can tell (e.g. more
  // stale layers than it has).
  std::function<std::unique_ptr<TrainingMethod>(const MethodContext& context)> make;
  // Parameter-server methods: how a server rank serves the `workers` workers.
  std::function<ServeOptions(const MethodOptions& options, const CommonOptions& common, int workers)> serve;
  // A message for a `+part` of a spec the method does not take ("" for the generic one).
  std::function<std::string(std::string_view part)> spec_hint;
  // The method's schedule for the simulator (algo/simulated_method.h), one per simulated worker.
  std::function<std::unique_ptr<SimulatedMethod>(const SimulationContext& context)> simulate;
  // The variants `pipesgd advise` ranks at `workers` workers (the codecs are varied by advise itself
  // for methods that take --codec).
  std::function<std::vector<AdvisedVariant>(int workers)> advise;
  // Work of the method's own that `pipesgd profile` measures for the simulator: seconds per
  // parameter by "<method>:<variant>" (timing/model_profile.h's method_costs), timed over `elements`
  // parameters with the trainer's optimizer `sgd`, the median of `repetitions`. Empty: none.
  std::function<std::map<std::string, double>(std::size_t elements, const SgdOptions& sgd, int repetitions)>
      measure_costs;
  // The iteration time of the method with `options` and `common` (its codec) in steady state at
  // `workers` workers, predicted from `measured` (a layer-wise D-Sync profile of uncompressed
  // gradients and a + b·M of this run's allreduce, algo/planning.h): how `--algo auto` (algo/auto/)
  // ranks its candidates. Empty: auto never chooses the method.
  std::function<IterationPrediction(const MethodOptions& options, const CommonOptions& common,
                                    const PlanningInputs& measured, int workers)>
      predict;
  // Tables `compare` prints for this method's family.
  std::vector<ComparisonTable> tables;
};

// The descriptor's options as their own type (asserted).
template <typename Options>
const Options& options_as(const MethodOptions& options) {
  const auto* typed = dynamic_cast<const Options*>(&options);
  PIPESGD_ASSERT(typed != nullptr);
  return *typed;
}

}  // namespace pipesgd
