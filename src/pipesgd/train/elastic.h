#pragma once
// --restarts R: a run that survives failures. A commit is a complete checkpoint set (every worker's
// part, the shared part, every server's shard: checkpointing.h), the state from which the run
// continues exactly as an uninterrupted one would; the workers take one every --checkpoint-every
// iterations (50 with --restarts unless given), in this process's memory (MemoryCommits, which
// outlives any worker of the process: no file, no checksum pass) or in --checkpoint-dir. When a
// worker fails, the run's attempt ends (every survivor stops within --comm-timeout, at once for a worker that died), and
// the run rolls back to the newest complete commit and continues, up to R times: the final weights
// equal an uninterrupted run's, bit for bit, and at most one commit interval of work is redone.
//
// Among threads (run_training) the rollback happens in this process. Under MPI, where Open MPI
// ends the whole job when a rank dies, `pipesgdrun --restarts R` relaunches the world and each rank
// resumes from the newest commit in --checkpoint-dir (restart_from_launcher).
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pipesgd/report/run_summary.h"
#include "pipesgd/train/checkpointing.h"
#include "pipesgd/train/run_config.h"

namespace pipesgd {

// The interval of commits with --restarts when --checkpoint-every is not given.
inline constexpr std::int64_t kDefaultCommitInterval = 50;

// What the attempts of one run share with the workers of the attempt under way. The controller's
// thread owns `recoveries` and `metrics_prefix` (read by the attempt's launch, between attempts);
// the workers write the atomics.
struct RecoveryLog {
  std::vector<Recovery> recoveries;  // the failures recovered from so far, in order
  // The commits, when they are kept in memory (no --checkpoint-dir; nullptr: in the directory).
  std::unique_ptr<MemoryCommits> memory_commits;
  // metrics.jsonl's lines kept from the attempts before (their iterations before the commit rolled
  // back to, and a "rollback" record per failure): the next attempt writes them first.
  std::string metrics_prefix;
  // A relaunch's commit (restart_from_launcher looked for it): the first prepare_run after takes it
  // instead of looking again (find_committed_world validates every part of the set it returns).
  bool relaunch_world_found = false;
  std::optional<CommittedWorld> relaunch_world;

  // This attempt's, reset by begin_attempt.
  std::atomic<std::int64_t> furthest{0};         // iterations completed by the furthest worker
  std::atomic<std::int64_t> failed_at_ns{0};     // when an injected fault fired (0: none did)
  std::atomic<std::int64_t> first_done_ns{0};    // when rank 0 completed its first iteration
  std::atomic<std::int64_t> attempt_start_ns{0};

  // Rank 0 records the time of each commit it takes (the newest few: the rollback finds its own).
  void note_commit(std::int64_t iteration);
  // When the commit of `iteration` was taken in this attempt, or the attempt's start for 0 / one
  // not taken in it.
  std::int64_t commit_time_ns(std::int64_t iteration) const;
  void begin_attempt();
  // A worker completed its iterations [0, completed) (each worker, every iteration: lock-free).
  void note_iteration_done(int rank, std::int64_t completed);
  // The controller: a failure rolled back; its timings are completed, once the attempt after it
  // completed its first iteration, by complete_last_recovery (launch calls it before the summary).
  void add_recovery(Recovery recovery, std::int64_t failure_ns, std::int64_t commit_ns);
  void complete_last_recovery();

 private:
  bool pending_ = false;  // the last recovery's timings are still to complete
  std::int64_t pending_failure_ns_ = 0;
  std::int64_t pending_commit_ns_ = 0;
  mutable std::mutex commits_mutex_;
  std::vector<std::pair<std::int64_t, std::int64_t>> commits_;  // (iteration, time), newest last
};

// Runs `attempt` (one launch of the run with the given config) until it completes, rolling back
// to the newest commit after each failure that a restart can cure (a CommError: a worker died,
// hung or was cut off), up to config.reliability.restarts times. Attempt k arms the k-th of the
// run's injected faults (ReliabilityOptions::fault, then restart_faults). Without --checkpoint-dir
// the commits are kept in memory (MemoryCommits). Throws the failure
// that exhausted the restarts, with where the newest commit is; a usage, data or numerical error is
// not retried (it would fail again).
RunSummary run_with_restarts(const TrainConfig& config, const std::function<RunSummary(const TrainConfig&)>& attempt);

// Under MPI: the attempt pipesgdrun --restarts says this process belongs to (PIPESGD_RESTART,
// PIPESGD_RESTARTS and PIPESGD_RESTART_FAILURES in `environment`); nullopt when it was not launched
// so.
struct LauncherRestart {
  int attempt = 0;   // 0: the first launch
  int restarts = 0;  // pipesgdrun's --restarts
  // The failed launches as pipesgdrun records them: a JSON list of {attempt, exit_code,
  // failed_at_unix_s, seconds}, oldest first.
  std::string failures;
};
std::optional<LauncherRestart> launcher_restart(const std::function<const char*(const char*)>& environment);

// Prepares `config` for its attempt of a world pipesgdrun relaunches: commits every
// --checkpoint-every (50 if not given) in --checkpoint-dir (required: the next attempt's ranks read
// it), the attempt's injected fault, and --resume from the newest complete commit when there is
// one, of this world or of another (pipesgdrun --min-np relaunched fewer ranks: the run continues it,
// train/run_context.h's RunPlan::shift). The leader (rank 0) also fills `log` with the failed attempts (pipesgdrun's records, each
// rolled back to the commit resumed) and metrics.jsonl's lines kept, and the config points at it.
// Throws UsageError for a config that cannot restart so.
void restart_from_launcher(TrainConfig& config, const LauncherRestart& restart, RecoveryLog& log, bool leader);

// metrics.jsonl's lines in `out_dir` that a run rolled back to `commit` keeps: the records before
// it (iterations before `commit`, epochs that ended by it, earlier rollback and resume records),
// then `recovery` as a "rollback" record. The iteration after the last iteration record kept or
// seen goes to `*last_recorded` (0 if none).
std::string metrics_kept_after_rollback(const std::string& out_dir, const Recovery& recovery,
                                        std::int64_t* last_recorded = nullptr);

}  // namespace pipesgd
