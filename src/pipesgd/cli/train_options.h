#pragma once
// The flags of `train` and `compare`: the run's own (workers, model, data, batch, length, network,
// outputs, reliability) and every method option the registry declares (algo/registry.h), which a
// method takes or rejects as its registry entry says.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipesgd/algo/registry.h"
#include "pipesgd/cli/cli_common.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/train/elastic.h"
#include "pipesgd/train/run_config.h"
#include "pipesgd/report/run_summary.h"

namespace pipesgd {

// The flags as typed, before validation.
struct TrainFlags {
  int workers = 4;
  std::string model = "mlp";
  std::string loss = "cross-entropy";
  std::string data = "fashion-mnist";
  std::string data_dir;
  std::int64_t epochs = 1;
  std::int64_t iterations = 0;
  std::int64_t seed = 1;
  // Plain SGD at 0.1: the setting of the Pipe-SGD paper's analysis; stale gradients under heavy
  // momentum overshoot (see docs/results.md), so momentum is opt-in.
  float learning_rate = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  std::string lr_schedule = "constant";  // optim/lr_schedule.h
  std::int64_t lr_warmup = 0;
  std::int64_t batch = 25;
  std::string network = "none";
  double comm_timeout_seconds = 120;
  std::string out_dir;
  std::string trace_path;        // --trace FILE ("": none)
  std::string trace_iterations;  // --trace-iters A:B ("": every iteration)
  std::string transport = "local";
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  bool resume = false;
  std::string on_nonfinite = "stop";
  std::int64_t check_consistency = 0;
  std::vector<std::string> inject_fault;  // --inject-fault, each time given (the k-th for attempt k)
  int restarts = 0;
  bool quiet = false;
  bool no_eval = false;
  std::vector<std::string> command_line;  // argv, for summary.json
  // Every method option (registry), as text: flag -> value, filled by add_train_flags' options.
  std::map<std::string, std::string> method_values;
  CLI::App* command = nullptr;  // to tell which flags appeared
};

// Adds the run's flags and every method option to `command`.
void add_train_flags(CLI::App& command, TrainFlags& flags);

// The method options that appeared on the command line.
OptionValues given_method_options(const TrainFlags& flags);

// Every method option the registry declares as a flag of `command`, its text into values[flag]
// (train, compare, simulate, advise); and those of them that appeared on the command line.
void add_method_option_flags(CLI::App& command, std::map<std::string, std::string>& values);
OptionValues given_method_options(const CLI::App& command, const std::map<std::string, std::string>& values);

// The run of `method_spec` with `flags` (policy: train rejects a flag its method does not take,
// compare applies each flag to the methods of its list that take it). Checks everything that does
// not need the data. Under MPI (`session`) the workers are mpirun's ranks, less the servers, and
// `relaunch` (launcher_restart_of) is pipesgdrun --restarts's word on this launch, if any.
TrainConfig to_train_config(const TrainFlags& flags, const std::string& method_spec, FlagPolicy policy,
                            const MpiSession* session, const std::optional<LauncherRestart>& relaunch);

// Under MPI (`session`), the launch pipesgdrun --restarts says this process belongs to (its
// PIPESGD_RESTART* environment, train/elastic.h); nullopt otherwise. UsageError if malformed.
std::optional<LauncherRestart> launcher_restart_of(const MpiSession* session);

DataSplits load_data(const TrainFlags& flags);

// Pipe-SGD's gradients are K-1 steps stale with nothing compensating (its registry trait,
// MethodTraits::stale_without_compensation), and SGD momentum amplifies a stale gradient: measured
// (docs/user-guide.md, "Momentum with a stale method"), dsync vs pipe+int8 on Fashion-MNIST lose
// 0.2 points at momentum 0, 0.4 at 0.3, 1.0-1.2 at 0.5 and 6.2-6.5 at 0.9. From momentum
// kStaleMomentumWarning (where the loss passes 1 point) on, train and compare warn at start-up: the
// one line stale_momentum_warning returns ("" when nothing is at stake), which advises sapipe,
// momentum <= kStaleMomentumAdvice or dsync.
inline constexpr float kStaleMomentumWarning = 0.5f;
inline constexpr float kStaleMomentumAdvice = 0.3f;
std::string stale_momentum_warning(const TrainConfig& config);

// Fills config.provenance (command line, transport, data set, versions) for summary.json and makes
// the run stop cleanly on SIGINT / SIGTERM (core/interrupt.h; the handlers are installed here).
void prepare_run_record(TrainConfig& config, const TrainFlags& flags, const DataSplits& data,
                        const MpiSession* session);

// After a run stopped early: the exit code 128 + signal. Under MPI the process ends here, without
// MPI_Finalize (the ranks told each other through the failure notice); a rank other than 0 first
// waits up to kRankZeroGrace for rank 0 to finish (mpirun then ends it).
inline constexpr std::chrono::seconds kRankZeroGrace{10};
int interrupted_exit(int signal, MpiSession* session);

// "interrupted by SIGINT after iteration 37 of 60", for the line of a run stopped early.
std::string describe_interruption(const Interruption& interrupted);

// "4 workers (threads), network 10gbe (...)" or "4 workers as MpiTransport ...".
std::string describe_workers(const TrainConfig& config, const MpiSession* session);

}  // namespace pipesgd
