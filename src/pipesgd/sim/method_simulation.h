#pragma once
// A training method simulated on a cluster: every worker's compute thread runs the trainer's loop
// with the profile's times and calls the method's schedule (algo/simulated_method.h) where the
// runtime calls the method; its comm thread runs the schedule's comm loop. Each worker is a SimGrid
// host; its threads are actors on it.
//
// Collectives:
//   messages  the runtime's own allreduce algorithm over SimTransport (sim/sim_transport.h): every
//             message a SimGrid communication of its exact size, the codec's work charged as CPU
//             time. Exact to the network model; real arithmetic on real buffers, so it costs memory
//             and time in proportion to workers x parameters.
//   model     the workers meet (the collective starts when the last one calls it) and the allreduce
//             takes its rounds' time on the simulated platform (sim/collective_rounds.h: each
//             distinct round of concurrent flows played once on the whole world's topology and
//             network model, affine in the bytes) plus the codec's per-byte costs: for large worlds.
//             On a flat switch with the ideal model that is MG-WFBP Table II exactly.
//   auto      messages up to kMessageLevelWorkers workers while their estimated cost
//             (message_level_cost) stays within kMessageLevelBudget, model otherwise
//             (choose_collective_level says which and why).
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>
#include <string>

#include "pipesgd/algo/registry.h"
#include "pipesgd/sim/platform.h"
#include "pipesgd/timing/model_profile.h"

namespace pipesgd {

enum class CollectiveSimulation { kAuto, kMessages, kModel };
inline constexpr int kMessageLevelWorkers = 16;
// What a message-level simulation costs, in element operations: every simulated iteration, every
// worker reduces and copies its whole gradient (workers x parameters), and each of its messages
// costs SimGrid about as much as kElementsPerMessage elements (ring: 2 (workers - 1) per allreduce,
// at most one allreduce per layer and iteration: an upper bound).
inline constexpr double kElementsPerMessage = 1000;
// Above this the auto level simulates the modelled collectives: ~3 s of one core here (AlexNet's
// 61.1 M parameters at 16 workers cost ~2.4e10, ~80 s; the MNIST MLP's 0.65 M at 16 workers ~2.6e8).
inline constexpr double kMessageLevelBudget = 1e9;
double message_level_cost(int workers, std::size_t parameters, std::size_t layers, std::int64_t iterations);

// The level a simulation's collectives run at and why: the choice of `requested` (auto picks by
// workers and message_level_cost over `iterations`, the simulated ones with the lead-in).
struct CollectiveLevel {
  bool messages = true;
  std::string reason;  // e.g. "auto: message level would cost 2.4e10 element operations (budget 1e9)"
};
CollectiveLevel choose_collective_level(CollectiveSimulation requested, int workers, std::size_t parameters,
                                        std::size_t layers, std::int64_t iterations);

// "auto" | "messages" | "model"; UsageError naming `name` otherwise.
CollectiveSimulation parse_collective_simulation(const std::string& text, const char* name = "--collectives");
const char* collective_simulation_name(CollectiveSimulation mode);

struct MethodSimulationOptions {
  int workers = 2;
  NetworkSpec link;  // every worker's NIC
  SimNetworkModel model = SimNetworkModel::kIdeal;
  SimTopology topology;
  std::int64_t iterations = 20;  // measured, after the warm-up and the pipeline's fill
  // Stragglers: each worker's compute in each iteration takes 1 + jitter x u times the profile's,
  // u uniform in [0, 1) from `seed` (0: no jitter).
  double compute_jitter = 0;
  std::uint64_t seed = 1;
  // The comm thread's CPU work (codecs, reduction) runs on the compute thread's core (a CPU-only
  // worker, like the 2-core machine the runtime is measured on) instead of a core of its own (an
  // accelerator computes while the host CPU communicates).
  bool comm_shares_core = false;
  CollectiveSimulation collectives = CollectiveSimulation::kAuto;
  // Record the timeline (MethodSimulationResult::trace_events): every compute span on its own, so
  // slower for large worlds.
  bool trace = false;
};

// The compute thread's time per iteration by stage, as the trainer's IterationTimes names them
// (report/metrics_file.cpp times_to_json): data, forward, backward, update (local updates too),
// compensation, wait (the rest of the iteration: waits and communication on the compute thread),
// comm (time inside allreduces and server round trips, on any thread).
struct SimulatedStages {
  double data = 0, forward = 0, backward = 0, update = 0, compensation = 0, wait = 0, comm = 0;
};

// Per iteration, in the steady state (means over the measured iterations and the workers).
struct MethodSimulationResult {
  std::string schedule;            // the method's describe(): plan, K, ...
  std::string allreduce;           // the algorithm its allreduces ran
  std::string collectives;         // "messages" or "model"
  std::string collectives_reason;  // why (CollectiveLevel::reason)
  double iteration_seconds = 0;
  double compute_seconds = 0;      // the compute thread's own work (data, forward, backward, update, ...)
  double exposed_seconds = 0;      // iteration - compute: waits and allreduces on the compute thread
  double allreduce_seconds = 0;    // time inside allreduce calls and server round trips, any thread
  SimulatedStages stages;
  double samples_per_second = 0;   // workers x batch / iteration
  std::int64_t measured_iterations = 0;
  // The measured iterations repeat with a period of at most 8 (the figure is then exact); false for
  // schedules that do not settle (e.g. asynchronous servers): a longer window's mean.
  bool periodic = true;
  // With MethodSimulationOptions::trace: Chrome trace events (the "traceEvents" of the format
  // Perfetto and chrome://tracing open), pid = worker (then the servers), tid 0 compute, 1 comm;
  // spans of compute (by stage), wait, allreduce (elements, bytes, algorithm, codec, tag) and pull;
  // times in simulated microseconds.
  nlohmann::json trace_events;
  // simulate_methods with skip_unbuildable: why this configuration could not be simulated ("" if it was).
  std::string unbuildable;
};

// Simulates `selection` on `profile` in an isolated simulation process. Throws UsageError if the
// method has no schedule for the simulator, for bad options (workers < 1, no bandwidth, jitter < 0
// or not finite, iterations < 1), and what the schedule throws (e.g. a bucket plan's UsageError).
MethodSimulationResult simulate_method(const MethodSelection& selection, const ModelProfile& profile,
                                       const MethodSimulationOptions& options);

// The collective level simulate_method will use for `selection` (with the iterations it simulates
// before measuring: the warm-up and the pipeline's fill).
CollectiveLevel simulated_collective_level(const MethodSelection& selection, const ModelProfile& profile,
                                           const MethodSimulationOptions& options);

// Many simulations, `parallel` at a time (each in its own process); results in the jobs' order.
// `progress` (may be empty) is called from the calling thread as each one starts. The first error
// is rethrown once the running ones have ended; with `skip_unbuildable`, a job whose configuration
// cannot be built (a UsageError of its own, e.g. more servers than the model has segments) is not an
// error: its result has `unbuildable` set to the message and the others run on.
struct SimulationJob {
  MethodSelection selection;
  MethodSimulationOptions options;
  std::string label;  // how reports name it (e.g. "pipe --staleness-k 3"); empty: the spec
};
inline const std::string& job_label(const SimulationJob& job) { return job.label.empty() ? job.selection.spec : job.label; }
// Throws UsageError (naming --topology) if the job's workers and servers do not fit its fat-tree
// (checked before any simulation runs).
void check_fits_topology(const SimulationJob& job);
std::vector<MethodSimulationResult> simulate_methods(const std::vector<SimulationJob>& jobs, const ModelProfile& profile,
                                                     int parallel,
                                                     const std::function<void(std::size_t index)>& progress = {},
                                                     bool skip_unbuildable = false);

}  // namespace pipesgd
