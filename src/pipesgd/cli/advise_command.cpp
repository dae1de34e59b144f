// `pipesgd advise`: ranks every method's configurations (the variants its registry entry proposes,
// times the codecs) by simulated throughput at one world size, marks what each trades in accuracy,
// and prints the recommendation with the command line that runs it.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

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
  std::string out_dir;
};

// What a codec trades (Pipe-SGD Sec. 3.2 and 4; collective/codec.h for the error bounds).
std::string codec_accuracy_cost(const std::string& codec) {
  if (codec == "bf16") {
    return "lossy codec: 16-bit truncation of every gradient message, relative error < 2^-7 (Pipe-SGD Sec. 4: "
           "'+T' kept D-Sync's accuracy but for AlexNet's 0.005)";
  }
  if (codec == "int8") {
    return "lossy codec: 8-bit quantization of every gradient message, error <= max|g|/254 per message (Pipe-SGD "
           "Sec. 4: '+Q' as '+T'; ours: pipe+int8 85.08% vs dsync 85.28% after 3 epochs)";
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
  for (const Candidate& candidate : result) check_fits_topology(candidate.job);
  return result;
}

std::string command_line(const Candidate& candidate, int workers) {
  const int ranks = workers + candidate.servers;
  return concat("mpirun -np ", ranks, " pipesgd train --transport mpi --model MODEL --algo ", candidate.job.selection.spec,
                candidate.command_flags, "   (threads on one machine: pipesgd train --workers ", workers,
                " --algo ", candidate.job.selection.spec, candidate.command_flags, ")");
}

int run_advise(const AdviseFlags& flags) {
  const ModelProfile profile = load_simulated_profile(flags.simulation);
  if (flags.workers < 1) throw UsageError(concat("--workers must be at least 1, got ", flags.workers));
  if (flags.top < 1) throw UsageError(concat("--top must be at least 1, got ", flags.top));
  const MethodSimulationOptions base = simulation_options(flags.simulation);
  std::vector<Candidate> all = candidates(flags, base);
  std::vector<SimulationJob> jobs;
  for (const Candidate& candidate : all) jobs.push_back(candidate.job);
  if (!flags.simulation.quiet) {
    std::cerr << "advising for " << flags.workers << " workers: " << describe_simulation(profile, base) << ", "
              << jobs.size() << " configurations" << std::endl;
  }
  const std::vector<MethodSimulationResult> results = run_simulation_jobs(jobs, profile, flags.simulation.quiet);

  std::vector<std::size_t> order(all.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  // By throughput; configurations as fast (to a relative 1e-9) keep the one that trades less, then
  // the registry's order (e.g. K = 2 before K = 3).
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double x = results[a].samples_per_second, y = results[b].samples_per_second;
    if (std::abs(x - y) > 1e-9 * std::max(x, y)) return x > y;
    return all[a].costs.size() < all[b].costs.size();
  });
  // The baseline: plain D-Sync, the first candidate of the registry's first method.
  const double baseline = results.front().samples_per_second;
  const std::string baseline_label = job_label(all.front().job);

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
                       {"accuracy_costs", all[i].costs},
                       {"command", command_line(all[i], flags.workers)}});
  }
  std::cout << "simulated " << flags.workers << " workers: " << describe_simulation(profile, base) << "\n";
  print_table(std::cout, rows);
  if (static_cast<int>(order.size()) > flags.top) {
    std::cout << "(" << order.size() - static_cast<std::size_t>(flags.top) << " more: --top " << order.size() << ")\n";
  }
  std::cout << "\naccuracy trades:\n";
  for (std::size_t n = 0; n < notes.size(); ++n) std::cout << "  " << n + 1 << ". " << notes[n] << "\n";
  const Candidate& best = all[order.front()];
  std::cout << "\nrecommended: " << job_label(best.job) << ", "
            << format_number("%.0f", results[order.front()].samples_per_second) << " samples/s ("
            << format_number("%.2fx", results[order.front()].samples_per_second / baseline) << " " << baseline_label << ")"
            << (best.costs.empty() ? ", no accuracy trade" : concat(", trading accuracy (", note_numbers(best), ")")) << "\n  "
            << command_line(best, flags.workers) << "\n";
  const auto safe = std::find_if(order.begin(), order.end(), [&](std::size_t i) { return all[i].costs.empty(); });
  if (!best.costs.empty() && safe != order.end()) {
    std::cout << "fastest without an accuracy trade: " << job_label(all[*safe].job) << ", "
              << format_number("%.0f", results[*safe].samples_per_second) << " samples/s ("
              << format_number("%.2fx", results[*safe].samples_per_second / baseline) << ")\n  "
              << command_line(all[*safe], flags.workers) << "\n";
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
  command->add_option("--out", flags->out_dir, "Directory to write advise.json to (every configuration, ranked)");
  Subcommand subcommand;
  subcommand.command = command;
  subcommand.run = [flags](MpiSession*) { return run_advise(*flags); };
  return subcommand;
}

}  // namespace pipesgd
