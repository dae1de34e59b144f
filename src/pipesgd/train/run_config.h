#pragma once
// What a training run is asked to do: the method (selected and configured through the registry,
// algo/registry.h), the workers, the model, the data's batching and length, the network, outputs
// and reliability options.
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "pipesgd/algo/registry.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/train/fault_injection.h"

namespace pipesgd {

// Bounds of a run, checked before anything is allocated.
inline constexpr int kMaxWorkers = 1024;
inline constexpr std::size_t kMaxBatch = std::size_t{1} << 20;
inline constexpr std::int64_t kMaxIterations = 10'000'000;
inline constexpr int kMaxRestarts = 1000;

// --on-nonfinite, --check-consistency, checkpoints and --inject-fault.
struct ReliabilityOptions {
  // A NaN or Inf in a worker's gradient, found before it is communicated, stops the run with a
  // NumericalError naming the rank, layer and iteration ("stop") or is replaced by zeros in that
  // layer with a warning ("skip").
  std::string on_nonfinite = "stop";
  // Every N iterations (0: never) the workers compare a checksum of their weights (methods with
  // identical replicas only); a difference stops the run with a ReplicaDivergenceError naming the
  // ranks.
  std::int64_t check_consistency = 0;
  // Every `checkpoint_every` iterations (0: never) each worker writes its part (weights, method and
  // optimizer state, its place in the epoch) and rank 0 the shared part (epoch records, the run's
  // fingerprint) to `checkpoint_dir`, atomically (core/checkpoint.h); `resume` continues from the
  // newest complete valid set there, skipping torn or corrupt ones with a warning.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  bool resume = false;
  FaultInjection fault;  // train/fault_injection.h (this attempt's)
  // --restarts R: a failed worker rolls the run back to its newest commit, up to R times
  // (train/elastic.h); needs checkpoint_every > 0 (the commits).
  int restarts = 0;
  // --inject-fault given again: the k-th of these is armed in the k-th restart (testing).
  std::vector<FaultInjection> restart_faults;
};

// Where a run comes from, for summary.json's configuration (the CLI fills it; tests may leave it).
struct RunProvenance {
  std::vector<std::string> command_line;  // argv
  std::string transport = "local";        // local (the workers are threads) or mpi
  std::string data_set;                   // fashion-mnist, synthetic, ...
  std::string data_source;                // the directory read, or how the data was made
  std::size_t train_examples = 0;
  std::size_t test_examples = 0;
  std::string trace_file;                 // --trace FILE as an absolute path ("": none); `report` finds it
  // What the run was built with, name -> version (pipesgd, LibTorch, the MPI library).
  std::vector<std::pair<std::string, std::string>> versions;
};

// --trace: where the run's threads record their timeline (core/trace.h). The caller owns the
// recorder and writes it after the run (or its failure). Rank r is trace process first_process + r
// (servers after the workers), named "<label>worker r" / "<label>server s".
struct TraceTarget {
  TraceRecorder* recorder = nullptr;  // nullptr: nothing is recorded
  int first_process = 0;
  std::string label;  // e.g. "pipe+int8: " in a comparison
};

struct RecoveryLog;  // train/elastic.h

struct TrainConfig {
  MethodSelection method;      // select_method(spec, flags, ...)
  int workers = 4;             // the parameter-server methods add method.options->servers() server ranks
  std::string model = "mlp";   // for reports (the caller builds the models)
  std::size_t batch = 25;      // per worker
  std::int64_t epochs = 1;
  std::int64_t iterations = 0;  // > 0: run exactly this many iterations instead of epochs
  std::uint64_t seed = 1;
  NetworkSpec network;         // threads only: the emulated links
  std::string out_dir;         // "": write nothing
  bool progress = true;        // progress output on stderr (bar on a tty, lines otherwise)
  bool evaluate = true;        // test accuracy after every epoch
  // False when the model's loss has no accuracy (a TorchScript model with --loss mse): every accuracy
  // is then -1, written as null in metrics.jsonl / summary.json and "-" in reports.
  bool has_accuracy = true;
  bool keep_parameters = false;  // return every rank's final parameters (tests)
  bool deprioritize_compute = true;  // core/thread_priority.h: comm threads preempt compute
  // Rank 0 warns on stderr when the run ends before its method's deferred phase (report/short_run.h;
  // off for runs meant to end there, such as `pipesgd plan`'s profiling).
  bool warn_short_run = true;
  ReliabilityOptions reliability;
  TraceTarget trace;
  // Once it holds a signal's number (core/interrupt.h), the run stops at the next iteration
  // boundary and reports what it completed (train/early_stop.h). nullptr: it never stops early.
  const std::atomic<int>* interrupt = nullptr;
  RunProvenance provenance;
  // --restarts: shared by the run's attempts (train/elastic.h); nullptr for a run without.
  RecoveryLog* recovery = nullptr;
};

// "a, b and c" of the registered methods whose traits satisfy `has` (for messages).
std::string methods_where(const std::function<bool(const MethodTraits&)>& has);

// Whether a run of this method may continue the commit of another number of workers (every
// replica holds the same weights and method state, and there are no servers' shards).
inline bool continues_another_world(const MethodTraits& traits) {
  return traits.replicas_identical && !traits.uses_servers;
}

// The server ranks the run has (0 for the allreduce methods).
inline int server_ranks(const TrainConfig& config) { return config.method.options->servers(); }

// Checks everything about `config` that does not depend on the data set; throws UsageError with a
// one-line message naming the flag. The runs call it too.
void validate_train_config(const TrainConfig& config);

}  // namespace pipesgd
