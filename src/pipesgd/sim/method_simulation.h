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
//             takes the alpha-beta time of MG-WFBP Table II (timing/allreduce_cost_model.h) for the
//             link's latency and bandwidth and the codec's per-byte costs: for large worlds.
//   auto      messages up to kMessageLevelWorkers workers, model above.
#include <cstdint>
#include <string>

#include "pipesgd/algo/registry.h"
#include "pipesgd/sim/platform.h"
#include "pipesgd/timing/model_profile.h"

namespace pipesgd {

enum class CollectiveSimulation { kAuto, kMessages, kModel };
inline constexpr int kMessageLevelWorkers = 16;
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
};

// Per iteration, in the steady state (means over the measured iterations and the workers).
struct MethodSimulationResult {
  std::string schedule;            // the method's describe(): plan, K, ...
  std::string allreduce;           // the algorithm its allreduces ran
  std::string collectives;         // "messages" or "model"
  double iteration_seconds = 0;
  double compute_seconds = 0;      // the compute thread's own work (data, forward, backward, update, ...)
  double exposed_seconds = 0;      // iteration - compute: waits and allreduces on the compute thread
  double allreduce_seconds = 0;    // time inside allreduce calls, on any thread
  double samples_per_second = 0;   // workers x batch / iteration
  std::int64_t measured_iterations = 0;
};

// Simulates `selection` on `profile` in an isolated simulation process. Throws UsageError if the
// method has no schedule for the simulator, for bad options (workers < 1, no bandwidth, jitter < 0
// or not finite, iterations < 1), and what the schedule throws (e.g. a bucket plan's UsageError).
MethodSimulationResult simulate_method(const MethodSelection& selection, const ModelProfile& profile,
                                       const MethodSimulationOptions& options);

}  // namespace pipesgd
