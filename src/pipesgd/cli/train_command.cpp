// `pipesgd train`: one method, the timing breakdown and the timing models' predictions.
#include <cstdlib>
#include <iostream>
#include <memory>

#include "pipesgd/cli/command_trace.h"
#include "pipesgd/cli/commands.h"
#include "pipesgd/cli/train_options.h"
#include "pipesgd/core/error.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/report/report.h"
#include "pipesgd/train/elastic.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {
namespace {

std::string methods_help() {
  std::string text = concat("Method, optionally followed by +options (a codec, a bucket plan, a compensation: e.g. ",
                            example_method_specs(), "): ");
  for (const MethodDescriptor* method : method_registry()) text += concat("\n  ", method->name, ": ", method->summary);
  return text;
}

int run_train(const TrainFlags& flags, const std::string& method_spec, MpiSession* session) {
  const std::optional<LauncherRestart> relaunch = launcher_restart_of(session);
  TrainConfig config = to_train_config(flags, method_spec, FlagPolicy::kReject, session, relaunch);
  RecoveryLog recovery;  // a job pipesgdrun --restarts relaunches: this attempt's place among them
  if (relaunch) restart_from_launcher(config, *relaunch, recovery, session->transport.rank() == 0);
  CommandTrace trace(flags.trace_path, flags.trace_iterations);
  config.trace = trace.target(0, "");
  if (prints_results(session)) prepare_output_directory(config.out_dir);  // before the data is read
  check_model_flags(config.model, flags.loss);
  const DataSplits data = load_data(flags);
  const ModelFactory factory = make_model_factory(config.model, flags.loss, data.train);
  prepare_run_record(config, flags, data, session);
  if (prints_results(session)) {
    std::cout << "pipesgd train: " << config.method.spec << " on " << config.model << " (" << data.train.name << ", "
              << data.train.size << " training examples), " << describe_workers(config, session) << std::endl;
  }
  RunSummary summary;
  try {
    summary = session != nullptr ? run_training_rank(config, factory, data, session->transport)
                                 : run_training(config, factory, data);
  } catch (const std::exception& error) {
    trace.write_after_failure(session, error.what());
    throw;
  }
  if (summary.interrupted) {
    trace.write_after_failure(session, describe_interruption(*summary.interrupted));
  } else {
    trace.write(session, config.method.common.timeout);
  }
  if (!prints_results(session)) return summary.interrupted ? interrupted_exit(summary.interrupted->signal, session) : 0;
  print_run_report(std::cout, summary);
  if (summary.interrupted) {
    std::cout << std::flush;
    const Interruption& interrupted = *summary.interrupted;
    const std::string& out = config.out_dir;
    std::cerr << "pipesgd: " << describe_interruption(interrupted)
              << (out.empty() ? std::string("; nothing written (no --out)")
                              : concat("; wrote ", out, "/summary.json (marked interrupted) and ", out, "/metrics.jsonl"))
              << (interrupted.workers_reported < config.workers ? " (rank 0's times: the ranks stopped separately)" : "")
              << std::endl;
    return interrupted_exit(interrupted.signal, session);
  }
  if (!config.out_dir.empty()) {
    std::cout << "wrote " << config.out_dir << "/{metrics.jsonl,summary.json" << (summary.model_file.empty() ? "" : ",model.pt")
              << "}\n";
  }
  return 0;
}

}  // namespace

Subcommand add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  auto method = std::make_shared<std::string>(default_method_spec());
  Subcommand train;
  train.command = app.add_subcommand("train", "Train one method and report the timing breakdown");
  train.command->add_option("--algo", *method, methods_help())->capture_default_str();
  add_train_flags(*train.command, *flags);
  train.transport = [flags] { return flags->transport; };
  train.run = [flags, method](MpiSession* session) { return run_train(*flags, *method, session); };
  train.command_line = [flags](const std::vector<std::string>& argv) { flags->command_line = argv; };
  return train;
}

}  // namespace pipesgd
