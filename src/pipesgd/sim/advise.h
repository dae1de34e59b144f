#pragma once
// `pipesgd advise`: every method's configurations (the variants its registry entry proposes,
// MethodDescriptor::advise, times the codecs) simulated at one world size (method_simulation.h),
// ranked by throughput, each with what it trades in accuracy, and the one recommended: the fastest,
// unless it trades accuracy for less than a minimum gain over the fastest that trades none.
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipesgd/sim/method_simulation.h"

namespace pipesgd {

struct AdviseRequest {
  int workers = 16;
  std::vector<std::string> codecs = {"none", "bf16", "int8"};  // tried with the methods that take one
  std::vector<std::string> methods;                            // empty: every method
  // The gain in throughput over the fastest configuration without an accuracy trade below which a
  // faster one that trades accuracy is not recommended (0.05: 5%).
  double min_gain = 0.05;
  MethodSimulationOptions simulation;  // every option but the world size
};

// One configuration advise ranks.
struct AdvisedConfiguration {
  SimulationJob job;               // at AdviseRequest::workers; labelled "<spec> <flags>"
  std::vector<std::string> costs;  // accuracy trades, with their sources (none: empty)
  std::string command_flags;       // the variant's flags as a command line gives them: " --staleness-k 3"
  int servers = 0;
  std::string unbuildable;         // why it cannot run here (its servers do not fit the topology), if so
};

// The configurations of every method (or of request.methods) that has a variant to advise and a
// schedule for the simulator, in the registry's order, each variant with each codec of
// request.codecs if the method takes --codec. Throws UsageError for an unknown codec or method, for
// no configuration at all, and if the workers alone do not fit the topology (check_fits_topology;
// a configuration whose servers make it not fit is marked unbuildable instead).
std::vector<AdvisedConfiguration> advised_configurations(const AdviseRequest& request);

// Simulates `jobs` and returns their results in order, a job that cannot be built marked
// unbuildable (simulate_methods with skip_unbuildable); the caller's, for its progress output.
using SimulationRunner = std::function<std::vector<MethodSimulationResult>(const std::vector<SimulationJob>& jobs)>;

struct Advice {
  std::vector<AdvisedConfiguration> configurations;
  std::vector<MethodSimulationResult> results;  // per configuration; `unbuildable` set where not simulated
  // What was simulated (the configurations that could be built), and their results.
  std::vector<SimulationJob> simulated_jobs;
  std::vector<MethodSimulationResult> simulated_results;
  // The configurations simulated, by throughput, fastest first; configurations as fast (to a
  // relative 1e-9) keep the one that trades less, then the registry's order (K = 2 before K = 3).
  std::vector<std::size_t> ranking;
  std::vector<std::size_t> skipped;  // those that could not be simulated, in order
  // What the speedups are against: plain D-Sync, the first configuration of the registry's first
  // method (the first one simulated, with AdviseRequest::methods).
  std::size_t baseline = 0;
  std::size_t recommended = 0;
  // The fastest configuration without an accuracy trade, if any was simulated.
  std::optional<std::size_t> fastest_without_trade;
  // If the fastest configuration trades accuracy and fastest_without_trade exists: how much faster
  // it is (0.1: 10%); the recommendation is fastest_without_trade if that is below min_gain.
  std::optional<double> gain;

  std::size_t fastest() const { return ranking.front(); }
  double throughput(std::size_t i) const { return results[i].samples_per_second; }
  // throughput(i) / throughput(baseline), 0 if the baseline's is 0.
  double speedup(std::size_t i) const;
};

// Simulates `configurations` (advised_configurations(request)'s) with `simulate` and ranks them.
// Throws UsageError if none could be simulated.
Advice advise(const AdviseRequest& request, std::vector<AdvisedConfiguration> configurations,
              const SimulationRunner& simulate);

}  // namespace pipesgd
