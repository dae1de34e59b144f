#include "pipesgd/train/checkpointing.h"

#include <algorithm>
#include <optional>
#include <iostream>
#include <system_error>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// Rank 0's model beside each set: checkpoint-<iteration>-model.pt, a companion of the set.
constexpr const char* kModelCompanion = "model.pt";

// The epoch records, one section per field (each a vector over the epochs).
struct EpochField {
  const char* name;
  double EpochRecord::*value;
};
constexpr EpochField kEpochFields[] = {
    {"train_loss", &EpochRecord::train_loss},       {"train_accuracy", &EpochRecord::train_accuracy},
    {"test_accuracy", &EpochRecord::test_accuracy}, {"test_loss", &EpochRecord::test_loss},
    {"elapsed_seconds", &EpochRecord::elapsed_seconds},
};

void save_epochs(CheckpointWriter& out, const std::vector<EpochRecord>& epochs) {
  std::vector<double> numbers, iterations;
  for (const EpochRecord& record : epochs) {
    numbers.push_back(static_cast<double>(record.epoch));
    iterations.push_back(static_cast<double>(record.iterations));
  }
  out.add_doubles("epochs.epoch", numbers);
  out.add_doubles("epochs.iterations", iterations);
  for (const EpochField& field : kEpochFields) {
    std::vector<double> values;
    for (const EpochRecord& record : epochs) values.push_back(record.*field.value);
    out.add_doubles(concat("epochs.", field.name), values);
  }
}

std::vector<EpochRecord> load_epochs(const CheckpointReader& in) {
  const std::vector<double> numbers = in.doubles("epochs.epoch");
  const std::vector<double> iterations = in.doubles("epochs.iterations", numbers.size());
  std::vector<EpochRecord> epochs(numbers.size());
  for (std::size_t e = 0; e < epochs.size(); ++e) {
    epochs[e].epoch = static_cast<std::int64_t>(numbers[e]);
    epochs[e].iterations = static_cast<std::int64_t>(iterations[e]);
  }
  for (const EpochField& field : kEpochFields) {
    const std::vector<double> values = in.doubles(concat("epochs.", field.name), epochs.size());
    for (std::size_t e = 0; e < epochs.size(); ++e) epochs[e].*field.value = values[e];
  }
  return epochs;
}

// An int64 section that must not be negative (a count).
std::int64_t non_negative(const CheckpointReader& in, std::string_view name) {
  const std::int64_t value = in.integer(name);
  if (value < 0) throw DataError(concat("checkpoint '", in.origin(), "': section '", name, "' is negative (", value, ")"));
  return value;
}

}  // namespace

void MemoryCommits::put(std::int64_t iteration, const std::string& part, CheckpointWriter contents) {
  const std::lock_guard lock(mutex_);
  sets_[iteration].insert_or_assign(part, std::move(contents));
  // Keep the 2 newest complete sets and anything newer (sets still being handed over).
  int complete_seen = 0;
  for (auto set = sets_.rbegin(); set != sets_.rend(); ++set) {
    if (set->second.size() < parts_.size()) continue;
    if (++complete_seen == 2) {
      sets_.erase(sets_.begin(), sets_.find(set->first));
      break;
    }
  }
}

std::optional<std::int64_t> MemoryCommits::newest_complete() const {
  const std::lock_guard lock(mutex_);
  for (auto set = sets_.rbegin(); set != sets_.rend(); ++set) {
    if (set->second.size() == parts_.size()) return set->first;
  }
  return std::nullopt;
}

CheckpointReader MemoryCommits::read(std::int64_t iteration, const std::string& part) const {
  const std::lock_guard lock(mutex_);
  const auto set = sets_.find(iteration);
  const std::string origin = concat("<memory>/", checkpoint_path("", iteration, part).string());
  if (set == sets_.end() || set->second.count(part) == 0) throw DataError(concat("commit '", origin, "' is missing"));
  return CheckpointReader::parse(set->second.at(part).serialize(), origin);
}

CheckpointReader read_resumed_part(const RunContext& run, const std::string& part) {
  PIPESGD_ASSERT(run.resume_from.has_value());
  if (run.memory_commits != nullptr) return run.memory_commits->read(run.resume_from->iteration, part);
  return CheckpointReader::read_file(run.resume_from->parts.at(part));
}

void BackgroundCheckpointWriter::submit(Files files, std::function<void()> after) {
  finish();
  pending_ = std::async(std::launch::async, [files = std::move(files), after = std::move(after)] {
    for (const auto& [path, file] : files) file.write_atomically(path);
    if (after) after();
  });
}

void BackgroundCheckpointWriter::finish() {
  if (pending_.valid()) pending_.get();
}

std::string run_fingerprint(const TrainConfig& config, const RunPlan& plan) {
  const MethodSelection& method = config.method;
  const std::string options = method.options->fingerprint();
  return concat("method ", method.spec, " (", fingerprint(method.common), options.empty() ? "" : ", ", options,
                ", warm-up ", plan.warmup_iterations, "), model ", config.model, ", ", config.workers,
                " workers, batch ", config.batch, ", seed ", config.seed, ", ", plan.total_iterations, " iterations");
}

std::string run_fingerprint_of_any_world(const TrainConfig& config) {
  const MethodSelection& method = config.method;
  const std::string options = method.options->fingerprint();
  return concat("method ", method.spec, " (", fingerprint(method.common), options.empty() ? "" : ", ", options,
                "), model ", config.model, ", batch ", config.batch, ", seed ", config.seed, ", ",
                config.iterations > 0 ? concat(config.iterations, " iterations") : concat(config.epochs, " epochs"));
}

namespace {

// What the shared part of the set says of its world; nullopt for a part written before pipesgd
// recorded it.
std::optional<CommittedWorld> world_of(const CheckpointSet& set, const CheckpointReader& shared) {
  if (!shared.has("world.workers")) return std::nullopt;
  CommittedWorld world{set, static_cast<int>(shared.integer("world.workers")),
                       static_cast<int>(shared.integer("world.base_workers")), shared.integer("world.shift"),
                       std::string(shared.string("world.run"))};
  if (world.workers < 1 || world.base_workers < 1 || world.shift > set.iteration) {
    throw DataError(concat("checkpoint '", shared.origin(), "': its world (", world.workers, " workers, started with ",
                           world.base_workers, ", shift ", world.shift, ") is not one a run can have"));
  }
  return world;
}

}  // namespace

std::optional<CommittedWorld> find_committed_world(const TrainConfig& config,
                                                  const std::function<void(const std::string&)>& warn) {
  const std::string& dir = config.reliability.checkpoint_dir;
  auto quiet = [](const std::string&) {};
  // Newest first, each set judged by the parts of the world its shared part names: one torn by a
  // failure (a worker's part missing or corrupt) is skipped with the warnings an ordinary resume
  // gives, which are held back (and not given) if it is this run's own world after all.
  std::vector<std::string> warnings;
  auto hold = [&](const std::string& line) { warnings.push_back(line); };
  std::optional<CommittedWorld> world;
  for (std::optional<std::int64_t> older_than;;) {
    const auto listed = find_newest_valid_checkpoint(dir, {"shared"}, quiet, older_than);
    if (!listed) return std::nullopt;
    world = world_of(*listed, CheckpointReader::read_file(listed->parts.at("shared")));
    if (!world) return std::nullopt;  // an older pipesgd's: find_resume_point says what it is
    TrainConfig world_config = config;
    world_config.workers = world->workers;
    if (const auto set = find_valid_checkpoint(dir, listed->iteration, checkpoint_part_names(world_config), hold)) {
      world->set = *set;
      break;
    }
    older_than = listed->iteration;
  }
  if (world->workers == config.workers && world->base_workers == config.workers && world->shift == 0) {
    return std::nullopt;  // this run's own world: an ordinary resume
  }
  const std::string this_run = run_fingerprint_of_any_world(config);
  if (world->run != this_run) {
    throw UsageError(concat("--resume: the checkpoint in '", dir, "' is of another run (", world->run, "; this run: ",
                            this_run, ")"));
  }
  const MethodTraits& traits = config.method.traits();
  if (world->workers != config.workers && !continues_another_world(traits)) {
    throw UsageError(concat("the newest commit in '", dir, "' (after iteration ", world->set.iteration, ") is of ",
                            world->workers, " workers and this run has ", config.workers, ": ", config.method.name(),
                            " continues only the world that committed (", traits.uses_servers
                                ? "its servers' shards are of that world"
                                : "each worker trains weights of its own",
                            "): relaunch it with ", world->workers, " workers; ", methods_where(continues_another_world),
                            " continue with another number"));
  }
  for (const std::string& line : warnings) warn(line);  // after the refusals: an error stays one line
  return world;
}

CheckpointWriter worker_checkpoint(const RunContext& run, std::int64_t t, Model& model, TrainingMethod& method,
                                   const EpochSums& sums, std::string* torchscript, bool method_state) {
  CheckpointWriter part;
  part.add_int("next_iteration", t + 1);
  part.add("model.parameters", std::span<const float>(model.parameters()));
  part.add_string("model.name", run.config.model);
  std::error_code no_directory;
  part.add_string("model.directory", std::filesystem::current_path(no_directory).string());
  std::string layers;
  for (const Segment& segment : model.layout().segments()) layers += concat(layers.empty() ? "" : "\n", segment.name);
  part.add_string("model.layers", std::move(layers));
  part.add("model.buffers", std::span<const std::byte>(model.buffers()));
  if (torchscript != nullptr) *torchscript = model.torchscript();
  part.add_double("epoch.loss_sum", sums.loss);
  part.add_double("epoch.correct", sums.correct);
  part.add_double("epoch.iterations", sums.iterations);
  if (method_state) method.save_state(part);
  return part;
}

void add_history(CheckpointWriter& part, const WorkerHistory& history) {
  part.add_int("history.bytes_sent", static_cast<std::int64_t>(history.bytes_sent));
  part.add_int("history.nonfinite_skipped", history.nonfinite_skipped);
  part.add_double("history.loss_sum", history.loss_sum);
}

RestoredWorker restore_worker(const RunContext& run, int rank, Model& model, TrainingMethod& method) {
  const int workers = run.config.workers;
  const int committed_workers = run.resumed_world ? run.resumed_world->workers : workers;
  const CheckpointReader part = read_resumed_part(run, worker_part(rank % committed_workers));
  const std::int64_t next = part.integer("next_iteration");
  if (next != run.resume_from->iteration) {
    throw DataError(concat("checkpoint '", part.origin(), "': holds iteration ", next, ", its name says ",
                           run.resume_from->iteration));
  }
  const std::span<const float> weights = part.floats("model.parameters");
  if (weights.size() != model.parameters().size()) {
    throw DataError(concat("checkpoint '", part.origin(), "': ", weights.size(), " weights for a model of ",
                           model.parameters().size()));
  }
  std::copy(weights.begin(), weights.end(), model.parameters().begin());
  if (part.has("model.buffers")) {
    const std::span<const std::byte> buffers = part.bytes("model.buffers");
    const std::size_t expected = model.buffers().size();
    if (buffers.size() != expected) {
      throw DataError(concat("checkpoint '", part.origin(), "': ", buffers.size(), " bytes of model buffers for a model of ",
                             expected));
    }
    model.load_buffers(buffers);
  }
  method.load_state(part, next);
  // A part written before pipesgd counted the epoch's iterations: this worker ran every one so far
  // (the same world; after an epoch's last iteration, that epoch's end is still to come).
  auto sums_of = [&](const CheckpointReader& worker) {
    EpochSums sums{worker.real("epoch.loss_sum"), worker.real("epoch.correct")};
    if (worker.has("epoch.iterations")) {
      sums.iterations = worker.real("epoch.iterations");
    } else {
      const RunPlan& plan = run.plan;
      const std::int64_t position = next - plan.shift;
      const std::int64_t into = position % plan.iterations_per_epoch;
      sums.iterations = static_cast<double>(into == 0 && position > 0 ? plan.iterations_per_epoch : into);
    }
    return sums;
  };
  RestoredWorker restored{next, sums_of(part), read_history(part)};
  if (committed_workers != workers) {
    restored.sums = EpochSums{};
    restored.history = WorkerHistory{};
    for (int r = rank; r < committed_workers; r += workers) {
      const CheckpointReader other = read_resumed_part(run, worker_part(r));
      const EpochSums sums = sums_of(other);
      const WorkerHistory history = read_history(other);
      restored.sums.loss += sums.loss;
      restored.sums.correct += sums.correct;
      restored.sums.iterations += sums.iterations;
      restored.history.bytes_sent += history.bytes_sent;
      restored.history.nonfinite_skipped += history.nonfinite_skipped;
      restored.history.loss_sum += history.loss_sum;
    }
  }
  return restored;
}

WorkerHistory read_history(const CheckpointReader& part) {
  WorkerHistory history;
  history.bytes_sent = static_cast<std::uint64_t>(non_negative(part, "history.bytes_sent"));
  history.nonfinite_skipped = non_negative(part, "history.nonfinite_skipped");
  history.loss_sum = part.real("history.loss_sum");
  return history;
}

CheckpointWriter shared_checkpoint(const RunContext& run, std::int64_t t, const std::vector<EpochRecord>& epochs,
                                   const RunHistory& history) {
  CheckpointWriter common;
  common.add_string("run", run.fingerprint);
  common.add_int("next_iteration", t + 1);
  save_epochs(common, epochs);
  common.add_int("history.consistency_checks", history.consistency_checks);
  common.add_int("world.workers", run.config.workers);
  common.add_int("world.base_workers", run.plan.base_workers);
  common.add_int("world.shift", run.plan.shift);
  common.add_string("world.run", run_fingerprint_of_any_world(run.config));
  common.add_double("history.train_seconds", history.train_seconds);
  return common;
}

RunHistory read_run_history(const CheckpointReader& shared) {
  return RunHistory{non_negative(shared, "history.consistency_checks"), shared.real("history.train_seconds")};
}

void find_resume_point(RunContext& run, bool leader) {
  if (run.memory_commits != nullptr) {  // a rollback among threads: the commits are this run's
    const std::optional<std::int64_t> newest = run.memory_commits->newest_complete();
    if (!newest) throw UsageError("--restarts: no complete commit in memory to roll back to");
    run.resume_from = CheckpointSet{*newest, {}};
    const CheckpointReader shared_part = read_resumed_part(run, "shared");
    run.resumed_epochs = load_epochs(shared_part);
    run.resumed_history = read_run_history(shared_part);
    return;
  }
  const std::string& dir = run.config.reliability.checkpoint_dir;
  auto warn = [&](const std::string& line) {
    if (leader) std::cerr << "pipesgd: warning: " << line << "\n";
  };
  auto check_fingerprint = [&](const CheckpointReader& shared_part) {
    const std::string written_by(shared_part.string("run"));
    if (written_by != run.fingerprint) {
      throw UsageError(concat("--resume: the checkpoint in '", dir, "' is of another run (", written_by,
                              "; this run: ", run.fingerprint, ")"));
    }
  };
  if (run.resumed_world) {  // another world's commit, or one continuing another (find_committed_world)
    run.resume_from = run.resumed_world->set;
    const CheckpointReader shared_part = CheckpointReader::read_file(run.resume_from->parts.at("shared"));
    if (run.resumed_world->workers == run.config.workers) check_fingerprint(shared_part);
    run.resumed_epochs = load_epochs(shared_part);
    run.resumed_history = read_run_history(shared_part);
    return;
  }
  run.resume_from = find_newest_valid_checkpoint(dir, run.checkpoint_parts, warn);
  if (!run.resume_from) {
    // Say so if the directory holds another run's checkpoints (e.g. of another worker count).
    const auto any = find_newest_valid_checkpoint(dir, {"shared"}, [](const std::string&) {});
    if (any) check_fingerprint(CheckpointReader::read_file(any->parts.at("shared")));
    throw UsageError(concat("--resume: no complete, valid checkpoint in '", dir, "'"));
  }
  const CheckpointReader shared_part = CheckpointReader::read_file(run.resume_from->parts.at("shared"));
  check_fingerprint(shared_part);
  if (!shared_part.has("history.consistency_checks")) {
    throw UsageError(concat("--resume: the checkpoint in '", dir, "' was written by an older pipesgd, without the ",
                            "run's history that summary.json reports; it cannot be resumed (run again from the start)"));
  }
  run.resumed_epochs = load_epochs(shared_part);
  run.resumed_history = read_run_history(shared_part);
}

CheckpointModel read_checkpoint_model(const CheckpointReader& part) {
  CheckpointModel model;
  model.parameters = part.floats("model.parameters");
  if (part.has("model.name")) model.name = std::string(part.string("model.name"));
  if (part.has("model.directory")) model.directory = std::string(part.string("model.directory"));
  if (part.has("model.layers")) {
    const std::string_view text = part.string("model.layers");
    for (std::size_t start = 0; start <= text.size();) {
      const std::size_t end = std::min(text.find('\n', start), text.size());
      model.layers.emplace_back(text.substr(start, end - start));
      start = end + 1;
    }
  }
  model.has_buffers = part.has("model.buffers");
  if (model.has_buffers) model.buffers = part.bytes("model.buffers");
  return model;
}

std::filesystem::path checkpoint_model_path(const std::filesystem::path& dir, std::int64_t iteration) {
  return checkpoint_companion_path(dir, iteration, kModelCompanion);
}

bool write_model_file(const std::filesystem::path& path, Model& model) {
  const std::string bytes = model.torchscript();
  if (bytes.empty()) return false;
  write_file_atomically(path, std::string_view(bytes), "model");
  return true;
}

void prune_run_checkpoints(const RunContext& run) {
  if (run.memory_commits != nullptr) return;  // the store keeps its own 2 newest
  prune_checkpoints(run.config.reliability.checkpoint_dir, 2, run.checkpoint_parts, {kModelCompanion});
}

std::function<void(const ParameterServerShard&, std::int64_t)> server_checkpoints(const RunContext& run,
                                                                                 ParameterServerShard& shard,
                                                                                 BackgroundCheckpointWriter& writer) {
  if (run.resume_from) shard.load_state(read_resumed_part(run, server_part(shard.shard_index())));
  if (run.config.reliability.checkpoint_every == 0) return {};
  if (MemoryCommits* commits = run.memory_commits) {
    return [commits](const ParameterServerShard& served, std::int64_t iteration) {
      CheckpointWriter part;
      part.add_int("next_iteration", iteration);
      served.save_state(part);
      commits->put(iteration, server_part(served.shard_index()), std::move(part));
    };
  }
  return [&run, &writer](const ParameterServerShard& served, std::int64_t iteration) {
    CheckpointWriter part;
    part.add_int("next_iteration", iteration);
    served.save_state(part);
    BackgroundCheckpointWriter::Files files;
    files.emplace_back(checkpoint_path(run.config.reliability.checkpoint_dir, iteration, server_part(served.shard_index())),
                       std::move(part));
    writer.submit(std::move(files), [&run] { prune_run_checkpoints(run); });
  };
}

}  // namespace pipesgd
