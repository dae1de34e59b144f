#pragma once
// Elastic training in the C++ API: a world that survives a worker's failure by rolling back to the
// newest commit every worker took (docs/user-guide.md, "Surviving failures"; Horovod Elastic's
// State with commit/restore/sync, over pipesgd's exact optimizer state).
//
//   pipesgd::ElasticOptions options;
//   options.world.workers = 4;
//   options.restarts = 3;
//   pipesgd::run_elastic(options, [&](pipesgd::Worker& worker, pipesgd::ElasticState& state) {
//     Net net;                                            // built the same way on every attempt
//     pipesgd::DistributedOptimizer optimizer(worker, *net, optimizer_options);
//     state.restore(optimizer);                           // after a rollback: the newest commit
//     for (std::int64_t& step = state.value("step"); step < steps;) {
//       net->forward(batch(step)).backward();
//       ++step;
//       if (step % 50 == 0) state.step_and_commit(optimizer); else optimizer.step();
//     }
//     optimizer.finish();
//   });
//
// A commit is each worker's DistributedOptimizer state (OptimizerState: the parameters, the method's
// state such as the pipeline's updates in flight, the iteration) with the loop's own counters
// (value()); a rollback returns to the newest step at which every worker committed, so the run ends
// with the weights of a run never interrupted, bit for bit. Worker-only methods (the optimizer
// state of a parameter-server method lives on its servers: step_and_save_state's UsageError).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "pipesgd/distributed_optimizer.h"
#include "pipesgd/world.h"

namespace pipesgd {

struct ElasticOptions {
  WorldOptions world;
  // Rollbacks allowed: a failure that a rollback can cure (a CommError: a worker died, hung or was
  // cut off) rebuilds the world and runs fn again on every worker, up to `restarts` times.
  int restarts = 0;
  // "" : the commits are kept in this process's memory (run_elastic only). A directory: each
  // worker writes its commit there as a file (atomically, checksummed; the 2 newest complete steps
  // are kept), which a relaunched world reads (run_elastic_mpi requires one, on a file system every
  // host reads).
  std::string commit_dir;
};

// One worker's view of the commits of an elastic run. Used by the thread fn runs on only.
class ElasticState {
 public:
  struct Impl;
  explicit ElasticState(std::unique_ptr<Impl> impl);
  ~ElasticState();
  ElasticState(const ElasticState&) = delete;
  ElasticState& operator=(const ElasticState&) = delete;

  // A counter of the loop (an epoch, a batch, a step), committed and restored with the optimizer;
  // 0 until set. The reference stays valid for the state's life.
  std::int64_t& value(const std::string& name);
  // In place of optimizer.step() at a commit boundary: steps and saves the optimizer's state
  // (DistributedOptimizer::step_and_save_state) and commits it with the values. The commit counts
  // once every worker took it at the same step.
  void step_and_commit(DistributedOptimizer& optimizer);
  // After a rollback: loads this worker's part of the newest complete commit into `optimizer` (a
  // new one, before its first backward) and the values, and returns true. On the first attempt,
  // or when no commit was complete before the failure, changes nothing and returns false (the run
  // starts from the beginning). DataError for a corrupt commit file.
  bool restore(DistributedOptimizer& optimizer);
  // Rank 0's values become every worker's (a collective; every worker has the same value names).
  void sync(Worker& worker);

  int attempt() const;                 // 0: the first; k: after the k-th rollback or relaunch
  std::int64_t restored_step() const;  // the optimizer step of the commit restore() loaded; -1: none

 private:
  std::unique_ptr<Impl> impl_;
};

// Runs fn(worker, state) on options.world.workers threads as run_threads does; when the world fails
// with a CommError, prints one line on stderr (`pipesgd: restart k of R: <failure>; rolling back to
// the commit of step S`), builds a new world and runs fn again on every worker, whose
// state.restore() returns to the newest complete commit; up to options.restarts times. Any other
// failure (a usage, data or numerical error, or the user's own exception) is rethrown at once; so is
// the failure that exhausted the restarts, with where the newest commit is.
void run_elastic(const ElasticOptions& options, const std::function<void(Worker&, ElasticState&)>& fn);

// Under `pipesgdrun --restarts R` (which relaunches a failed job: Open MPI ends the whole job when a
// rank dies): run_mpi with each worker's state reading and writing its commits in
// options.commit_dir (required); a relaunched world's state.restore() returns to the newest commit
// every worker wrote. Without pipesgdrun it runs once, as run_mpi. UsageError without commit_dir.
int run_elastic_mpi(int* argc, char*** argv, const ElasticOptions& options,
                    const std::function<void(Worker&, ElasticState&)>& fn);

}  // namespace pipesgd
