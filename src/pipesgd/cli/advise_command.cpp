// `pipesgd advise`: ranks every method's configurations (the variants its registry entry proposes,
// times the codecs) by simulated throughput at one world size, marks what each trades in accuracy,
// and prints the recommendation with the command line that runs it. The ranking and the
// recommendation are sim/advise.h's; this file parses the flags and prints them.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "pipesgd/cli/commands.h"
#include "pipesgd/cli/simulation_flags.h"
#include "pipesgd/core/json_file.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/sim/advise.h"

namespace pipesgd {
namespace {

struct AdviseFlags {
  SimulationFlags simulation;
  int workers = 16;
  std::string codecs = "none,bf16,int8";
  std::string methods;  // empty: every method
  int top = 15;
  std::string min_gain = "5%";
  std::string out_dir;
};

// "5%" or "0.05" -> 0.05. Throws UsageError naming --min-gain.
double parse_min_gain(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  const std::string rest(end ? end : "");
  if (rest == "%") value /= 100;
  if (end == text.c_str() || (!rest.empty() && rest != "%") || !std::isfinite(value) || value < 0) {
    throw UsageError(concat("--min-gain '", text, "': expected a fraction >= 0 or a percentage, e.g. 0.05 or 5%"));
  }
  return value;
}

// How the printed command lines start: `pipesgd` if that resolves on PATH to this executable, else
// this executable's path (as installed or built).
std::string pipesgd_program() {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error || self.empty()) return "pipesgd";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "";
  for (std::size_t begin = 0; begin <= dirs.size();) {
    const std::size_t end = std::min(dirs.find(':', begin), dirs.size());
    const std::string dir = dirs.substr(begin, end - begin);
    begin = end + 1;
    if (dir.empty()) continue;
    const std::filesystem::path candidate = std::filesystem::path(dir) / "pipesgd";
    if (::access(candidate.c_str(), X_OK) != 0) continue;
    // The first pipesgd on PATH is the one a shell runs: plain `pipesgd` only if it is this one.
    return std::filesystem::equivalent(candidate, self, error) && !error ? "pipesgd" : self.string();
  }
  const std::string text = self.string();
  return text.find_first_of(" \t'\"$`\\") == std::string::npos ? text : concat("'", text, "'");
}

// The `train --model` value of a profile's model: the ones train builds (cli_common.h's
// kModelFlagHelp), TorchScript files, and profiles/mnist-mlp.json's MNIST-MLP (784-500-500-10, the
// built-in mlp); "" for any other.
std::string train_model(const std::string& model) {
  if (model == "mlp" || model == "cnn" || model == "resnet" || model == "softmax" ||
      (model.size() > 3 && model.compare(model.size() - 3, 3, ".pt") == 0)) {
    return model;
  }
  return model == "MNIST-MLP" ? "mlp" : "";
}

// What the printed commands train: the profile's model if `train` builds it, with its batch.
struct CommandContext {
  std::string program;      // pipesgd_program()
  std::string model_flags;  // " --model mlp --batch 25" or " --batch 64"
};

// The MPI command line (one rank per worker and server).
std::string mpi_command_line(const AdvisedConfiguration& candidate, int workers, const CommandContext& context) {
  return concat("mpirun -np ", workers + candidate.servers, " ", context.program, " train --transport mpi",
                context.model_flags, " --algo ", candidate.job.selection.spec, candidate.command_flags);
}
// The same on threads of one machine.
std::string threads_command_line(const AdvisedConfiguration& candidate, int workers, const CommandContext& context) {
  return concat(context.program, " train --workers ", workers, context.model_flags, " --algo ", candidate.job.selection.spec,
                candidate.command_flags);
}
std::string command_lines(const AdvisedConfiguration& candidate, int workers, const CommandContext& context) {
  return concat("  ", mpi_command_line(candidate, workers, context), "\n  threads on one machine: ",
                threads_command_line(candidate, workers, context), "\n");
}

int run_advise(const AdviseFlags& flags) {
  const ModelProfile profile = load_simulated_profile(flags.simulation);
  if (flags.workers < 1) throw UsageError(concat("--workers must be at least 1, got ", flags.workers));
  if (flags.top < 1) throw UsageError(concat("--top must be at least 1, got ", flags.top));
  AdviseRequest request;
  request.min_gain = parse_min_gain(flags.min_gain);
  request.simulation = simulation_options(flags.simulation);
  request.workers = flags.workers;
  request.codecs = split_list(flags.codecs);
  if (!flags.methods.empty()) request.methods = split_list(flags.methods);
  std::vector<AdvisedConfiguration> configurations = advised_configurations(request);
  if (!flags.simulation.quiet) {
    const auto buildable = std::count_if(configurations.begin(), configurations.end(),
                                         [](const AdvisedConfiguration& c) { return c.unbuildable.empty(); });
    std::cerr << "advising for " << flags.workers << " workers: " << describe_simulation(profile, request.simulation)
              << ", " << buildable << " configurations" << std::endl;
  }
  const Advice advice = advise(request, std::move(configurations), [&](const std::vector<SimulationJob>& jobs) {
    return run_simulation_jobs(jobs, profile, flags.simulation.quiet, /*skip_unbuildable=*/true);
  });
  const std::vector<AdvisedConfiguration>& all = advice.configurations;
  const std::vector<MethodSimulationResult>& results = advice.results;
  const std::vector<std::size_t>& order = advice.ranking;
  const std::string model = train_model(profile.model);
  const CommandContext context{pipesgd_program(), model.empty() ? concat(" --batch ", profile.batch)
                                                                : concat(" --model ", model, " --batch ", profile.batch)};
  const double baseline = advice.throughput(advice.baseline);
  const std::string baseline_label = job_label(all[advice.baseline].job);

  std::vector<std::string> notes;  // the trades shown, numbered in order of appearance
  auto note_numbers = [&](const AdvisedConfiguration& candidate) {
    std::string numbers;
    for (const std::string& cost : candidate.costs) {
      auto found = std::find(notes.begin(), notes.end(), cost);
      if (found == notes.end()) found = notes.insert(notes.end(), cost);
      numbers += concat(numbers.empty() ? "" : ",", found - notes.begin() + 1);
    }
    return numbers.empty() ? std::string("none") : numbers;
  };
  std::vector<std::vector<std::string>> rows = {
      {"rank", "configuration", "samples/s", "iteration ms", "exposed ms", concat("vs ", baseline_label), "accuracy trade"}};
  nlohmann::json records = nlohmann::json::array();
  for (std::size_t rank = 0; rank < order.size(); ++rank) {
    const std::size_t i = order[rank];
    const MethodSimulationResult& r = results[i];
    const std::string trade = note_numbers(all[i]);
    if (static_cast<int>(rank) < flags.top) {
      rows.push_back({std::to_string(rank + 1), job_label(all[i].job), format_number("%.0f", r.samples_per_second),
                      milliseconds(r.iteration_seconds), milliseconds(r.exposed_seconds),
                      format_number("%.2fx", advice.speedup(i)), trade});
    }
    records.push_back({{"rank", rank + 1},
                       {"method", all[i].job.selection.spec},
                       {"configuration", job_label(all[i].job)},
                       {"workers", flags.workers},
                       {"servers", all[i].servers},
                       {"throughput_samples_per_s", r.samples_per_second},
                       {"iteration_s", r.iteration_seconds},
                       {"exposed_s", r.exposed_seconds},
                       {"speedup", advice.speedup(i)},
                       {"speedup_baseline", baseline_label},
                       {"bucket_plan", r.schedule},
                       {"collectives", r.collectives},
                       {"accuracy_costs", all[i].costs},
                       {"command", mpi_command_line(all[i], flags.workers, context)},
                       {"threads_command", threads_command_line(all[i], flags.workers, context)}});
  }
  std::cout << "simulated " << flags.workers << " workers: " << describe_simulation(profile, request.simulation) << "\n";
  std::cout << describe_compute_device(flags.simulation) << "\n";
  if (const std::string levels = describe_collective_levels(advice.simulated_jobs, advice.simulated_results);
      !levels.empty()) {
    std::cout << levels << "\n";
  }
  print_table(std::cout, rows);
  if (static_cast<int>(order.size()) > flags.top) {
    std::cout << "(" << order.size() - static_cast<std::size_t>(flags.top) << " more: --top " << order.size() << ")\n";
  }
  for (std::size_t i : advice.skipped) std::cout << "skipped " << job_label(all[i].job) << ": " << results[i].unbuildable << "\n";
  std::cout << "\naccuracy trades:\n";
  for (std::size_t n = 0; n < notes.size(); ++n) std::cout << "  " << n + 1 << ". " << notes[n] << "\n";
  if (notes.empty()) std::cout << "  (none)\n";

  // The fastest configuration, unless it trades accuracy (staleness, asynchrony, a lossy codec: what
  // the registry's variants declare as their accuracy_cost) for less than --min-gain over the fastest
  // that trades nothing (sim/advise.h).
  const std::size_t chosen = advice.recommended;
  std::string why;
  if (advice.gain) {
    const std::size_t fastest = advice.fastest(), safe = *advice.fastest_without_trade;
    const std::string versus = concat(job_label(all[fastest].job), " is ", format_number("%.2f%%", 100 * *advice.gain),
                                      " faster than ", job_label(all[safe].job), "; ");
    if (chosen == safe) {
      why = concat(versus, "below the ", format_number("%g%%", 100 * request.min_gain),
                   " minimum (--min-gain) to trade accuracy for speed, so recommending ", job_label(all[safe].job));
    } else {
      why = concat(versus, "at least the ", format_number("%g%%", 100 * request.min_gain),
                   " minimum (--min-gain) to trade accuracy for speed");
    }
  }
  const AdvisedConfiguration& best = all[chosen];
  std::cout << "\n";
  if (!why.empty()) std::cout << why << "\n";
  std::cout << "recommended: " << job_label(best.job) << ", " << format_number("%.0f", results[chosen].samples_per_second)
            << " samples/s (" << format_number("%.2fx", results[chosen].samples_per_second / baseline) << " "
            << baseline_label << ")"
            << (best.costs.empty() ? ", no accuracy trade" : concat(", trading accuracy (", note_numbers(best), ")")) << "\n"
            << command_lines(best, flags.workers, context);
  if (!best.costs.empty() && advice.fastest_without_trade) {
    const std::size_t safe = *advice.fastest_without_trade;
    std::cout << "fastest without an accuracy trade: " << job_label(all[safe].job) << ", "
              << format_number("%.0f", results[safe].samples_per_second) << " samples/s ("
              << format_number("%.2fx", results[safe].samples_per_second / baseline) << ")\n"
              << command_lines(all[safe], flags.workers, context);
  }
  if (model.empty()) {
    std::cout << "(these train the default model: give your own as --model PATH.pt, its TorchScript export; `train "
                 "--model` has no '"
              << profile.model << "')\n";
  }
  if (!flags.out_dir.empty()) {
    prepare_output_directory(flags.out_dir);
    write_json_file(std::filesystem::path(flags.out_dir) / "advise.json", records, "advise");
    std::cout << "wrote " << flags.out_dir << "/advise.json\n";
  }
  return 0;
}

}  // namespace

Subcommand add_advise_command(CLI::App& app) {
  auto flags = std::make_shared<AdviseFlags>();
  CLI::App* command = app.add_subcommand(
      "advise", "Rank every method x K x codec x bucket plan x servers by simulated throughput for a model and cluster");
  add_simulation_flags(*command, flags->simulation, /*calibration_flag=*/true);
  command->add_option("--workers", flags->workers, "World size to advise for")->capture_default_str();
  command->add_option("--codecs", flags->codecs, "Codecs to try with the methods that take one")->capture_default_str();
  command->add_option("--methods", flags->methods, "Only these methods (comma-separated names; default: every one)");
  command->add_option("--top", flags->top, "Rows of the ranking to print")->capture_default_str();
  command->add_option("--min-gain", flags->min_gain,
                      "Recommend a configuration that trades accuracy (staleness, asynchrony, a lossy codec) only if it "
                      "is at least this much faster than the fastest that trades none (e.g. 5% or 0.05)")
      ->capture_default_str();
  command->add_option("--out", flags->out_dir, "Directory to write advise.json to (every configuration, ranked)");
  Subcommand subcommand;
  subcommand.command = command;
  subcommand.run = [flags](MpiSession*) { return run_advise(*flags); };
  return subcommand;
}

}  // namespace pipesgd
