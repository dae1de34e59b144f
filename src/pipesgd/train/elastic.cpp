#include "pipesgd/train/elastic.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/checkpointing.h"
#include "pipesgd/train/run_context.h"

namespace pipesgd {
namespace {

double seconds_between(std::int64_t from_ns, std::int64_t to_ns) { return static_cast<double>(to_ns - from_ns) * 1e-9; }

// The iteration of the newest complete, valid commit in `dir` (0: none). Torn sets are skipped
// quietly: the rollback says which commit it takes.
std::int64_t newest_commit(const std::string& dir, const TrainConfig& config) {
  const auto set = find_newest_valid_checkpoint(dir, checkpoint_part_names(config), [](const std::string&) {});
  return set ? set->iteration : 0;
}

// The fault armed in attempt `attempt` (0: the run's first).
FaultInjection fault_of_attempt(const ReliabilityOptions& reliability, int attempt) {
  if (attempt == 0) return reliability.fault;
  const auto index = static_cast<std::size_t>(attempt - 1);
  return index < reliability.restart_faults.size() ? reliability.restart_faults[index] : FaultInjection{};
}

nlohmann::json rollback_record(const Recovery& recovery) {
  nlohmann::json record = {{"type", "rollback"},
                           {"attempt", recovery.attempt},
                           {"failure", recovery.failure},
                           {"reached_iteration", recovery.reached},
                           {"to_iteration", recovery.rolled_back_to},
                           {"iterations_redone", recovery.iterations_redone()}};
  record["detection_s"] = recovery.detection_seconds < 0 ? nlohmann::json(nullptr)
                                                         : nlohmann::json(recovery.detection_seconds);
  return record;
}

}  // namespace

void RecoveryLog::note_commit(std::int64_t iteration) {
  const std::lock_guard lock(commits_mutex_);
  commits_.emplace_back(iteration, unix_time_ns());
  if (commits_.size() > 4) commits_.erase(commits_.begin());
}

std::int64_t RecoveryLog::commit_time_ns(std::int64_t iteration) const {
  const std::lock_guard lock(commits_mutex_);
  for (const auto& [taken, at] : commits_) {
    if (taken == iteration) return at;
  }
  return attempt_start_ns.load(std::memory_order_relaxed);
}

void RecoveryLog::begin_attempt() {
  furthest.store(0, std::memory_order_relaxed);
  failed_at_ns.store(0, std::memory_order_relaxed);
  first_done_ns.store(0, std::memory_order_relaxed);
  attempt_start_ns.store(unix_time_ns(), std::memory_order_relaxed);
  const std::lock_guard lock(commits_mutex_);
  commits_.clear();
}

void RecoveryLog::note_iteration_done(int rank, std::int64_t completed) {
  std::int64_t seen = furthest.load(std::memory_order_relaxed);
  while (seen < completed && !furthest.compare_exchange_weak(seen, completed, std::memory_order_relaxed)) {
  }
  if (rank == 0 && first_done_ns.load(std::memory_order_relaxed) == 0) {
    first_done_ns.store(unix_time_ns(), std::memory_order_relaxed);
  }
}

void RecoveryLog::complete_last_recovery() {
  if (recoveries.empty() || !pending_) return;
  pending_ = false;
  Recovery& recovery = recoveries.back();
  const std::int64_t done = first_done_ns.load(std::memory_order_relaxed);
  if (done == 0) {  // the attempt after it failed before its first iteration: the next recovery covers it
    recovery.recovery_seconds = -1;
    recovery.seconds_lost = -1;
    return;
  }
  recovery.recovery_seconds = seconds_between(pending_failure_ns_, done);
  recovery.resumed_at_unix_s = static_cast<double>(done) * 1e-9;
  recovery.seconds_lost = seconds_between(pending_commit_ns_, done);
}

void RecoveryLog::add_recovery(Recovery recovery, std::int64_t failure_ns, std::int64_t commit_ns) {
  recovery.failed_at_unix_s = static_cast<double>(failure_ns) * 1e-9;
  recoveries.push_back(std::move(recovery));
  pending_ = true;
  pending_failure_ns_ = failure_ns;
  pending_commit_ns_ = commit_ns;
}

std::string metrics_kept_after_rollback(const std::string& out_dir, const Recovery& recovery,
                                        std::int64_t* last_recorded) {
  std::string kept;
  std::int64_t recorded = 0;
  std::ifstream in(std::filesystem::path(out_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object() || !record.contains("type")) continue;  // a line torn by the failure
    const std::string type = record.value("type", "");
    bool keep = type == "resume" || type == "rollback";
    if (type == "iteration") {
      const std::int64_t t = record.value("iteration", std::int64_t{-1});
      recorded = std::max(recorded, t + 1);
      keep = t >= 0 && t < recovery.rolled_back_to;
    } else if (type == "epoch") {
      keep = record.value("iterations", std::int64_t{-1}) <= recovery.rolled_back_to;
    }
    if (keep) kept += line + "\n";
  }
  if (last_recorded != nullptr) *last_recorded = recorded;
  Recovery recorded_recovery = recovery;
  if (recorded_recovery.reached == 0) recorded_recovery.reached = recorded;
  return kept + rollback_record(recorded_recovery).dump() + "\n";
}

RunSummary run_with_restarts(const TrainConfig& config, const std::function<RunSummary(const TrainConfig&)>& attempt) {
  const ReliabilityOptions& reliability = config.reliability;
  TrainConfig attempt_config = config;
  const std::string& dir = reliability.checkpoint_dir;
  RecoveryLog log;
  if (dir.empty()) log.memory_commits = std::make_unique<MemoryCommits>(checkpoint_part_names(config));
  attempt_config.recovery = &log;
  const bool in_memory = log.memory_commits != nullptr;
  for (int k = 0;; ++k) {
    attempt_config.reliability.fault = fault_of_attempt(reliability, k);
    log.begin_attempt();
    try {
      return attempt(attempt_config);
    } catch (const CommError& error) {
      const std::int64_t detected = unix_time_ns();
      log.complete_last_recovery();
      const std::int64_t commit =
          in_memory ? log.memory_commits->newest_complete().value_or(0) : newest_commit(dir, config);
      const std::string where = in_memory ? std::string("in memory: give --checkpoint-dir to keep the commits")
                                          : concat("in '", dir, "'");
      if (k >= reliability.restarts) {
        throw CommError(concat(error.what(), "; --restarts ", reliability.restarts, " used up (the newest commit, after ",
                               "iteration ", commit, ", is ", where, ")"));
      }
      const std::int64_t fired = log.failed_at_ns.load(std::memory_order_relaxed);
      Recovery recovery;
      recovery.attempt = k + 1;
      recovery.failure = error.what();
      // `furthest` starts at 0 in every attempt and moves only when an iteration completes: an
      // attempt resumed from a commit that failed before completing one had still reached that
      // commit (the newest: nothing newer was committed since).
      recovery.reached = std::max(log.furthest.load(std::memory_order_relaxed), commit);
      recovery.rolled_back_to = commit;
      recovery.detection_seconds = fired > 0 ? seconds_between(fired, detected) : -1;
      if (!config.out_dir.empty()) log.metrics_prefix = metrics_kept_after_rollback(config.out_dir, recovery);
      std::cerr << "pipesgd: restart " << k + 1 << " of " << reliability.restarts << ": " << error.what()
                << "; rolling back to " << (commit > 0 ? concat("the commit after iteration ", commit) : "the start")
                << " (" << recovery.iterations_redone() << " iterations to redo)\n"
                << std::flush;
      log.add_recovery(std::move(recovery), fired > 0 ? fired : detected, log.commit_time_ns(commit));
      attempt_config.reliability.resume = commit > 0 || reliability.resume;
    }
  }
}

std::optional<LauncherRestart> launcher_restart(const std::function<const char*(const char*)>& environment) {
  const char* attempt = environment("PIPESGD_RESTART");
  if (attempt == nullptr) return std::nullopt;
  auto number = [](const char* name, const char* text) {
    int value = 0;
    std::istringstream in(text == nullptr ? "" : text);
    if (!(in >> value) || value < 0 || !(in >> std::ws).eof()) {
      throw UsageError(concat(name, " must be a non-negative integer, got '", text == nullptr ? "" : text,
                              "' (pipesgdrun --restarts sets it)"));
    }
    return value;
  };
  LauncherRestart restart;
  restart.attempt = number("PIPESGD_RESTART", attempt);
  restart.restarts = number("PIPESGD_RESTARTS", environment("PIPESGD_RESTARTS"));
  if (const char* failures = environment("PIPESGD_RESTART_FAILURES")) restart.failures = failures;
  return restart;
}

void restart_from_launcher(TrainConfig& config, const LauncherRestart& restart, RecoveryLog& log, bool leader) {
  ReliabilityOptions& reliability = config.reliability;
  if (reliability.checkpoint_dir.empty()) {
    throw UsageError("pipesgdrun --restarts: give --checkpoint-dir DIR on a file system every host reads (the "
                     "relaunched ranks resume from its newest commit)");
  }
  if (reliability.checkpoint_every == 0) reliability.checkpoint_every = kDefaultCommitInterval;
  reliability.restarts = restart.restarts;
  reliability.fault = fault_of_attempt(reliability, restart.attempt);
  config.recovery = &log;
  log.begin_attempt();
  if (restart.attempt == 0) return;
  // The newest commit, of this world or of another (pipesgdrun --min-np relaunched another number
  // of ranks: the run continues it if its method can, else says why in one line).
  // prepare_run continues it without looking again, so the warnings about newer torn sets are this
  // search's (rank 0's).
  log.relaunch_world = find_committed_world(config, [leader](const std::string& line) {
    if (leader) std::cerr << "pipesgd: warning: " << line << "\n";
  });
  const std::optional<CommittedWorld>& world = log.relaunch_world;
  const std::int64_t commit = world ? world->set.iteration : newest_commit(reliability.checkpoint_dir, config);
  reliability.resume = reliability.resume || commit > 0;
  log.relaunch_world_found = reliability.resume;  // else no prepare_run looks
  if (!leader) return;
  // pipesgdrun's records of the failed launches, oldest first.
  std::int64_t last_failure_ns = 0;
  const nlohmann::json failures = nlohmann::json::parse(restart.failures, nullptr, /*allow_exceptions=*/false);
  for (const nlohmann::json& record : failures.is_array() ? failures : nlohmann::json::array()) {
    if (!record.is_object()) continue;
    Recovery recovery;
    recovery.attempt = record.value("attempt", 0);
    recovery.failure = concat("the job ended with mpirun's exit status ", record.value("exit_code", -1));
    recovery.rolled_back_to = -1;  // known for the latest only (below)
    last_failure_ns = static_cast<std::int64_t>(record.value("failed_at_unix_s", 0.0) * 1e9);
    log.recoveries.push_back(std::move(recovery));
  }
  if (log.recoveries.empty() || log.recoveries.back().attempt != restart.attempt) {
    Recovery unrecorded;
    unrecorded.attempt = restart.attempt;
    unrecorded.failure = "the job before this one failed (pipesgdrun left no record)";
    log.recoveries.push_back(std::move(unrecorded));
  }
  Recovery& latest = log.recoveries.back();
  latest.rolled_back_to = commit;
  if (!config.out_dir.empty()) log.metrics_prefix = metrics_kept_after_rollback(config.out_dir, latest, &latest.reached);
  // The commit's time is the shared part's write; the failure's, pipesgdrun's record of mpirun's end.
  std::int64_t commit_ns = last_failure_ns;
  if (commit > 0) {
    std::error_code error;
    const auto written = std::filesystem::last_write_time(checkpoint_path(reliability.checkpoint_dir, commit, "shared"),
                                                          error);
    if (!error) {
      commit_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::file_clock::to_sys(written).time_since_epoch())
                      .count();
    }
  }
  Recovery pending = std::move(log.recoveries.back());
  log.recoveries.pop_back();
  log.add_recovery(std::move(pending), last_failure_ns > 0 ? last_failure_ns : unix_time_ns(), commit_ns);
}

}  // namespace pipesgd
