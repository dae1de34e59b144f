#include "pipesgd/cli/simulation_flags.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <thread>
#include <unistd.h>

#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/json_file.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/timing/allreduce_cost_model.h"

namespace pipesgd {
namespace {

// "10%" or "0.1" -> 0.1. Throws UsageError naming --compute-jitter.
double parse_jitter(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  const std::string rest(end ? end : "");
  if (rest == "%") value /= 100;
  if (end == text.c_str() || (!rest.empty() && rest != "%") || !std::isfinite(value) || value < 0 || value > 100) {
    throw UsageError(concat("--compute-jitter '", text, "': expected a fraction >= 0 or a percentage, e.g. 0.1 or 10%"));
  }
  return value;
}

// The simulated NICs: --net, or the link a calibration measured (its alpha and beta).
NetworkSpec simulated_link(const SimulationFlags& flags) {
  if (flags.calibration_file.empty()) {
    const NetworkSpec link = parse_network_spec(flags.network, "--net");
    if (!(link.bits_per_second > 0)) {
      throw UsageError(concat("--net ", flags.network, ": the simulator needs a bandwidth (e.g. 10gbe or bw=10Gbit,lat=20us)"));
    }
    return link;
  }
  const Calibration calibration = load_calibration(flags.calibration_file);
  if (!(calibration.link.beta > 0)) {
    throw DataError(concat("calibration file '", flags.calibration_file, "' has no bandwidth (beta 0)"));
  }
  NetworkSpec link;
  link.bits_per_second = 8.0 / calibration.link.beta;
  link.latency_seconds = calibration.link.alpha;
  link.name = concat("calibration ", flags.calibration_file);
  return link;
}

}  // namespace

void add_simulation_flags(CLI::App& command, SimulationFlags& flags, bool calibration_flag) {
  command.add_option("--profile", flags.profile, "Model profile JSON: `pipesgd profile`'s or profiles/*.json (required)");
  command.add_option("--net", flags.network, "Each worker's NIC: 1gbe, 10gbe, 25gbe, 100gbe or bw=10Gbit,lat=20us")
      ->capture_default_str();
  if (calibration_flag) {
    command.add_option("--calibration", flags.calibration_file,
                       "Instead of --net: the link (latency, bandwidth) a `pipesgd calibrate` file measured");
  }
  command.add_option("--network-model", flags.network_model,
                     "ideal (latency + bytes/bandwidth exactly, the papers' alpha-beta model) or simgrid (SimGrid's "
                     "TCP-validated LV08 model: latency x 13.01, bandwidth x 0.97, cross-traffic)")
      ->capture_default_str();
  command.add_option("--topology", flags.topology,
                     "flat (one switch) or fat-tree:LEVELS;DOWN,..;UP,..;COUNT,.. in SimGrid's notation, e.g. "
                     "fat-tree:2;16,4;1,4;1,1 (16 hosts per leaf switch on 4 uplinks)")
      ->capture_default_str();
  command.add_option("--iters", flags.iterations, "Measured iterations per simulation (after the pipeline fills)")
      ->capture_default_str();
  command.add_option("--compute-scale", flags.compute_scale,
                     "Multiply the profile's compute times (0.1: a device 10x as fast as the profiled one)")
      ->capture_default_str();
  command.add_option("--compute-jitter", flags.compute_jitter,
                     "Stragglers: each worker's compute in each iteration takes up to this much longer (e.g. 10%)")
      ->capture_default_str();
  command.add_flag("--comm-shares-core", flags.comm_shares_core,
                   "The comm thread's CPU work (codecs, reduction) competes with compute on one core (CPU workers); "
                   "by default it has its own core (an accelerator computes)");
  command.add_option("--collectives", flags.collectives,
                     concat("messages (the runtime's allreduce, message by message), model (the algorithm's rounds, each played "
                            "once on the simulated network) "
                            "or auto (messages up to ", kMessageLevelWorkers, " workers while the estimated cost, workers x "
                            "parameters x iterations + ", kElementsPerMessage, " per message, stays within ",
                            format_number("%.0g", kMessageLevelBudget), "; model otherwise)"))
      ->capture_default_str();
  command.add_option("--seed", flags.seed, "Seed of --compute-jitter")->capture_default_str();
  command.add_flag("--quiet", flags.quiet, "No progress output on stderr (by default a line per simulation)");
}

ModelProfile load_simulated_profile(const SimulationFlags& flags) {
  if (flags.profile.empty()) {
    throw UsageError("--profile FILE is required (a profile of `pipesgd profile` or profiles/*.json)");
  }
  const ModelProfile profile = load_model_profile(flags.profile);
  return flags.compute_scale == 1 ? profile : scale_compute(profile, flags.compute_scale);
}

MethodSimulationOptions simulation_options(const SimulationFlags& flags) {
  if (flags.iterations < 1) throw UsageError(concat("--iters must be at least 1, got ", flags.iterations));
  MethodSimulationOptions options;
  options.link = simulated_link(flags);
  options.model = parse_sim_network_model(flags.network_model, "--network-model");
  options.topology = parse_sim_topology(flags.topology);
  options.iterations = flags.iterations;
  options.compute_jitter = parse_jitter(flags.compute_jitter);
  options.seed = static_cast<std::uint64_t>(flags.seed);
  options.comm_shares_core = flags.comm_shares_core;
  options.collectives = parse_collective_simulation(flags.collectives);
  return options;
}

std::string describe_compute_device(const SimulationFlags& flags) {
  // The profile's "device" field (scripts/make_paper_profiles.py writes it); a profile `pipesgd
  // profile` measured says so in its "source".
  std::string device;
  const nlohmann::json root = read_json_file(flags.profile, concat("profile file '", flags.profile, "'"));
  if (root.contains("device") && root.at("device").is_string()) device = root.at("device").get<std::string>();
  const std::string source = root.contains("source") && root.at("source").is_string() ? root.at("source").get<std::string>() : "";
  const std::string measured = "measured by pipesgd profile on ";
  if (device.empty() && source.rfind(measured, 0) == 0) {
    device = concat("the CPU of ", source.substr(measured.size(), source.find(',') - measured.size()), " (pipesgd profile)");
  }
  if (device.empty()) device = "an unstated device (the profile has no \"device\" field)";
  if (flags.compute_scale != 1) {
    return concat("compute: the profile's times for ", device, " x ", flags.compute_scale,
                  " (--compute-scale); `pipesgd profile` measures your own model");
  }
  return concat("compute: the profile's times are for ", device,
                "; for another device scale them with --compute-scale X (0.1: 10x as fast) or measure your own model "
                "with `pipesgd profile`");
}

std::string describe_simulation(const ModelProfile& profile, const MethodSimulationOptions& options) {
  return concat(profile.model, " (", profile.layers.size(), " layers, ", profile.parameters(), " parameters, batch ",
                profile.batch, ") on ", describe(options.link), ", ", sim_network_model_name(options.model),
                " network model, topology ", options.topology.text);
}

// Whether a job's workers allreduce, so that it has a collective level (messages or modelled):
// one worker communicates nothing, and parameter-server traffic is always message by message.
namespace {
bool simulates_collectives(const SimulationJob& job) {
  return job.options.workers > 1 && job.selection.options->servers() == 0;
}
}  // namespace

std::vector<MethodSimulationResult> run_simulation_jobs(const std::vector<SimulationJob>& jobs, const ModelProfile& profile,
                                                        bool quiet, bool skip_unbuildable) {
  const int parallel = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // On a terminal one line that updates; elsewhere (logs, pipes) a line per simulation.
  const bool terminal = !quiet && ::isatty(STDERR_FILENO) == 1;
  std::vector<MethodSimulationResult> results = simulate_methods(
      jobs, profile, parallel,
      [&](std::size_t i) {
        if (quiet) return;
        std::string level;
        if (simulates_collectives(jobs[i])) {
          level = simulated_collective_level(jobs[i].selection, profile, jobs[i].options).messages
                      ? ", message-level collectives"
                      : ", modelled collectives";
        }
        const std::string line = concat("[", i + 1, "/", jobs.size(), "] ", job_label(jobs[i]), ", ",
                                        jobs[i].options.workers, jobs[i].options.workers == 1 ? " worker" : " workers",
                                        level);
        if (terminal) {
          std::cerr << "\r\033[K" << line << std::flush;
        } else {
          std::cerr << line << std::endl;
        }
      },
      skip_unbuildable);
  if (terminal) std::cerr << "\r\033[K" << std::flush;
  return results;
}

std::string describe_collective_levels(const std::vector<SimulationJob>& jobs,
                                       const std::vector<MethodSimulationResult>& results) {
  // Per level, in order of appearance: how many simulations, the first one's reason, whether all
  // had that reason.
  struct Level {
    std::string name;
    int count = 0;
    std::string reason;
    bool same = true;
  };
  std::vector<Level> levels;
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    if (!simulates_collectives(jobs[i]) || !results[i].unbuildable.empty()) continue;
    const std::string name = results[i].collectives == "messages" ? "message-level" : "modelled";
    auto level = std::find_if(levels.begin(), levels.end(), [&](const Level& l) { return l.name == name; });
    if (level == levels.end()) level = levels.insert(levels.end(), Level{name, 0, results[i].collectives_reason, true});
    ++level->count;
    level->same = level->same && level->reason == results[i].collectives_reason;
  }
  std::string line;
  for (const Level& level : levels) {
    line += concat(line.empty() ? "collectives: " : "; ", level.name, " for ", level.count,
                   level.count == 1 ? " simulation (" : " simulations (", level.same ? "" : "e.g. ", level.reason, ")");
  }
  return line;
}

}  // namespace pipesgd
