#pragma once
// What every rank of a run knows before it starts, decided once (prepare_run) and read-only after:
// the configuration, the iteration plan (epochs, warm-up, measured range), the servers, the
// checkpoint fingerprint and parts, and the checkpoint being resumed.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/train/run_config.h"
#include "pipesgd/report/run_summary.h"

namespace pipesgd {

struct RunPlan {
  std::int64_t iterations_per_epoch = 0;
  std::int64_t total_iterations = 0;
  std::int64_t epochs = 0;
  std::int64_t warmup_iterations = 0;  // the method's warm-up in iterations
  std::int64_t first_measured = 0;     // iterations before this are excluded from the means
  // The method's deferred phase if the run ends before it (report/short_run.h).
  std::optional<DeferredPhase> unreached_phase;
  // The first iteration of the mean loss: first_measured of the run not resumed (a resumed run's
  // timing means start later; its mean loss must not).
  std::int64_t loss_from = 0;
};

// What the shared part of a checkpoint carries of the run so far, beside the epoch records.
struct RunHistory {
  std::int64_t consistency_checks = 0;  // passed
  double train_seconds = 0;             // training wall time up to the checkpoint
};

class MemoryCommits;  // train/checkpointing.h

struct RunContext {
  const TrainConfig& config;
  RunPlan plan{};
  int servers = 0;                           // server ranks after the workers
  std::string fingerprint{};                 // what a checkpoint of this run must match
  std::vector<std::string> checkpoint_parts{};  // "shared", "rank0", ..., "server0", ...
  // --resume: the checkpoint set the ranks continue from and its epoch records.
  std::optional<CheckpointSet> resume_from{};
  std::vector<EpochRecord> resumed_epochs{};
  RunHistory resumed_history{};

  // --restarts among threads without --checkpoint-dir: the commits are here, not in files
  // (train/checkpointing.h); nullptr otherwise.
  MemoryCommits* memory_commits = nullptr;

  std::int64_t start_iteration() const { return resume_from ? resume_from->iteration : 0; }
};

// The part `part` of the set being resumed (from memory or its file). DataError naming it.
CheckpointReader read_resumed_part(const RunContext& run, const std::string& part);

// Validates `config`, plans the run over `train`, creates the output and checkpoint directories
// (so that an unwritable one fails before training) and, with --resume, finds the checkpoint to
// continue from (warnings about skipped ones on stderr when `leader`). Throws UsageError /
// DataError with one line. Every rank of an MPI run calls it (they read the same directory).
RunContext prepare_run(const TrainConfig& config, const Dataset& train, bool leader);

// The run's learning-rate schedule (config.method.common.lr_schedule) bound to the plan's length.
LrSchedule run_learning_rate_schedule(const RunContext& run);
// The plan's length as a schedule needs it.
inline LrScheduleLength schedule_length(const RunPlan& plan) {
  return {plan.iterations_per_epoch, plan.total_iterations};
}

// Part names of a checkpoint set.
std::string worker_part(int rank);
// Every part of a complete set of `config`'s run: "shared", "rank0", ..., "server0", ...
std::vector<std::string> checkpoint_part_names(const TrainConfig& config);
std::string server_part(int shard);

}  // namespace pipesgd
