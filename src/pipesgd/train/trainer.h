#pragma once
// The training run: N workers (threads over a LocalFabric, or MPI ranks) train one model with one method on one
// data set, and the run reports per-iteration timings, per-epoch accuracy and a summary.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipesgd/algo/training_method.h"
#include "pipesgd/train/fault_injection.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/timing/od_sgd_timing_model.h"
#include "pipesgd/timing/pipe_timing_model.h"

namespace pipesgd {

// Bounds of a run, checked before anything is allocated.
inline constexpr int kMaxWorkers = 1024;
inline constexpr std::size_t kMaxBatch = std::size_t{1} << 20;
inline constexpr std::int64_t kMaxIterations = 10'000'000;
inline constexpr int kMaxServers = 1024;

struct TrainConfig {
  std::string method_spec = "dsync";  // as given: name[+codec]
  MethodConfig method;                // resolved from the spec and the flags
  int workers = 4;
  int servers = 0;                    // server ranks (pssync, asgd, dcasgd, odsgd); 0: 1 for those
  std::string model = "mlp";
  std::size_t batch = 25;             // per worker
  std::int64_t epochs = 1;
  std::int64_t iterations = 0;        // > 0: run exactly this many iterations instead of epochs
  // Synchronous iterations first: pipe runs them as D-Sync, odsgd trains them on the global weights
  // (algo/od_sgd.h; the CLI gives odsgd kOdSgdDefaultWarmupIterations when neither flag is set).
  std::int64_t warmup_epochs = 0;
  std::int64_t warmup_iterations = 0; // plus this many iterations
  std::uint64_t seed = 1;
  NetworkSpec network;
  std::string out_dir;                // "": write nothing
  bool progress = true;               // progress output on stderr (bar on a tty, lines otherwise)
  bool evaluate = true;               // test accuracy after every epoch
  bool keep_parameters = false;       // return every rank's final parameters (tests)
  bool deprioritize_compute = true;   // core/thread_priority.h: comm threads preempt compute
  // Reliability. --on-nonfinite: a NaN or Inf in a worker's gradient, found before it is
  // communicated, stops the run with a NumericalError naming the rank, layer and iteration ("stop")
  // or is replaced by zeros in that layer with a warning ("skip"). --check-consistency N: every N
  // iterations the workers compare a checksum of their weights (methods with identical replicas
  // only); a difference stops the run with a ReplicaDivergenceError naming the ranks. --inject-fault:
  // train/fault_injection.h.
  // Checkpoints: every `checkpoint_every` iterations each worker writes its part (weights, method
  // and optimizer state, its position in the epoch) and rank 0 the shared part (epoch records, the
  // run's fingerprint) to checkpoint_dir, atomically (core/checkpoint.h); `resume` continues from
  // the newest complete valid set there, skipping torn or corrupt ones with a warning.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  bool resume = false;
  std::string on_nonfinite = "stop";
  std::int64_t check_consistency = 0;
  FaultInjection fault;
};

struct EpochRecord {
  std::int64_t epoch = 0;
  std::int64_t iterations = 0;   // iterations run so far
  double train_loss = 0;         // mean over this epoch's iterations and workers
  // Fraction of this epoch's training examples (all workers) whose prediction, made on the
  // weights the worker trained on, was right: the running training accuracy.
  double train_accuracy = 0;
  double test_accuracy = -1;     // fraction in [0, 1]; -1 if not evaluated
  double test_loss = -1;
  double elapsed_seconds = 0;    // training wall time so far (evaluation excluded)
};

// OD-SGD's performance model (od-sgd.txt Eq. 1-3) beside the measurement, for odsgd runs: T_org
// and T'_com from the synchronous warm-up iterations (SSGD on the same servers), T_cop and T_com
// from the pipelined iterations.
struct OdSgdReport {
  std::int64_t sync_iterations = 0;  // warm-up iterations measured (0: T_org, T'_com unknown)
  double sync_iteration = 0;         // measured T_org (mean warm-up iteration), seconds
  OdSgdTimes times;                  // T_cop = compute thread busy, T_com = comm thread, T'_com
  double predicted_iteration = 0;    // Eq. 2: T_new
  // max(T_cop, T_com): the iteration time of this implementation's pipeline, whose next push waits
  // for the previous pull (as the paper's comm_buf_ dependency, Fig. 8), so that when T_com > T_cop
  // an iteration takes T_com rather than Eq. 2's average (T_com + T_cop) / 2.
  double overlap_bound = 0;
  double predicted_improvement = 0;  // Eq. 3 (0 if sync_iterations == 0)
  double measured_improvement = 0;   // (T_org - measured T_new) / T_org (0 if sync_iterations == 0)
};

struct RunSummary {
  std::string method_spec;
  std::string model;
  int workers = 0;
  int servers = 0;  // parameter-server ranks (0 for the allreduce methods)
  std::size_t batch = 0;
  std::string network;
  std::string codec;
  std::string segmenting;  // allreduce message segmenting in effect ("256 KiB", "unsegmented")
  std::string allreduce;   // the gradient allreduce's algorithm ("auto" resolved)
  int staleness = 0;
  MethodReport method_report;         // rank 0's method's report (layer-wise: its planning inputs)
  std::string plan;                   // layer-wise methods: the bucket plan in use ("" otherwise)
  std::size_t allreduce_calls = 0;    // gradient allreduces per iteration (0: parameter server)
  double non_overlapped_comm = 0;     // layer-wise: measured t_c^no (the wait after backward)
  double predicted_non_overlapped_comm = 0;  // layer-wise: the plan's t_c^no
  std::int64_t iterations = 0;
  std::int64_t measured_iterations = 0;  // those averaged below (warm-up and start-up excluded)
  IterationTimes mean;                   // per-iteration means over workers and measured iterations
  double throughput = 0;                 // samples/s = workers * batch / mean.iteration
  double train_seconds = 0;              // wall time of all iterations (evaluation excluded)
  StageTimes stages;                     // the measured stage times the models use
  double predicted_sync_iteration = 0;   // Eq. 2
  double predicted_pipe_iteration = 0;   // Eq. 4
  double predicted_iteration = 0;        // the equation of this method
  double link_model_comm = 0;            // Eq. 5 from the emulated link (0 without emulation)
  std::optional<OdSgdReport> od_sgd;     // odsgd runs with pipelined iterations measured
  double final_train_accuracy = 0;       // the last epoch's running training accuracy
  double final_test_accuracy = -1;
  std::uint64_t bytes_sent_per_iteration = 0;  // per worker
  std::uint64_t weights_checksum = 0;          // FNV-1a of rank 0's final parameters
  std::int64_t nonfinite_skipped = 0;          // --on-nonfinite skip: layers zeroed, all workers
  std::int64_t consistency_checks = 0;         // --check-consistency: checks passed
  std::int64_t resumed_from = -1;              // --resume: the iteration the run continued from
  std::vector<EpochRecord> epochs;
  std::vector<std::vector<float>> final_parameters;  // per rank, if keep_parameters
};

// Splits "pipe+int8" into the method name and its options; fills config.method. Throws UsageError.
void apply_method_spec(const std::string& spec, TrainConfig& config);

// The number of server ranks the run has: config.servers, or 1 if it is 0 and the method needs
// servers (pssync, asgd); 0 for the other methods.
int resolved_servers(const TrainConfig& config);

// Checks everything about `config` that does not depend on the data set; throws UsageError with a
// one-line message naming the flag. run_training calls it too.
void validate_train_config(const TrainConfig& config);

// Runs the training with config.workers workers as threads of this process over a LocalFabric
// (config.network emulates their links). Parameter-server methods add resolved_servers(config)
// server threads as ranks M..M+S-1 of the fabric (their links are emulated like the workers'). Throws UsageError / DataError / CommError with a one-line
// message.
RunSummary run_training(const TrainConfig& config, const ModelFactory& factory,
                        const DataSplits& data);

// Runs this process's worker of a run whose workers are the ranks of `transport`, one per process
// (MpiTransport); config.workers + resolved_servers(config) must equal transport.size(). With a
// parameter-server method, ranks config.workers.. are the servers: they serve their shard until
// every worker closed and return a summary with only method_spec, workers and servers set (a server
// notices a failed worker only by --comm-timeout, see ps/parameter_server.h). Collective: every rank calls it with
// the same config and data. Ranks 1..p-1 send their timings to rank 0, so the returned summary is
// complete on rank 0 only; only rank 0 prints progress and writes config.out_dir. Training is the
// same computation as run_training with the same config: same weights, bit for bit.
RunSummary run_training_rank(const TrainConfig& config, const ModelFactory& factory,
                             const DataSplits& data, Transport& transport);

}  // namespace pipesgd
