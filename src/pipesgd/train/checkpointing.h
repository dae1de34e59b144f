#pragma once
// The trainer's checkpoints, save and load together (core/checkpoint.h has the file layer). A set
// is one file per part, all of one iteration: "rankR" per worker (its weights, the method's state,
// its place in the epoch), "shared" from rank 0 (the run's fingerprint, the epoch records) and
// "serverS" per parameter server (its shard). Every field is a named, typed section.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pipesgd/algo/training_method.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/ps/parameter_server.h"
#include "pipesgd/train/run_context.h"

namespace pipesgd {

// Writes checkpoint files on a thread of its own, so the compute thread pays only for copying the
// state (CheckpointWriter copies every section when it is added) and not for writing and syncing
// it. One write in flight per owner: the next submit waits for the last one to be on disk. A write
// failure is rethrown by the next submit() or by finish(). One thread (the owner's) calls it.
class BackgroundCheckpointWriter {
 public:
  using Files = std::vector<std::pair<std::filesystem::path, CheckpointWriter>>;
  // Writes `files` in order (each atomically), then runs `after` (e.g. pruning), in the background.
  void submit(Files files, std::function<void()> after);
  // Waits for the write in flight; rethrows its failure.
  void finish();

 private:
  std::future<void> pending_;  // its destructor waits for a write in flight (never a torn file)
};

// Commits kept in this process's memory (--restarts among threads without --checkpoint-dir,
// train/elastic.h): the sets of checkpoint parts as the workers and servers hand them over, no file,
// no checksum pass; the 2 newest complete sets are kept. A part is serialized and validated only
// when a rollback reads it. Thread-safe (every worker and server thread puts its parts).
class MemoryCommits {
 public:
  // `parts`: the part names of a complete set (RunContext::checkpoint_parts).
  explicit MemoryCommits(std::vector<std::string> parts) : parts_(std::move(parts)) {}
  void put(std::int64_t iteration, const std::string& part, CheckpointWriter contents);
  // The newest iteration whose set is complete (every part put); nullopt: none.
  std::optional<std::int64_t> newest_complete() const;
  // The part of a complete set, validated as a file would be. DataError if it was never put.
  CheckpointReader read(std::int64_t iteration, const std::string& part) const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> parts_;
  std::map<std::int64_t, std::map<std::string, CheckpointWriter>> sets_;  // by iteration
};

// A worker's place in its epoch: the sums of the iterations run so far.
struct EpochSums {
  double loss = 0;
  double correct = 0;     // training examples predicted right (before their update)
  double iterations = 0;  // the iterations they sum (of this worker; of several when its world changed)
};

// What a worker's part carries of the run so far beside its state, so that a resumed run reports
// what the run never interrupted reports.
struct WorkerHistory {
  std::uint64_t bytes_sent = 0;        // payload bytes this worker sent before the checkpoint
  std::int64_t nonfinite_skipped = 0;  // --on-nonfinite skip: its layers zeroed
  double loss_sum = 0;                 // its losses of the iterations [RunPlan::loss_from, next), in order
};

// This worker's part after iteration t: the weights, the model's record (below) and buffers, the
// method's state and the epoch sums; then add_history (taken once save_state waited for the
// communication in flight, whose bytes count). With `torchscript`, also the model as TorchScript
// (Model::torchscript) at the weights and buffers the part holds.
// Without `method_state`, the method's part is left to the caller (TrainingMethod::save_state_when_ready).
CheckpointWriter worker_checkpoint(const RunContext& run, std::int64_t t, Model& model, TrainingMethod& method,
                                   const EpochSums& sums, std::string* torchscript = nullptr,
                                   bool method_state = true);
void add_history(CheckpointWriter& part, const WorkerHistory& history);
// What add_history wrote. DataError naming the file and section if one is missing or invalid.
WorkerHistory read_history(const CheckpointReader& part);
struct RestoredWorker {
  std::int64_t next = 0;  // the iteration to go on with
  EpochSums sums;
  WorkerHistory history;
};
// Restores this worker's part of the set being resumed into `model` (weights and, if the part has
// them, buffers) and `method`. DataError naming the file for anything wrong. A set of another world
// (RunContext::resumed_world) of W workers: worker r takes the weights and method state of its
// worker r mod W (the same on every worker of the methods that may change world), and the epoch
// sums and history of its workers r, r + N, r + 2N, ... (none when the world grew), so that the
// workers together carry the committed world's.
RestoredWorker restore_worker(const RunContext& run, int rank, Model& model, TrainingMethod& method);

// What a worker's part records of its model, for `pipesgd export` (sections "model.name",
// "model.directory", "model.layers", "model.parameters", "model.buffers"). A part written before
// pipesgd recorded the model has only the parameters: name and directory are then empty, layers
// empty and has_buffers false. DataError naming the file for a malformed section.
struct CheckpointModel {
  std::string name;                 // the run's --model (a built-in name or a TorchScript file's path)
  std::string directory;            // the run's working directory (where a relative path starts)
  std::vector<std::string> layers;  // the layout's segment names, in layout order
  std::span<const float> parameters;  // the flat weights (views into the reader)
  bool has_buffers = false;
  std::span<const std::byte> buffers;
};
CheckpointModel read_checkpoint_model(const CheckpointReader& part);

// The model as TorchScript (Model::torchscript): the run's <out>/model.pt and, at each checkpoint,
// rank 0's next to the set: checkpoint-<iteration, 12 digits>-model.pt in --checkpoint-dir (pruned
// with its set).
inline constexpr const char* kModelFileName = "model.pt";
std::filesystem::path checkpoint_model_path(const std::filesystem::path& dir, std::int64_t iteration);
// Writes model.torchscript() to `path` atomically; false (nothing written) if the model has no
// TorchScript form.
bool write_model_file(const std::filesystem::path& path, Model& model);

// Rank 0's shared part after iteration t: the fingerprint, the epoch records so far and the history.
CheckpointWriter shared_checkpoint(const RunContext& run, std::int64_t t, const std::vector<EpochRecord>& epochs,
                                   const RunHistory& history);
// The shared part's history. DataError naming the file and section if one is missing or invalid.
RunHistory read_run_history(const CheckpointReader& shared);

// The newest complete valid checkpoint of this run in its --checkpoint-dir, its epoch records and
// history (prepare_run's --resume). Throws UsageError if there is none, it is another run's, or it
// was written by a version of pipesgd whose checkpoints lack the history.
void find_resume_point(RunContext& run, bool leader);

// Keeps the 2 newest complete sets and the model files of the sets kept (a set's companions,
// core/checkpoint.h).
void prune_run_checkpoints(const RunContext& run);

// What a checkpoint must match to be resumed by this run: everything that changes the math of the
// continuation.
std::string run_fingerprint(const TrainConfig& config, const RunPlan& plan);
// The same without the world: what a commit of another number of workers must match to be
// continued by this run (the method and its options, the model, the per-worker batch, the seed and
// the length asked for).
std::string run_fingerprint_of_any_world(const TrainConfig& config);

// With --resume from --checkpoint-dir: the world of the newest complete commit when this run
// continues it as another world (another number of workers, or a world that itself continued
// another; RunPlan::shift); nullopt for an ordinary resume (or none: find_resume_point says so).
// A set torn by a failure is skipped (a part of its world missing or invalid), with warn() lines as
// find_resume_point gives them (none when the result is nullopt: the ordinary resume gives them;
// none before a UsageError, which names the commit it refuses in its one line).
// UsageError with one line if the commit is another run's or this method cannot change its world.
std::optional<CommittedWorld> find_committed_world(const TrainConfig& config,
                                                  const std::function<void(const std::string&)>& warn);

// Checkpoints of a server rank: restores its shard from the set being resumed, if any, and returns
// ServeOptions::on_checkpoint writing the shard's part in the background with `writer` (which
// prunes after, so whichever writer finishes a set last prunes); empty without checkpoints.
std::function<void(const ParameterServerShard&, std::int64_t)> server_checkpoints(const RunContext& run,
                                                                                 ParameterServerShard& shard,
                                                                                 BackgroundCheckpointWriter& writer);

}  // namespace pipesgd
