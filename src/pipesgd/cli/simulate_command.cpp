// `pipesgd simulate`: every method of a list at every world size of a list, simulated on SimGrid
// (src/pipesgd/sim) from a model profile: iteration time, throughput, scaling efficiency, exposed
// communication and speedup, as a table and (--out) as JSON with compare.json's field names.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "pipesgd/algo/registry.h"
#include "pipesgd/cli/commands.h"
#include "pipesgd/cli/simulation_flags.h"
#include "pipesgd/cli/train_options.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/json_file.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/sim/method_simulation.h"
#include "pipesgd/timing/model_profile.h"

namespace pipesgd {
namespace {

struct SimulateFlags {
  SimulationFlags simulation;
  std::string workers = "4,8,16,32,64";
  std::string algos = default_compare_list();
  std::string out_dir;
  std::string trace;
  std::map<std::string, std::string> method_values;
  CLI::App* command = nullptr;
};

std::vector<int> parse_worker_list(const std::string& text) {
  std::vector<int> workers;
  for (const std::string& item : split_list(text)) {
    char* end = nullptr;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 1 || value > 65536) {
      throw UsageError(concat("--workers '", text, "': '", item, "' is not a world size in [1, 65536]"));
    }
    workers.push_back(static_cast<int>(value));
  }
  if (workers.empty()) throw UsageError("--workers: give at least one world size, e.g. 4,8,16");
  return workers;
}

nlohmann::json record_json(const SimulationJob& job, const MethodSimulationResult& r, const ModelProfile& profile,
                           double baseline, const std::string& baseline_spec, double one_worker) {
  const SimulatedStages& s = r.stages;
  return {{"method", job.selection.spec},
          {"workers", job.options.workers},
          {"throughput_samples_per_s", r.samples_per_second},
          {"iteration_s", r.iteration_seconds},
          {"breakdown",
           {{"update_s", s.update}, {"compensation_s", s.compensation}, {"data_s", s.data}, {"forward_s", s.forward},
            {"backward_s", s.backward}, {"wait_s", s.wait}, {"comm_s", s.comm}, {"iteration_s", r.iteration_seconds}}},
          {"compute_s", r.compute_seconds},
          {"exposed_s", r.exposed_seconds},
          {"scaling_efficiency", one_worker > 0 ? r.samples_per_second / (job.options.workers * one_worker) : 0},
          {"speedup", baseline > 0 ? r.samples_per_second / baseline : 0},
          {"speedup_baseline", baseline_spec},
          {"bucket_plan", r.schedule},
          {"allreduce", r.allreduce},
          {"collectives", r.collectives},
          {"measured_iterations", r.measured_iterations},
          {"periodic", r.periodic},
          {"simulated", true},
          {"profile", profile.model},
          {"batch", profile.batch}};
}

// Simulations of up to this many workers are traced with --trace (one process per worker).
constexpr int kMaxTracedWorkers = 16;

// One trace of every traced simulation: simulation j's worker w is process j * 1000 + w, named
// "<spec>, <N> workers: worker w".
nlohmann::json merged_trace(const std::vector<SimulationJob>& jobs, const std::vector<MethodSimulationResult>& results) {
  nlohmann::json events = nlohmann::json::array();
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (!jobs[j].options.trace) continue;
    const int offset = static_cast<int>(j) * 1000;
    const std::string prefix = concat(jobs[j].selection.spec, ", ", jobs[j].options.workers, " workers: ");
    for (nlohmann::json event : results[j].trace_events) {
      event["pid"] = event.at("pid").get<int>() + offset;
      if (event.at("name") == "process_name") event["args"]["name"] = prefix + event["args"]["name"].get<std::string>();
      events.push_back(std::move(event));
    }
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

int run_simulate(const SimulateFlags& flags) {
  SimulationFlags simulation = flags.simulation;
  // --calibration is a method option here (the planners' cost model): it also gives the link.
  if (flags.command->count("--calibration") > 0) simulation.calibration_file = flags.method_values.at("--calibration");
  const ModelProfile profile = load_simulated_profile(simulation);
  const std::vector<int> worker_counts = parse_worker_list(flags.workers);
  const std::vector<std::string> specs = split_list(flags.algos);
  if (specs.empty()) throw UsageError("--algos: give at least one method spec");
  const MethodSimulationOptions base = simulation_options(simulation);
  const OptionValues given = given_method_options(*flags.command, flags.method_values);
  std::vector<MethodSelection> selections;
  for (const std::string& spec : specs) {
    selections.push_back(select_method(spec, given, FlagPolicy::kApplyWhereItFits, CommonOptions{}));
  }
  if (!flags.out_dir.empty()) prepare_output_directory(flags.out_dir);

  // One worker of each method (scaling efficiency's base), then every world size.
  std::vector<SimulationJob> jobs;
  for (const MethodSelection& selection : selections) {
    MethodSimulationOptions one = base;
    one.workers = 1;
    jobs.push_back({selection, one, ""});
  }
  for (int workers : worker_counts) {
    for (const MethodSelection& selection : selections) {
      MethodSimulationOptions options = base;
      options.workers = workers;
      options.trace = !flags.trace.empty() && workers <= kMaxTracedWorkers;
      jobs.push_back({selection, options, ""});
    }
  }
  for (const SimulationJob& job : jobs) check_fits_topology(job);
  if (!flags.trace.empty() && !std::any_of(jobs.begin(), jobs.end(), [](const SimulationJob& job) { return job.options.trace; })) {
    throw UsageError(concat("--trace records world sizes up to ", kMaxTracedWorkers, " workers: add one to --workers"));
  }
  if (!flags.simulation.quiet) {
    std::cerr << "simulating " << describe_simulation(profile, base) << ": " << jobs.size() << " simulations" << std::endl;
  }
  const std::vector<MethodSimulationResult> results = run_simulation_jobs(jobs, profile, flags.simulation.quiet);

  const std::size_t methods = selections.size();
  std::vector<std::vector<std::string>> rows = {{"workers", "method", "iteration ms", "samples/s", "scaling eff.",
                                                 "exposed ms", "comm ms", concat("speedup vs ", specs.front())}};
  nlohmann::json records = nlohmann::json::array();
  for (std::size_t i = methods; i < jobs.size(); ++i) {
    const std::size_t method = (i - methods) % methods;
    const std::size_t first_of_size = i - method;
    const double baseline = results[first_of_size].samples_per_second;
    const double one_worker = results[method].samples_per_second;
    const nlohmann::json record =
        record_json(jobs[i], results[i], profile, baseline, specs.front(), one_worker);
    rows.push_back({std::to_string(jobs[i].options.workers), jobs[i].selection.spec, milliseconds(results[i].iteration_seconds),
                    format_number("%.0f", results[i].samples_per_second),
                    format_number("%.3f", record.at("scaling_efficiency").get<double>()),
                    milliseconds(results[i].exposed_seconds), milliseconds(results[i].allreduce_seconds),
                    format_number("%.2fx", record.at("speedup").get<double>())});
    records.push_back(record);
  }
  std::cout << "simulated " << describe_simulation(profile, base) << ", " << base.iterations << " measured iterations\n";
  std::cout << describe_compute_device(simulation) << "\n";
  if (const std::string levels = describe_collective_levels(jobs, results); !levels.empty()) std::cout << levels << "\n";
  print_table(std::cout, rows);
  if (!flags.out_dir.empty()) {
    write_json_file(std::filesystem::path(flags.out_dir) / "simulate.json", records, "simulate");
    std::cout << "wrote " << flags.out_dir << "/simulate.json\n";
  }
  if (!flags.trace.empty()) {
    write_file_atomically(flags.trace, merged_trace(jobs, results).dump() + "\n", "trace");
    std::cout << "wrote " << flags.trace << " (Chrome trace format: open it in https://ui.perfetto.dev or chrome://tracing)\n";
  }
  return 0;
}

}  // namespace

Subcommand add_simulate_command(CLI::App& app) {
  auto flags = std::make_shared<SimulateFlags>();
  CLI::App* command = app.add_subcommand(
      "simulate", "Simulate methods at cluster scale on SimGrid from a model profile (pipesgd profile, profiles/*.json)");
  flags->command = command;
  add_simulation_flags(*command, flags->simulation, /*calibration_flag=*/false);
  command->add_option("--workers", flags->workers, "Comma-separated world sizes to simulate")->capture_default_str();
  command->add_option("--algos", flags->algos, concat("Comma-separated method specs, e.g. ", example_compare_lists()))
      ->capture_default_str();
  command->add_option("--out", flags->out_dir, "Directory to write simulate.json to (compare.json's field names)");
  command->add_option("--trace", flags->trace,
                      concat("Write the simulated timelines (world sizes up to ", kMaxTracedWorkers,
                             ") in the Chrome trace format (Perfetto, chrome://tracing) to FILE"));
  add_method_option_flags(*command, flags->method_values);
  Subcommand subcommand;
  subcommand.command = command;
  subcommand.run = [flags](MpiSession*) { return run_simulate(*flags); };
  return subcommand;
}

}  // namespace pipesgd
