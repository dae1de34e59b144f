// The launchers: every rank of a run as a thread of this process, or this process's MPI rank. One
// launch (launch) prepares the run, runs the same worker and server functions and summarizes the
// same records; a RankHost says what differs (the hosted ranks, their transports, how they run and
// fail, how the records reach rank 0).
#include "pipesgd/train/trainer.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <thread>

#include "pipesgd/algo/registry.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/comm/rank_failures.h"
#include "pipesgd/comm/rank_subset_transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/ps/parameter_server.h"
#include "pipesgd/ps/shard_plan.h"
#include "pipesgd/train/checkpointing.h"
#include "pipesgd/train/early_stop.h"
#include "pipesgd/train/elastic.h"
#include "pipesgd/report/metrics_file.h"
#include "pipesgd/report/report.h"
#include "pipesgd/train/summary.h"
#include "pipesgd/train/worker.h"

namespace pipesgd {
namespace {

// Serves this server rank's shard of a parameter-server method from the replicas' common initial
// weights, with checkpoints (restored from the set being resumed, written with every set).
void serve_shard(const RunContext& run, const ShardPlan& shard_plan, std::span<const float> initial_weights,
                 Transport& transport, const std::atomic<bool>* stop) {
  const TrainConfig& config = run.config;
  // --trace: the server's track (its requests, at the pushes' versions: a push and a pull per worker
  // and iteration, within the bound of a worker thread's events for a model of `workers` layers).
  ThreadTrace* trace = nullptr;
  if (const TraceTarget& target = config.trace; target.recorder != nullptr) {
    const int server = transport.rank() - config.workers;
    trace = &target.recorder->add_thread(target.first_process + transport.rank(), concat(target.label, "server ", server),
                                         "serve",
                                         trace_events_per_thread(target.recorder->window(), run.plan.total_iterations,
                                                                 static_cast<std::size_t>(config.workers)));
  }
  const ScopedThreadTrace installed(trace);
  ParameterServerShard shard(transport, shard_plan, config.workers, initial_weights,
                             config.method.common.optimizer.sgd);
  BackgroundCheckpointWriter writer;
  PIPESGD_ASSERT(config.method.descriptor->serve);  // every method with servers says how they serve
  ServeOptions options = config.method.descriptor->serve(*config.method.options, config.method.common, config.workers);
  options.stop = stop;
  options.learning_rate_schedule = run_learning_rate_schedule(run);
  options.on_checkpoint = server_checkpoints(run, shard, writer);
  shard.serve(options);
  writer.finish();
}

// The servers' shards of `layout`; a --servers the model cannot take is a usage error naming it.
ShardPlan plan_shards(const Layout& layout, int servers) {
  if (static_cast<std::size_t>(servers) > layout.segment_count()) {
    throw UsageError(concat("--servers ", servers, " exceeds the model's ", layout.segment_count(),
                            " parameter segments: each server must own at least one whole segment"));
  }
  return ShardPlan(layout, servers);
}

// Builds every replica one after another (model initialisation may use a global RNG).
std::unique_ptr<Model> build_model(const ModelFactory& factory, std::uint64_t seed) {
  std::unique_ptr<Model> model = factory(seed);
  if (model->layout().total() == 0) throw UsageError("the model has no parameters");
  return model;
}

// metrics.jsonl's lines of the per-iteration times of `workers`.
MetricsLines metrics_lines(const RunContext& run, std::span<const WorkerRecord> workers) {
  std::vector<const std::vector<IterationTimes>*> times;
  for (const WorkerRecord& worker : workers) times.push_back(&worker.times);
  return MetricsLines(std::move(times), run.plan.iterations_per_epoch,
                      run.config.method.common.optimizer.sgd.learning_rate, run_learning_rate_schedule(run));
}

// --restarts: what metrics.jsonl keeps of the attempts before this one ("": none).
std::string metrics_prefix(const TrainConfig& config) {
  return config.recovery != nullptr ? config.recovery->metrics_prefix : std::string();
}

// The stream of metrics.jsonl of `workers` (the workers of this process, in the order of their
// EarlyStop slots) if the run has an --out directory and this is its leader.
std::unique_ptr<MetricsStream> open_metrics_stream(const RunContext& run, bool leader,
                                                   std::span<const WorkerRecord> workers, const EarlyStop& stop) {
  if (!leader || run.config.out_dir.empty()) return nullptr;
  return std::make_unique<MetricsStream>(run.config.out_dir, metrics_lines(run, workers), stop, run.start_iteration(),
                                         metrics_prefix(run.config));
}

// The interruption of a run whose workers completed `completed` iterations, if that is fewer than
// the plan's; `signal`: the one that stopped it.
std::optional<Interruption> interruption(const RunContext& run, std::int64_t completed, int signal, int workers) {
  if (completed >= run.plan.total_iterations) return std::nullopt;
  return Interruption{signal, completed, run.plan.total_iterations, workers};
}

// When every rank is its own process: ranks 1..M-1 send their per-iteration times and counts to
// rank 0, which needs them for the summary. Collective over the workers.
void gather_at_leader(Transport& workers, const RunContext& run, std::vector<WorkerRecord>& records) {
  constexpr const char* kOperation = "gathering the run's timings";
  struct Counts {
    std::uint64_t bytes_sent = 0;
    std::int64_t nonfinite_skipped = 0;
    std::int64_t completed = 0;
    double loss_sum = 0;
  };
  const Tag base = collective_tag(Channel::kControl, static_cast<std::uint64_t>(2 * run.plan.epochs));
  const Timeout timeout = run.config.method.common.timeout;
  const int rank = workers.rank();
  auto times_of = [&](int r) { return std::as_writable_bytes(std::span(records[static_cast<std::size_t>(r)].times)); };
  if (rank != 0) {
    const WorkerRecord& own = records[static_cast<std::size_t>(rank)];
    const Counts counts{own.bytes_sent, own.nonfinite_skipped, own.completed, own.loss_sum};
    Request times = workers.send(0, step_tag(base, 0, 0), times_of(rank), kOperation);
    Request count = workers.send(0, step_tag(base, 0, 1), std::as_bytes(std::span(&counts, 1)), kOperation);
    times.wait(timeout);
    count.wait(timeout);
    return;
  }
  for (int peer = 1; peer < workers.size(); ++peer) {
    WorkerRecord& record = records[static_cast<std::size_t>(peer)];
    record.times.assign(static_cast<std::size_t>(run.plan.total_iterations), IterationTimes{});
    Counts counts;
    Request times = workers.recv(peer, step_tag(base, 0, 0), times_of(peer), kOperation);
    Request count = workers.recv(peer, step_tag(base, 0, 1), std::as_writable_bytes(std::span(&counts, 1)), kOperation);
    if (times.wait(timeout) != times_of(peer).size() || count.wait(timeout) != sizeof counts) {
      throw CommError(concat(kOperation, ": rank ", peer, " ran a different number of iterations"));
    }
    record.bytes_sent = counts.bytes_sent;
    record.nonfinite_skipped = counts.nonfinite_skipped;
    record.completed = counts.completed;
    record.loss_sum = counts.loss_sum;
  }
}

// With --out, a completed run's model as TorchScript: rank 0's replica, the one its final evaluation
// used (an interrupted run writes none).
void write_final_model(const TrainConfig& config, RunSummary& summary, Model& model) {
  if (config.out_dir.empty() || summary.interrupted) return;
  const std::filesystem::path path = std::filesystem::path(config.out_dir) / kModelFileName;
  if (write_model_file(path, model)) summary.model_file = path.string();
}

// Which workers' records a process holds once its ranks ran.
enum class RecordsHeld {
  kHosted,        // its own workers' only
  kEveryStreamed, // every worker's, all hosted here (the metrics stream had them all)
  kEveryGathered, // every worker's, gathered at rank 0 after the metrics stream closed
};

// What differs between the launchers: which of the run's ranks this process hosts (workers, then
// servers), how their transports are made, how they run and fail, and whether rank 0 then holds
// every worker's record. The rest of a launch is written once (launch, below).
class RankHost {
 public:
  virtual ~RankHost() = default;

  // Before the run is prepared: throws UsageError if this host cannot hold the run's ranks.
  virtual void check_ranks(const TrainConfig& config) const = 0;
  // The run's ranks this process hosts: [first_rank(), end_rank(ranks)) of `ranks`.
  virtual int first_rank() const = 0;
  virtual int end_rank(int ranks) const = 0;
  // Makes the hosted ranks' transports, for a run of `ranks` ranks.
  virtual void connect(const TrainConfig& config, int ranks) = 0;
  virtual Transport& transport(int rank) = 0;
  // How a worker's failure and --inject-fault reach the others (FaultControl), and the servers' stop.
  virtual FaultControl fault_control(Timeout timeout) const = 0;
  virtual const std::atomic<bool>* servers_stop() const = 0;
  // Runs `run_rank` for every hosted rank; returns once all ended, or throws the run's failure.
  virtual void run_ranks(const TrainConfig& config, const std::function<void(int rank)>& run_rank) = 0;
  // After the workers ran: brings every worker's record (`records`, by rank) to rank 0 where they
  // are elsewhere; says which this process then holds.
  virtual RecordsHeld gather(const RunContext& run, std::vector<WorkerRecord>& records) = 0;
};

// Every rank a thread of this process, over a LocalFabric.
class ThreadRanks final : public RankHost {
 public:
  void check_ranks(const TrainConfig&) const override {}  // prepare_run validates the rest
  int first_rank() const override { return 0; }
  int end_rank(int ranks) const override { return ranks; }
  void connect(const TrainConfig& config, int ranks) override { fabric_.emplace(ranks, config.network); }
  Transport& transport(int rank) override { return fabric_->endpoint(rank); }
  FaultControl fault_control(Timeout timeout) const override {
    FaultControl control;
    control.any_worker_failed = &worker_failed_;
    control.timeout = timeout;
    LocalFabric* fabric = fabric_ ? &*fabric_ : nullptr;  // connect() came first
    PIPESGD_ASSERT(fabric != nullptr);
    control.slow_link = [fabric](int rank, double factor) { fabric->slow_link(rank, factor); };
    return control;
  }
  const std::atomic<bool>* servers_stop() const override { return &worker_failed_; }

  void run_ranks(const TrainConfig& config, const std::function<void(int rank)>& run_rank) override {
    const int ranks = fabric_->size();
    std::vector<std::exception_ptr> failures(static_cast<std::size_t>(ranks));
    std::atomic<bool> injected_fault_ended{false};  // a worker ended by --inject-fault
    std::vector<std::thread> threads;
    for (int rank = 0; rank < ranks; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          run_rank(rank);
        } catch (const InjectedFault&) {
          // --inject-fault: this worker "died" without a word; the others find out by their timeouts.
          // With --restarts this launcher watches its workers, as torchrun's agent or mpirun watches
          // its processes: a worker that died is reported to the others at once.
          injected_fault_ended.store(true, std::memory_order_release);
          const FaultInjection& fault = config.reliability.fault;
          if (config.recovery != nullptr && fault.kind == FaultInjection::Kind::kCrash) {
            transport(rank).report_failure(concat("worker ", rank, " died (crash injected at iteration ",
                                                  fault.iteration, ")"));
            if (rank < config.workers) worker_failed_.store(true, std::memory_order_release);
          }
        } catch (const std::exception& error) {
          failures[static_cast<std::size_t>(rank)] = std::current_exception();
          transport(rank).report_failure(error.what());
          if (rank < config.workers) worker_failed_.store(true, std::memory_order_release);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    rethrow_root_cause(failures);
    if (injected_fault_ended.load(std::memory_order_acquire)) {
      // No other worker was there to notice (a single worker): the run did not complete.
      const FaultInjection& fault = config.reliability.fault;
      throw CommError(concat("worker ", fault.rank, " was stopped by --inject-fault at iteration ", fault.iteration,
                             " and no other worker was left to report it"));
    }
  }

  RecordsHeld gather(const RunContext&, std::vector<WorkerRecord>&) override { return RecordsHeld::kEveryStreamed; }

 private:
  mutable std::optional<LocalFabric> fabric_;  // mutable: fault_control hands out kind=slow's hook
  std::atomic<bool> worker_failed_{false};  // stops the servers at once (ServeOptions::stop)
};

// This process is one rank of `transport` (MpiTransport), one rank per process.
class ProcessRank final : public RankHost {
 public:
  explicit ProcessRank(Transport& transport) : transport_(transport) {}

  void check_ranks(const TrainConfig& config) const override {
    validate_train_config(config);
    const int servers = server_ranks(config);
    if (config.workers + servers != transport_.size()) {
      throw UsageError(concat("--workers ", config.workers, servers > 0 ? concat(" + --servers ", servers) : std::string(),
                              " does not match the ", transport_.size(), " ranks of ", transport_.describe()));
    }
  }
  int first_rank() const override { return transport_.rank(); }
  int end_rank(int) const override { return transport_.rank() + 1; }
  void connect(const TrainConfig&, int) override {}
  Transport& transport(int) override { return transport_; }
  FaultControl fault_control(Timeout timeout) const override {
    FaultControl control;
    control.rank_is_process = true;
    control.timeout = timeout;
    return control;
  }
  // A server rank notices a failed worker only by --comm-timeout (ps/parameter_server.h).
  const std::atomic<bool>* servers_stop() const override { return nullptr; }
  // A worker reports its own failure (run_worker), a server its own (launch).
  void run_ranks(const TrainConfig&, const std::function<void(int rank)>& run_rank) override {
    run_rank(transport_.rank());
  }

  // A run stopped early gathers nothing (the ranks stopped separately, each told the others through
  // the failure notice); else the workers send their records to rank 0.
  RecordsHeld gather(const RunContext& run, std::vector<WorkerRecord>& records) override {
    const int rank = transport_.rank();
    const bool interrupted = records[static_cast<std::size_t>(rank)].completed < run.plan.total_iterations;
    if (interrupted) return RecordsHeld::kHosted;
    try {
      // The timings are gathered among the workers only.
      RankSubsetTransport workers = first_ranks(transport_, run.config.workers);
      gather_at_leader(workers, run, records);
    } catch (const std::exception& error) {
      transport_.report_failure(error.what());
      throw;
    }
    return rank == 0 ? RecordsHeld::kEveryGathered : RecordsHeld::kHosted;
  }

 private:
  Transport& transport_;
};

// The launch of every run: prepares it, builds this process's replicas (and the servers' shard
// plan), runs the hosted ranks and summarizes what this process holds; rank 0 writes --out.
RunSummary launch(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data, RankHost& host) {
  host.check_ranks(config);
  const int first = host.first_rank();
  // Every process reads the same directories (a shared file system across hosts).
  const RunContext run = prepare_run(config, data.train, /*leader=*/first == 0);
  const int ranks = config.workers + run.servers;
  const int end = host.end_rank(ranks);
  const int hosted_workers = std::max(0, std::min(end, config.workers) - first);
  // One replica per hosted worker; a process of a server only builds one for the initial weights.
  std::vector<std::unique_ptr<Model>> models;
  for (int w = 0; w < std::max(1, hosted_workers); ++w) models.push_back(build_model(factory, config.seed));
  // Parameter-server methods: S server ranks after the M workers, each serving one shard of the
  // plan, from the replicas' common initial weights (every process builds them from the seed). Every
  // process builds the plan, so that a bad --servers fails at once and the same everywhere.
  std::optional<ShardPlan> shard_plan;
  std::vector<float> initial_weights;
  if (run.servers > 0) {
    shard_plan.emplace(plan_shards(models[0]->layout(), run.servers));
    if (end > config.workers) initial_weights.assign(models[0]->parameters().begin(), models[0]->parameters().end());
  }
  host.connect(config, ranks);

  std::vector<WorkerRecord> records(static_cast<std::size_t>(config.workers));
  const std::span<WorkerRecord> hosted_records = std::span(records).subspan(
      static_cast<std::size_t>(std::min(first, config.workers)), static_cast<std::size_t>(hosted_workers));
  LeaderRecord leader;
  FaultControl faults = host.fault_control(config.method.common.timeout);
  if (config.recovery != nullptr) faults.fired_at_ns = &config.recovery->failed_at_ns;
  std::optional<EarlyStop> stop;  // slots: the hosted workers
  if (hosted_workers > 0) stop.emplace(hosted_workers, config.interrupt, config.method.common.timeout);
  const std::unique_ptr<MetricsStream> metrics =
      hosted_workers > 0 ? open_metrics_stream(run, first == 0, hosted_records, *stop) : nullptr;

  host.run_ranks(config, [&](int rank) {
    Transport& transport = host.transport(rank);
    if (rank < config.workers) {
      const WorkerRun shared{run, data, faults, *stop};
      run_worker(shared, rank, *models[static_cast<std::size_t>(rank - first)], transport,
                 WorkerSinks{records[static_cast<std::size_t>(rank)], rank == 0 ? &leader : nullptr,
                             rank == 0 ? metrics.get() : nullptr});  // reports its own failure
      return;
    }
    try {
      serve_shard(run, *shard_plan, initial_weights, transport, host.servers_stop());
    } catch (const std::exception& error) {
      transport.report_failure(error.what());
      throw;
    }
  });
  if (hosted_workers == 0) {
    // A process of a server: a summary of the set-up only (rank 0's is printed).
    RunSummary summary;
    summary.setup.method_spec = config.method.spec;
    summary.setup.workers = config.workers;
    summary.setup.servers = run.servers;
    return summary;
  }
  if (metrics) metrics->close();
  const RecordsHeld held = host.gather(run, records);
  const bool all = held != RecordsHeld::kHosted;
  // Without every worker's records, a process summarizes its own workers' view.
  RunSummary summary = summarize(run, all ? std::span(records) : hosted_records, leader, *models[0]);
  if (!all && config.keep_parameters) {  // in their own places, as in a summary of every rank
    std::vector<std::vector<float>> placed(static_cast<std::size_t>(config.workers));
    for (std::size_t w = 0; w < hosted_records.size(); ++w) {
      placed[static_cast<std::size_t>(first) + w] = std::move(summary.final_parameters[w]);
    }
    summary.final_parameters = std::move(placed);
  }
  summary.interrupted =
      interruption(run, summary.timing.iterations, hosted_records.front().stop_signal, hosted_workers);
  if (config.recovery != nullptr) {
    config.recovery->complete_last_recovery();
    summary.recoveries = config.recovery->recoveries;
  }
  if (first != 0 || config.out_dir.empty()) return summary;
  // The stream held this process's workers' times; with every worker's gathered, the file gets their means.
  if (held == RecordsHeld::kEveryGathered) {
    write_metrics_file(config.out_dir, metrics_lines(run, records), run.start_iteration(), summary.timing.iterations,
                       summary.epochs, metrics_prefix(config));
  }
  write_summary_file(config.out_dir, summary);
  write_final_model(config, summary, *models[0]);
  return summary;
}

}  // namespace

RunSummary run_training(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data) {
  auto attempt = [&](const TrainConfig& attempt_config) {
    ThreadRanks threads;
    return launch(attempt_config, factory, data, threads);
  };
  if (config.reliability.restarts > 0 && config.recovery == nullptr) {
    validate_train_config(config);
    return run_with_restarts(config, attempt);
  }
  return attempt(config);
}

RunSummary run_training_rank(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data,
                             Transport& transport) {
  if (config.reliability.restarts > 0 && config.recovery == nullptr) {
    throw UsageError("--restarts under --transport mpi: launch with pipesgdrun --restarts R (Open MPI ends the whole "
                     "job when a rank dies; pipesgdrun relaunches it and the ranks resume from the newest commit)");
  }
  ProcessRank process(transport);
  return launch(config, factory, data, process);
}

}  // namespace pipesgd
