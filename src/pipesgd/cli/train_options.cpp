#include "pipesgd/cli/train_options.h"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/timeout.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/interrupt.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/torch/torchscript_model.h"
#include "pipesgd/train/elastic.h"

namespace pipesgd {
namespace {

// A method option's --help text from every declaration of it: what it does, for which methods
// (grouped where the methods' texts agree), and the default.
std::string method_option_help(const DeclaredOption& option) {
  struct Group {
    const OptionDeclaration* declaration;
    std::vector<std::string> methods;
  };
  std::vector<Group> groups;
  for (std::size_t k = 0; k < option.methods.size(); ++k) {
    const OptionDeclaration& declaration = *option.declarations[k];
    const std::string name = declaration.condition.empty() ? option.methods[k]->name
                                                           : concat(option.methods[k]->name, " ", declaration.condition);
    auto same = std::find_if(groups.begin(), groups.end(), [&](const Group& group) {
      return group.declaration->help == declaration.help && group.declaration->default_text == declaration.default_text;
    });
    if (same == groups.end()) {
      groups.push_back({&declaration, {name}});
    } else {
      same->methods.push_back(name);
    }
  }
  std::vector<std::string> parts;
  for (const Group& group : groups) {
    const std::string& fallback = group.declaration->default_text;
    parts.push_back(concat(group.declaration->help, " [", join_and(group.methods),
                           fallback.empty() ? std::string() : concat("; default: ", fallback), "]"));
  }
  return join(parts, "; ");
}

}  // namespace

void add_train_flags(CLI::App& command, TrainFlags& flags) {
  flags.command = &command;
  command.add_option("--workers", flags.workers, "Workers: threads of this process (--transport local); under mpi the ranks")
      ->capture_default_str();
  command.add_option("--transport", flags.transport,
                     "local (workers are threads of this process) or mpi (one worker per rank of mpirun -np N)")
      ->capture_default_str();
  command.add_option("--model", flags.model, kModelFlagHelp)->capture_default_str();
  command.add_option("--loss", flags.loss, kLossFlagHelp)->capture_default_str();
  command.add_option("--data", flags.data, kDataFlagHelp)->capture_default_str();
  command.add_option("--data-dir", flags.data_dir, data_dir_flag_help());
  command.add_option("--epochs", flags.epochs, "Epochs to train (>= 1); --iters replaces them")->capture_default_str();
  command.add_option("--iters", flags.iterations,
                     concat("Train exactly this many iterations (1 to ", kMaxIterations,
                            ") instead of whole epochs; give --iters or --epochs, not both"));
  command.add_option("--seed", flags.seed, "Seed of the model initialisation and data shuffling")->capture_default_str();
  command.add_option("--lr", flags.learning_rate, "Learning rate (SGD's, and Adam's with --optimizer adam)")
      ->capture_default_str();
  command.add_option("--lr-schedule", flags.lr_schedule,
                     "Learning-rate schedule, scaling every learning rate of every method (the update of iteration "
                     "t's gradient uses lr(t), even when it is applied later): constant; step:EVERY_EPOCHS:GAMMA "
                     "(lr * GAMMA^floor(epoch / EVERY_EPOCHS)); multistep:E1,E2,...:GAMMA (lr * GAMMA^(milestones "
                     "<= epoch)); cosine (lr * (1 + cos(pi t / T)) / 2 over the run's T iterations). GAMMA in (0, 1]")
      ->capture_default_str();
  command.add_option("--lr-warmup", flags.lr_warmup,
                     "Linear learning-rate warm-up: iteration t < N uses (t + 1) / N of the scheduled rate")
      ->capture_default_str();
  command.add_option("--momentum", flags.momentum, "SGD momentum")->capture_default_str();
  command.add_option("--weight-decay", flags.weight_decay, "Weight decay (L2)")->capture_default_str();
  command.add_option("--batch", flags.batch, "Per-worker batch (4 workers x 25 = the paper's global batch of 100)")
      ->capture_default_str();
  command.add_option("--net", flags.network, "Emulated network per worker: none, 1gbe, 10gbe, 25gbe, 100gbe or bw=2.5Gbit,lat=30us")
      ->capture_default_str();
  command.add_option("--comm-timeout", flags.comm_timeout_seconds, "Seconds any wait on a peer may take before the run fails")
      ->capture_default_str();
  command.add_option("--checkpoint-dir", flags.checkpoint_dir,
                     "Directory of checkpoints: written every --checkpoint-every iterations (atomically, with a "
                     "checksum; the 2 newest complete ones are kept), read by --resume");
  command.add_option("--checkpoint-every", flags.checkpoint_every,
                     "Write a checkpoint every N iterations (every method; parameter servers write their shards too; "
                     "0: never)")
      ->capture_default_str();
  command.add_flag("--resume", flags.resume,
                   "Continue from the newest complete, valid checkpoint in --checkpoint-dir (torn or corrupt ones are "
                   "skipped with a warning); the result is bit-identical to an uninterrupted run");
  command.add_option("--on-nonfinite", flags.on_nonfinite,
                     "A NaN or Inf in a worker's gradient, found before it is sent: stop (the run ends naming the rank, "
                     "layer and iteration) or skip (that layer's gradient is replaced by zeros, with a warning)")
      ->capture_default_str();
  command.add_option("--check-consistency", flags.check_consistency,
                     "Every N iterations the workers compare a checksum of their weights; a difference stops the run "
                     "naming the ranks (the methods with identical replicas; 0: never)")
      ->capture_default_str();
  command.add_option("--inject-fault", flags.inject_fault,
                     "Testing: rank=R,iter=N,kind=crash|hang[,at=iteration|checkpoint|allreduce|push] makes worker R "
                     "die (crash) or go silent (hang) at the start of iteration N (at=iteration), mid-write of its "
                     "checkpoint after N (at=checkpoint), mid-way through N's gradient allreduce (at=allreduce, "
                     "allreduce methods) or N's push to the servers (at=push, parameter-server methods); the others "
                     "must exit within --comm-timeout. rank=R,iter=N,kind=slow,factor=F instead slows worker R's "
                     "emulated link F times from iteration N on (--net with a bandwidth) and the run goes on. With "
                     "--restarts it may be given again: the k-th is armed in the k-th restart");
  command.add_option("--restarts", flags.restarts,
                     "When a worker fails, roll back to the newest commit and go on, up to R times: commits every "
                     "--checkpoint-every iterations (50 if not given), in memory or in --checkpoint-dir; the result "
                     "is bit-identical to an uninterrupted run. Under MPI: pipesgdrun --restarts R relaunches the job")
      ->capture_default_str();
  command.add_option("--out", flags.out_dir, "Directory to write metrics.jsonl and summary.json to (compare: compare.json)");
  command.add_option("--trace", flags.trace_path,
                     "Write the run's timeline to FILE in the Chrome trace event format (open it in "
                     "https://ui.perfetto.dev or chrome://tracing): every worker's compute and comm threads, "
                     "the servers, gradient arrows from each allreduce to the update that applies it");
  command.add_option("--trace-iters", flags.trace_iterations,
                     "With --trace: record iterations A <= t < B only (A:B, A: or :B; default: all)");
  command.add_flag("--quiet", flags.quiet, "No progress output");
  command.add_flag("--no-eval", flags.no_eval, "Skip the test-set evaluation after each epoch");
  add_method_option_flags(command, flags.method_values);
}

void add_method_option_flags(CLI::App& command, std::map<std::string, std::string>& values) {
  // Every method option the registry declares; the method decides whether it takes it.
  for (const DeclaredOption& option : declared_options()) {
    command.add_option(option.flag, values[option.flag], method_option_help(option));
  }
}

OptionValues given_method_options(const CLI::App& command, const std::map<std::string, std::string>& values) {
  OptionValues given;
  for (const auto& [flag, value] : values) {
    if (command.count(flag) > 0) given.set(flag, value);
  }
  return given;
}

OptionValues given_method_options(const TrainFlags& flags) {
  return given_method_options(*flags.command, flags.method_values);
}

std::optional<LauncherRestart> launcher_restart_of(const MpiSession* session) {
  if (session == nullptr) return std::nullopt;
  return launcher_restart([](const char* name) { return std::getenv(name); });
}

TrainConfig to_train_config(const TrainFlags& flags, const std::string& method_spec, FlagPolicy policy,
                            const MpiSession* session, const std::optional<LauncherRestart>& relaunch) {
  CommonOptions base;
  base.optimizer.sgd = SgdOptions{flags.learning_rate, flags.momentum, flags.weight_decay};
  base.timeout = timeout_from_seconds(flags.comm_timeout_seconds, "--comm-timeout");
  base.lr_schedule = parse_lr_schedule(flags.lr_schedule, flags.lr_warmup, {"--lr-schedule", "--lr-warmup"});
  TrainConfig config;
  config.method = select_method(method_spec, given_method_options(flags), policy, base);
  if (flags.seed < 0) throw UsageError(concat("--seed must be >= 0, got ", flags.seed));
  // --iters 0 would mean "whole epochs" to TrainConfig: on the command line that is --iters left out.
  if (flags.command->count("--iters") > 0) {
    if (flags.iterations < 1 || flags.iterations > kMaxIterations) {
      throw UsageError(concat("--iters must be in [1, ", kMaxIterations, "], got ", flags.iterations,
                              "; omit --iters to train whole epochs (--epochs)"));
    }
    if (flags.command->count("--epochs") > 0) {
      throw UsageError("--epochs and --iters: give one (--iters N trains exactly N iterations, --epochs E whole epochs)");
    }
  }
  if (flags.batch < 1 || flags.batch > static_cast<std::int64_t>(kMaxBatch)) {
    throw UsageError(concat("--batch must be in [1, ", kMaxBatch, "], got ", flags.batch));
  }
  const bool workers_given = flags.command->count("--workers") > 0;
  const int servers = config.method.options->servers();
  if (session != nullptr && servers > 0) {
    // Under MPI the last S ranks of mpirun -np N are the servers: N - S workers.
    const int ranks = session->runtime.size();
    if (servers >= ranks) {
      throw UsageError(concat("--servers ", servers, " leaves no worker among the ", ranks,
                              " MPI ranks (mpirun -np): the last S ranks are the servers"));
    }
    if (workers_given && flags.workers != ranks - servers) {
      throw UsageError(concat("--workers ", flags.workers, " does not match the ", ranks, " MPI ranks (mpirun -np) minus ",
                              servers, " server(s); leave --workers out under --transport mpi"));
    }
    config.workers = ranks - servers;
  } else {
    config.workers = resolve_workers(flags.workers, workers_given, session);
  }
  // Threads of this process with a core each: the compute thread polls its comm thread briefly
  // before blocking (comm/comm_worker.h). Under MPI the comm thread polls already: never.
  if (session == nullptr) config.method.common.wait_spin = wait_spin_for(config.workers + servers);
  config.model = flags.model;
  config.batch = static_cast<std::size_t>(flags.batch);
  config.epochs = flags.epochs;
  config.iterations = flags.iterations;
  config.seed = static_cast<std::uint64_t>(flags.seed);
  config.network = parse_network_spec(flags.network, "--net");
  if (session != nullptr && config.network.emulated()) {
    throw UsageError("--net emulates links between threads of one process; under --transport mpi the network is the "
                     "real one (drop --net)");
  }
  config.out_dir = flags.out_dir;
  config.progress = !flags.quiet && prints_results(session);
  config.evaluate = !flags.no_eval;
  config.has_accuracy = loss_has_accuracy(parse_loss(flags.loss));
  ReliabilityOptions& reliability = config.reliability;
  reliability.on_nonfinite = flags.on_nonfinite;
  reliability.check_consistency = flags.check_consistency;
  reliability.checkpoint_dir = flags.checkpoint_dir;
  reliability.checkpoint_every = flags.checkpoint_every;
  reliability.resume = flags.resume;
  reliability.restarts = flags.restarts;
  // pipesgdrun --restarts relaunches the job: its count applies (train/elastic.h).
  if (relaunch) reliability.restarts = relaunch->restarts;
  const bool every_given = flags.command != nullptr && flags.command->count("--checkpoint-every") > 0;
  if (reliability.restarts > 0 && !every_given) reliability.checkpoint_every = kDefaultCommitInterval;
  for (std::size_t k = 0; k < flags.inject_fault.size(); ++k) {
    const FaultInjection fault = parse_fault_injection(flags.inject_fault[k]);
    if (k == 0) {
      reliability.fault = fault;
    } else {
      reliability.restart_faults.push_back(fault);
    }
  }
  validate_train_config(config);  // before loading any data
  return config;
}

DataSplits load_data(const TrainFlags& flags) {
  DataSplits data = load_data_set(flags.data, flags.data_dir, flags.seed);
  check_data_fits_builtin_model(flags.model, data, flags.data);
  return data;
}

std::string stale_momentum_warning(const TrainConfig& config) {
  const MethodSelection& method = config.method;
  const OptimizerOptions& optimizer = method.common.optimizer;
  const int k = method.options->staleness();
  if (!method.traits().stale_without_compensation || k < 2 || optimizer.name != "sgd" ||
      optimizer.sgd.momentum < kStaleMomentumWarning) {
    return "";
  }
  return concat("pipesgd: warning: ", method.spec, " applies gradients ", k - 1, (k == 2 ? " step" : " steps"),
                " stale (K = ", k, ") and momentum ", optimizer.sgd.momentum,
                " amplifies them: expect lower accuracy (at momentum 0.9, 4 to 10 points below dsync: docs/results.md); use "
                "sapipe, momentum <= ", kStaleMomentumAdvice, ", or dsync");
}

void prepare_run_record(TrainConfig& config, const TrainFlags& flags, const DataSplits& data,
                        const MpiSession* session) {
  if (const std::string warning = stale_momentum_warning(config);
      !warning.empty() && (session == nullptr || session->leader())) {
    std::cerr << warning << std::endl;
  }
  RunProvenance& provenance = config.provenance;
  provenance.command_line = flags.command_line;
  provenance.transport = flags.transport;
  const DataSetDescription described = describe_data_set(flags.data, flags.data_dir, flags.seed);
  provenance.data_set = described.set;
  provenance.data_source = described.source;
  provenance.train_examples = data.train.size;
  provenance.test_examples = data.test.size;
  if (!flags.trace_path.empty()) provenance.trace_file = std::filesystem::absolute(flags.trace_path).lexically_normal().string();
  provenance.versions = {{"pipesgd", pipesgd_version()}, {"libtorch", torch_version()}};
  if (session != nullptr) provenance.versions.emplace_back("mpi", session->runtime.library_version());
  install_interrupt_handlers();
  config.interrupt = &interrupt_signal();
}

int interrupted_exit(int signal, MpiSession* session) {
  const int code = 128 + signal;
  if (session == nullptr) return code;
  if (!session->leader()) {
    // mpirun ends the job (SIGKILL) as soon as a rank exits non-zero: wait for rank 0 to write the
    // run's files and exit first.
    std::this_thread::sleep_for(kRankZeroGrace);
  }
  MpiRuntime::exit_without_finalize(code);
}

std::string describe_interruption(const Interruption& interrupted) {
  return concat("interrupted by ", signal_name(interrupted.signal), " after iteration ", interrupted.at_iteration,
                " of ", interrupted.of_iterations);
}

std::string describe_workers(const TrainConfig& config, const MpiSession* session) {
  const int servers = server_ranks(config);
  const std::string workers =
      concat(config.workers, " workers",
             servers > 0 ? concat(" + ", servers, servers == 1 ? " server" : " servers") : std::string());
  if (session != nullptr) return concat(workers, " as ", session->transport.describe());
  return concat(workers, " (threads), network ", describe(config.network));
}

}  // namespace pipesgd
