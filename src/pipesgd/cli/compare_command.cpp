// `pipesgd compare`: several methods one after another on the same model and data; one table, and
// the tables of the compared methods' families.
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "pipesgd/cli/command_trace.h"
#include "pipesgd/cli/commands.h"
#include "pipesgd/cli/help_format.h"
#include "pipesgd/cli/train_options.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/report/accuracy_target.h"
#include "pipesgd/report/report.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {
namespace {

// The width compare's prose lines wrap to: the terminal's (COLUMNS, else the terminal's own), 100
// when stdout is not a terminal.
constexpr std::size_t kCompareWidth = 100;

int run_compare(const TrainFlags& flags, const std::string& algorithms, std::optional<double> target_accuracy,
                bool wide, MpiSession* session) {
  const std::size_t width = terminal_width(kCompareWidth);
  if (target_accuracy) check_target_accuracy(*target_accuracy);
  const std::vector<std::string> specs = split_list(algorithms);
  std::vector<TrainConfig> configs;  // every entry checked before any training
  const std::optional<LauncherRestart> relaunch = launcher_restart_of(session);
  for (const std::string& spec : specs) {
    configs.push_back(to_train_config(flags, spec, FlagPolicy::kApplyWhereItFits, session, relaunch));
  }
  // A method option goes to the methods of the list that take it; one that none takes is a mistake.
  const OptionValues given = given_method_options(flags);
  for (const auto& [flag, value] : given.all()) {
    const bool taken = std::any_of(configs.begin(), configs.end(),
                                   [&](const TrainConfig& config) { return config.method.given.has(flag); });
    if (!taken) throw UsageError(concat(not_applicable_message(flag, algorithms), " (none of the compared methods)"));
  }
  if (session != nullptr) {
    // Under MPI the servers are ranks of mpirun -np, so methods with and without servers would
    // train with different numbers of workers: not a comparison.
    for (const TrainConfig& config : configs) {
      if (config.workers != configs[0].workers) {
        throw UsageError("under --transport mpi, compare cannot mix parameter-server methods (the last --servers "
                         "ranks serve) with methods whose every rank is a worker; compare them in separate runs");
      }
    }
  }
  if (prints_results(session)) prepare_output_directory(flags.out_dir);
  CommandTrace trace(flags.trace_path, flags.trace_iterations);
  check_model_flags(flags.model, flags.loss);
  const DataSplits data = load_data(flags);
  const ModelFactory factory = make_model_factory(flags.model, flags.loss, data.train);
  for (TrainConfig& config : configs) prepare_run_record(config, flags, data, session);
  const bool leader = prints_results(session);
  if (leader) {
    // The header names the servers if any method of the list has them (the others run without).
    const TrainConfig* widest = &configs[0];
    for (const TrainConfig& config : configs) {
      if (server_ranks(config) > server_ranks(*widest)) widest = &config;
    }
    std::cout << wrap_prose_lines(concat("pipesgd compare: ", algorithms, " on ", flags.model, " (", data.train.name,
                                         "), ", describe_workers(*widest, session), "\n"),
                                  width)
              << std::flush;
  }
  std::vector<RunSummary> summaries;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    TrainConfig& config = configs[i];
    if (!flags.out_dir.empty()) config.out_dir = concat(flags.out_dir, "/", i + 1, "-", config.method.spec);
    if (leader && !flags.quiet) std::cerr << "[" << i + 1 << "/" << configs.size() << "] " << config.method.spec << std::endl;
    config.trace = trace.target(i, concat(config.method.spec, ": "));
    try {
      summaries.push_back(session != nullptr ? run_training_rank(config, factory, data, session->transport)
                                             : run_training(config, factory, data));
    } catch (const std::exception& error) {
      trace.write_after_failure(session, concat(config.method.spec, ": ", error.what()));
      throw;
    }
    if (summaries.back().interrupted) break;  // the methods after it do not start
  }
  if (summaries.back().interrupted) {
    trace.write_after_failure(session, describe_interruption(*summaries.back().interrupted));
  } else {
    trace.write(session, configs[0].method.common.timeout);
  }
  const std::optional<Interruption> interrupted = summaries.back().interrupted;
  if (!leader) return interrupted ? interrupted_exit(interrupted->signal, session) : 0;
  std::cout << "\n";
  std::ostringstream table;
  print_compare_table(table, summaries, target_accuracy, wide);
  std::cout << (wide ? table.str() : wrap_prose_lines(table.str(), width));
  if (!flags.out_dir.empty()) {
    write_compare_outputs(flags.out_dir, summaries, target_accuracy);
    if (!interrupted) std::cout << "wrote " << flags.out_dir << "/compare.json\n";
  }
  if (interrupted) {
    // One line: where it stopped, what did not run, what was written.
    std::cout << std::flush;
    const std::size_t ran = summaries.size();
    std::cerr << "pipesgd: " << configs[ran - 1].method.spec << " (method " << ran << " of " << configs.size()
              << ") " << describe_interruption(*interrupted)
              << (ran < configs.size() ? "; the methods after it did not run" : "")
              << (flags.out_dir.empty() ? std::string("; nothing written (no --out)")
                                        : concat("; wrote ", flags.out_dir, "/compare.json and ", configs[ran - 1].out_dir,
                                                 "/summary.json (marked interrupted)"))
              << std::endl;
    return interrupted_exit(interrupted->signal, session);
  }
  return 0;
}

}  // namespace

Subcommand add_compare_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  auto methods = std::make_shared<std::string>(default_compare_list());
  auto target_accuracy = std::make_shared<std::optional<double>>();
  auto wide = std::make_shared<bool>(false);
  Subcommand compare;
  compare.command = app.add_subcommand("compare", "Train several methods one after another; one table");
  compare.command
      ->add_option("--algos", *methods,
                   concat("Comma-separated methods, each name[+option]... (", join(method_names()), "), e.g. ",
                          example_compare_lists(),
                          ". A method option given as a flag applies to the methods that take it; an option a "
                          "method's spec names wins over the flag for it"))
      ->capture_default_str();
  compare.command->add_option("--target-accuracy", *target_accuracy,
                              "The accuracy whose time to reach the table shows per method (\"time to X%\"), as a fraction "
                              "in (0, 1], e.g. 0.85: test accuracy, or train accuracy with --no-eval. Default: the best "
                              "accuracy every method reached");
  compare.command->add_flag("--wide", *wide,
                            "Every column of the table (the stage times, comm, stretch, comm CPU ns/B, the prediction, "
                            "both accuracies) and lines unwrapped; the default table fits 100 characters (compare.json "
                            "with --out has every figure)");
  add_train_flags(*compare.command, *flags);
  compare.transport = [flags] { return flags->transport; };
  compare.run = [flags, methods, target_accuracy, wide](MpiSession* session) {
    return run_compare(*flags, *methods, *target_accuracy, *wide, session);
  };
  compare.command_line = [flags](const std::vector<std::string>& argv) { flags->command_line = argv; };
  return compare;
}

}  // namespace pipesgd
