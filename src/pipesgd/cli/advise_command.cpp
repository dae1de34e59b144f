// `pipesgd advise`: ranks every method's configurations (the variants its registry entry proposes,
// times the codecs) by simulated throughput at one world size, marks what each trades in accuracy,
// and prints the recommendation with the command line that runs it.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "pipesgd/algo/registry.h"
#include "pipesgd/cli/commands.h"
#include "pipesgd/cli/simulation_flags.h"
#include "pipesgd/core/json_file.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"

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

// What a codec trades (Pipe-SGD Sec. 3.2 and 4; collective/codec.h for the error bounds).
std::string codec_accuracy_cost(const std::string& codec) {
  if (codec == "bf16") {
    return "lossy codec: 16-bit truncation of every gradient message, relative error < 2^-7 (Pipe-SGD Sec. 4: "
           "'+T' kept D-Sync's accuracy but for AlexNet's 0.005)";
  }
  if (codec == "int8") {
    return "lossy codec: 8-bit quantization of every gradient message, error <= max|g|/254 per message (Pipe-SGD "
           "Sec. 4: '+Q' as '+T'; ours, docs/results.md: pipe+int8 within half a point of dsync after 3 epochs "
           "of plain SGD)";
  }
  return "";
}

bool takes_flag(const MethodDescriptor& method, const std::string& flag) {
  return std::any_of(method.options.begin(), method.options.end(),
                     [&](const OptionDeclaration& option) { return option.flag == flag; });
}

struct Candidate {
  SimulationJob job;
  std::vector<std::string> costs;  // accuracy trades, with their sources
  std::string command_flags;       // " --staleness-k 3"
  int servers = 0;
  std::string unbuildable;         // why it cannot run here (its servers do not fit --topology), if so
};

std::vector<Candidate> candidates(const AdviseFlags& flags, const MethodSimulationOptions& base) {
  const std::vector<std::string> codecs = split_list(flags.codecs);
  for (const std::string& codec : codecs) make_codec(codec);  // UsageError for an unknown one
  const std::vector<std::string> methods = flags.methods.empty() ? std::vector<std::string>{} : split_list(flags.methods);
  for (const std::string& name : methods) {
    if (!find_method(name)) throw UsageError(concat("--methods: unknown method '", name, "' (known: ", join(method_names()), ")"));
  }
  std::vector<Candidate> result;
  for (const MethodDescriptor* method : method_registry()) {
    if (!method->advise || !method->simulate) continue;
    if (!methods.empty() && std::find(methods.begin(), methods.end(), method->name) == methods.end()) continue;
    for (const AdvisedVariant& variant : method->advise(flags.workers)) {
      const bool codec_applies = takes_flag(*method, "--codec");
      for (const std::string& codec : codec_applies ? codecs : std::vector<std::string>{"none"}) {
        Candidate candidate;
        const std::string spec = codec == "none" ? variant.spec : concat(variant.spec, "+", codec);
        candidate.job.selection = select_method(spec, variant.flags, FlagPolicy::kReject, CommonOptions{});
        candidate.job.options = base;
        candidate.job.options.workers = flags.workers;
        for (const auto& [flag, value] : variant.flags.all()) candidate.command_flags += concat(" ", flag, " ", value);
        candidate.job.label = spec + candidate.command_flags;
        candidate.servers = candidate.job.selection.options->servers();
        if (!variant.accuracy_cost.empty()) candidate.costs.push_back(variant.accuracy_cost);
        if (!codec_accuracy_cost(codec).empty()) candidate.costs.push_back(codec_accuracy_cost(codec));
        result.push_back(std::move(candidate));
      }
    }
  }
  if (result.empty()) throw UsageError("--methods: no method to advise on");
  // A world that does not fit the topology is the user's to fix; a candidate whose servers make it not
  // fit is skipped.
  for (Candidate& candidate : result) {
    try {
      check_fits_topology(candidate.job);
    } catch (const UsageError& error) {
      if (candidate.servers == 0) throw;
      candidate.unbuildable = error.what();
    }
  }
  return result;
}

// What the printed commands train: the profile's model if `train` builds it, with its batch.
struct CommandContext {
  std::string program;      // pipesgd_program()
  std::string model_flags;  // " --model mlp --batch 25" or " --batch 64"
};

// The MPI command line (one rank per worker and server).
std::string mpi_command_line(const Candidate& candidate, int workers, const CommandContext& context) {
  return concat("mpirun -np ", workers + candidate.servers, " ", context.program, " train --transport mpi",
                context.model_flags, " --algo ", candidate.job.selection.spec, candidate.command_flags);
}
// The same on threads of one machine.
std::string threads_command_line(const Candidate& candidate, int workers, const CommandContext& context) {
  return concat(context.program, " train --workers ", workers, context.model_flags, " --algo ", candidate.job.selection.spec,
                candidate.command_flags);
}
std::string command_lines(const Candidate& candidate, int workers, const CommandContext& context) {
  return concat("  ", mpi_command_line(candidate, workers, context), "\n  threads on one machine: ",
                threads_command_line(candidate, workers, context), "\n");
}

int run_advise(const AdviseFlags& flags) {
  const ModelProfile profile = load_simulated_profile(flags.simulation);
  if (flags.workers < 1) throw UsageError(concat("--workers must be at least 1, got ", flags.workers));
  if (flags.top < 1) throw UsageError(concat("--top must be at least 1, got ", flags.top));
  const double min_gain = parse_min_gain(flags.min_gain);
  const MethodSimulationOptions base = simulation_options(flags.simulation);
  std::vector<Candidate> all = candidates(flags, base);
  std::vector<SimulationJob> jobs;
  std::vector<std::size_t> simulated;  // the candidate of each job
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!all[i].unbuildable.empty()) continue;
    jobs.push_back(all[i].job);
    simulated.push_back(i);
  }
  if (!flags.simulation.quiet) {
    std::cerr << "advising for " << flags.workers << " workers: " << describe_simulation(profile, base) << ", "
              << jobs.size() << " configurations" << std::endl;
  }
  // A configuration that cannot be built (e.g. more servers than the model has segments) is skipped.
  const std::vector<MethodSimulationResult> simulated_results =
      run_simulation_jobs(jobs, profile, flags.simulation.quiet, /*skip_unbuildable=*/true);
  std::vector<MethodSimulationResult> results(all.size());
  for (std::size_t j = 0; j < jobs.size(); ++j) results[simulated[j]] = simulated_results[j];
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!all[i].unbuildable.empty()) results[i].unbuildable = all[i].unbuildable;
  }
  std::vector<std::size_t> order, skipped;
  for (std::size_t i = 0; i < all.size(); ++i) (results[i].unbuildable.empty() ? order : skipped).push_back(i);
  if (order.empty()) {
    throw UsageError(concat("no configuration could be simulated: ", job_label(all.front().job), ": ",
                            results.front().unbuildable));
  }
  const std::string model = train_model(profile.model);
  const CommandContext context{pipesgd_program(), model.empty() ? concat(" --batch ", profile.batch)
                                                                : concat(" --model ", model, " --batch ", profile.batch)};

  // By throughput; configurations as fast (to a relative 1e-9) keep the one that trades less, then
  // the registry's order (e.g. K = 2 before K = 3).
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double x = results[a].samples_per_second, y = results[b].samples_per_second;
    if (std::abs(x - y) > 1e-9 * std::max(x, y)) return x > y;
    return all[a].costs.size() < all[b].costs.size();
  });
  // The baseline: plain D-Sync, the first candidate of the registry's first method (the first one
  // simulated, with --methods).
  const std::size_t first = *std::min_element(order.begin(), order.end());
  const double baseline = results[first].samples_per_second;
  const std::string baseline_label = job_label(all[first].job);

  std::vector<std::string> notes;  // the trades shown, numbered in order of appearance
  auto note_numbers = [&](const Candidate& candidate) {
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
                      format_number("%.2fx", baseline > 0 ? r.samples_per_second / baseline : 0), trade});
    }
    records.push_back({{"rank", rank + 1},
                       {"method", all[i].job.selection.spec},
                       {"configuration", job_label(all[i].job)},
                       {"workers", flags.workers},
                       {"servers", all[i].servers},
                       {"throughput_samples_per_s", r.samples_per_second},
                       {"iteration_s", r.iteration_seconds},
                       {"exposed_s", r.exposed_seconds},
                       {"speedup", baseline > 0 ? r.samples_per_second / baseline : 0},
                       {"speedup_baseline", baseline_label},
                       {"bucket_plan", r.schedule},
                       {"collectives", r.collectives},
                       {"accuracy_costs", all[i].costs},
                       {"command", mpi_command_line(all[i], flags.workers, context)},
                       {"threads_command", threads_command_line(all[i], flags.workers, context)}});
  }
  std::cout << "simulated " << flags.workers << " workers: " << describe_simulation(profile, base) << "\n";
  std::cout << describe_compute_device(flags.simulation) << "\n";
  if (const std::string levels = describe_collective_levels(jobs, simulated_results); !levels.empty()) {
    std::cout << levels << "\n";
  }
  print_table(std::cout, rows);
  if (static_cast<int>(order.size()) > flags.top) {
    std::cout << "(" << order.size() - static_cast<std::size_t>(flags.top) << " more: --top " << order.size() << ")\n";
  }
  for (std::size_t i : skipped) std::cout << "skipped " << job_label(all[i].job) << ": " << results[i].unbuildable << "\n";
  std::cout << "\naccuracy trades:\n";
  for (std::size_t n = 0; n < notes.size(); ++n) std::cout << "  " << n + 1 << ". " << notes[n] << "\n";
  if (notes.empty()) std::cout << "  (none)\n";

  // The fastest configuration, unless it trades accuracy (staleness, asynchrony, a lossy codec: what
  // the registry's variants declare as their accuracy_cost) for less than --min-gain over the fastest
  // that trades nothing.
  const std::size_t fastest = order.front();
  const auto safe = std::find_if(order.begin(), order.end(), [&](std::size_t i) { return all[i].costs.empty(); });
  std::size_t chosen = fastest;
  std::string why;
  if (!all[fastest].costs.empty() && safe != order.end()) {
    const double gain = results[fastest].samples_per_second / results[*safe].samples_per_second - 1;
    const std::string versus = concat(job_label(all[fastest].job), " is ", format_number("%.2f%%", 100 * gain),
                                      " faster than ", job_label(all[*safe].job), "; ");
    if (gain < min_gain) {
      chosen = *safe;
      why = concat(versus, "below the ", format_number("%g%%", 100 * min_gain),
                   " minimum (--min-gain) to trade accuracy for speed, so recommending ", job_label(all[*safe].job));
    } else {
      why = concat(versus, "at least the ", format_number("%g%%", 100 * min_gain),
                   " minimum (--min-gain) to trade accuracy for speed");
    }
  }
  const Candidate& best = all[chosen];
  std::cout << "\n";
  if (!why.empty()) std::cout << why << "\n";
  std::cout << "recommended: " << job_label(best.job) << ", " << format_number("%.0f", results[chosen].samples_per_second)
            << " samples/s (" << format_number("%.2fx", results[chosen].samples_per_second / baseline) << " "
            << baseline_label << ")"
            << (best.costs.empty() ? ", no accuracy trade" : concat(", trading accuracy (", note_numbers(best), ")")) << "\n"
            << command_lines(best, flags.workers, context);
  if (!best.costs.empty() && safe != order.end()) {
    std::cout << "fastest without an accuracy trade: " << job_label(all[*safe].job) << ", "
              << format_number("%.0f", results[*safe].samples_per_second) << " samples/s ("
              << format_number("%.2fx", results[*safe].samples_per_second / baseline) << ")\n"
              << command_lines(all[*safe], flags.workers, context);
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
