#pragma once
// What every rank of a run knows before it starts, decided once (prepare_run) and read-only after:
// the configuration, the iteration plan (epochs, warm-up, measured range), the servers, the
// checkpoint fingerprint and parts, and the checkpoint being resumed.
#include <algorithm>
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
  // A run that continues the commit of another world size (train/elastic.h, "another world"):
  // iteration t is position t - shift of this world's epochs (each iterations_per_epoch long, epoch
  // e from shift + e * iterations_per_epoch), and its learning rates are world_scale times the
  // configured ones (the workers now over base_workers, the workers that started the run).
  std::int64_t shift = 0;
  int base_workers = 0;
  double world_scale = 1.0;

  // The epoch iteration t belongs to, and the first iteration of epoch e.
  std::int64_t epoch_of(std::int64_t t) const { return std::max<std::int64_t>(0, t - shift) / iterations_per_epoch; }
  std::int64_t epoch_start(std::int64_t e) const { return shift + e * iterations_per_epoch; }
};

// The world whose commit a resumed run continues (the newest complete set in --checkpoint-dir),
// when it is not simply this run's own: another worker count, or a world that itself continued
// another. Read from the shared part's "world.*" sections.
struct CommittedWorld {
  CheckpointSet set;
  int workers = 0;            // of the world that committed
  int base_workers = 0;       // of the world that started the run
  std::int64_t shift = 0;     // that world's RunPlan::shift
  std::string run;            // run_fingerprint_of_any_world of the run that committed
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
  // Set when resume_from is the commit of another world (or one continuing another): its world.
  std::optional<CommittedWorld> resumed_world{};
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
  LrScheduleLength length;
  length.iterations_per_epoch = plan.iterations_per_epoch;
  length.total_iterations = plan.total_iterations - plan.shift;
  length.first_iteration = plan.shift;
  length.world_scale = plan.world_scale;
  return length;
}

// Part names of a checkpoint set.
std::string worker_part(int rank);
// Every part of a complete set of `config`'s run: "shared", "rank0", ..., "server0", ...
std::vector<std::string> checkpoint_part_names(const TrainConfig& config);
std::string server_part(int shard);

}  // namespace pipesgd
