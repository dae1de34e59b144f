// The launchers: every rank of a run as a thread of this process, or this process's MPI rank. Both
// prepare the run the same way (prepare_run), run the same worker and server functions, and
// summarize the same records.
#include "pipesgd/train/trainer.h"

#include <atomic>
#include <exception>
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
#include "pipesgd/train/metrics_file.h"
#include "pipesgd/train/report.h"
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

// The stream of metrics.jsonl of `workers` (the workers of this process, in the order of their
// EarlyStop slots) if the run has an --out directory and this is its leader.
std::unique_ptr<MetricsStream> open_metrics_stream(const RunContext& run, bool leader,
                                                   std::span<const WorkerRecord> workers, const EarlyStop& stop) {
  if (!leader || run.config.out_dir.empty()) return nullptr;
  return std::make_unique<MetricsStream>(run.config.out_dir, metrics_lines(run, workers), stop, run.start_iteration());
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

}  // namespace

RunSummary run_training(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data) {
  const RunContext run = prepare_run(config, data.train, /*leader=*/true);
  std::vector<std::unique_ptr<Model>> models;
  for (int rank = 0; rank < config.workers; ++rank) models.push_back(build_model(factory, config.seed));
  // Parameter-server methods: S server ranks after the M workers, each serving one shard of the
  // plan, from the replicas' common initial weights. The plan is built here so that a bad --servers
  // fails before any thread starts.
  std::unique_ptr<ShardPlan> shard_plan;
  if (run.servers > 0) shard_plan = std::make_unique<ShardPlan>(plan_shards(models[0]->layout(), run.servers));
  std::vector<float> initial_weights;
  if (run.servers > 0) initial_weights.assign(models[0]->parameters().begin(), models[0]->parameters().end());
  const int ranks = config.workers + run.servers;

  LocalFabric fabric(ranks, config.network);
  std::vector<WorkerRecord> records(static_cast<std::size_t>(config.workers));
  LeaderRecord leader;
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(ranks));
  std::atomic<bool> worker_failed{false};          // stops the servers at once (ServeOptions::stop)
  std::atomic<bool> injected_fault_ended{false};   // a worker ended by --inject-fault
  const FaultControl faults{&worker_failed, /*rank_is_process=*/false, config.method.common.timeout};
  EarlyStop stop(config.workers, config.interrupt, config.method.common.timeout);
  const std::unique_ptr<MetricsStream> metrics = open_metrics_stream(run, /*leader=*/true, records, stop);

  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      Transport& transport = fabric.endpoint(rank);
      try {
        if (rank < config.workers) {
          run_worker(run, rank, *models[static_cast<std::size_t>(rank)], transport, data, faults, stop,
                     records[static_cast<std::size_t>(rank)], rank == 0 ? &leader : nullptr,
                     rank == 0 ? metrics.get() : nullptr);
        } else {
          serve_shard(run, *shard_plan, initial_weights, transport, &worker_failed);
        }
      } catch (const InjectedFault&) {
        // --inject-fault: this worker "died" without a word; the others find out by their timeouts.
        injected_fault_ended.store(true, std::memory_order_release);
      } catch (const std::exception& error) {
        failures[static_cast<std::size_t>(rank)] = std::current_exception();
        transport.report_failure(error.what());
        if (rank < config.workers) worker_failed.store(true, std::memory_order_release);
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
  if (metrics) metrics->close();
  RunSummary summary = summarize(run, records, leader, *models[0]);
  summary.interrupted = interruption(run, summary.timing.iterations, stop.signal(), config.workers);
  if (!config.out_dir.empty()) write_summary_file(config.out_dir, summary);
  write_final_model(config, summary, *models[0]);
  return summary;
}

RunSummary run_training_rank(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data,
                             Transport& transport) {
  const int rank = transport.rank();
  validate_train_config(config);
  const int servers = server_ranks(config);
  if (config.workers + servers != transport.size()) {
    throw UsageError(concat("--workers ", config.workers, servers > 0 ? concat(" + --servers ", servers) : std::string(),
                            " does not match the ", transport.size(), " ranks of ", transport.describe()));
  }
  // Every rank reads the same directories (a shared file system across hosts).
  const RunContext run = prepare_run(config, data.train, /*leader=*/rank == 0);
  std::unique_ptr<Model> model = build_model(factory, config.seed);
  if (run.servers > 0) {
    // Every rank builds the plan, so a bad --servers is the same usage error on every rank.
    const ShardPlan shard_plan = plan_shards(model->layout(), run.servers);
    if (rank >= config.workers) {
      // A server rank: serves its shard from the replicas' common initial weights (every rank built
      // the model from the seed), then returns a summary of the set-up only (rank 0's is printed).
      try {
        serve_shard(run, shard_plan, model->parameters(), transport, nullptr);
      } catch (const std::exception& error) {
        transport.report_failure(error.what());
        throw;
      }
      RunSummary summary;
      summary.setup.method_spec = config.method.spec;
      summary.setup.workers = config.workers;
      summary.setup.servers = run.servers;
      return summary;
    }
  }
  std::vector<WorkerRecord> records(static_cast<std::size_t>(config.workers));
  WorkerRecord& own = records[static_cast<std::size_t>(rank)];
  LeaderRecord leader;
  const FaultControl faults{nullptr, /*rank_is_process=*/true, config.method.common.timeout};
  EarlyStop stop(1, config.interrupt, config.method.common.timeout);  // this process's one worker
  const std::unique_ptr<MetricsStream> metrics = open_metrics_stream(run, rank == 0, std::span(&own, 1), stop);
  run_worker(run, rank, *model, transport, data, faults, stop, own, rank == 0 ? &leader : nullptr,
             metrics.get());  // reports its own failure
  if (metrics) metrics->close();
  const bool interrupted = own.completed < run.plan.total_iterations;
  if (!interrupted) {
    try {
      // The timings are gathered among the workers only.
      RankSubsetTransport workers = first_ranks(transport, config.workers);
      gather_at_leader(workers, run, records);
    } catch (const std::exception& error) {
      transport.report_failure(error.what());
      throw;
    }
  }
  // Another rank, and rank 0 of a run stopped early (the ranks stopped separately, each told the
  // others through the failure notice: nothing more can be gathered), summarize their own view.
  const bool all = rank == 0 && !interrupted;
  RunSummary summary = summarize(run, all ? std::span(records) : std::span(&own, 1), leader, *model);
  if (!all && config.keep_parameters) {  // in its own place, as in a summary of every rank
    std::vector<std::vector<float>> placed(static_cast<std::size_t>(config.workers));
    placed[static_cast<std::size_t>(rank)] = std::move(summary.final_parameters.front());
    summary.final_parameters = std::move(placed);
  }
  summary.interrupted = interruption(run, own.completed, own.stop_signal, 1);
  if (rank != 0 || config.out_dir.empty()) return summary;
  // The stream held rank 0's times; the file gets every rank's means.
  if (all) write_metrics_file(config.out_dir, metrics_lines(run, records), run.start_iteration(), summary.timing.iterations, summary.epochs);
  write_summary_file(config.out_dir, summary);
  write_final_model(config, summary, *model);
  return summary;
}

}  // namespace pipesgd
