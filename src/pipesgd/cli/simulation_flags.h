#pragma once
// The flags `simulate` and `advise` share: the profile, the simulated cluster and how it is
// simulated (src/pipesgd/sim/method_simulation.h).
#include <CLI/CLI.hpp>

#include <map>
#include <string>

#include "pipesgd/sim/method_simulation.h"
#include "pipesgd/timing/model_profile.h"

namespace pipesgd {

struct SimulationFlags {
  std::string profile;
  std::string network = "10gbe";
  std::string calibration_file;
  std::string network_model = "ideal";
  std::string topology = "flat";
  std::int64_t iterations = 20;
  double compute_scale = 1;
  std::string compute_jitter = "0";
  bool comm_shares_core = false;
  std::string collectives = "auto";
  std::int64_t seed = 1;
  bool quiet = false;
};

// `calibration_flag`: add --calibration (commands that also take every method option have it
// already, as the methods' cost model: they copy its value into flags.calibration_file).
void add_simulation_flags(CLI::App& command, SimulationFlags& flags, bool calibration_flag);

// The profile (--profile, scaled by --compute-scale). Throws UsageError without --profile,
// DataError for a bad file.
ModelProfile load_simulated_profile(const SimulationFlags& flags);
// Every option but the world size. Throws UsageError naming the flag.
MethodSimulationOptions simulation_options(const SimulationFlags& flags);
// "resnet50 (107 layers, 25557032 parameters, batch 32) on 10 Gbit/s, 20 us latency, simgrid network
// model, topology flat".
std::string describe_simulation(const ModelProfile& profile, const MethodSimulationOptions& options);
// "compute: the profile's times are for <device> ...": the device the profile stands for (its
// "device" field, or who measured it) and how to change it (--compute-scale, pipesgd profile).
std::string describe_compute_device(const SimulationFlags& flags);
// Runs `jobs` two (the cores) at a time, with progress on stderr unless quiet: a line per job, with
// its collective level (on a terminal, one line that updates). `skip_unbuildable`: see
// simulate_methods.
std::vector<MethodSimulationResult> run_simulation_jobs(const std::vector<SimulationJob>& jobs, const ModelProfile& profile,
                                                        bool quiet, bool skip_unbuildable = false);
// "collectives: modelled for 46 simulations (auto: ...)": how many simulations ran at each level
// and why (the first one's reason, "e.g." if the others' differ); "" if none had collectives.
std::string describe_collective_levels(const std::vector<SimulationJob>& jobs,
                                       const std::vector<MethodSimulationResult>& results);

}  // namespace pipesgd
