// Elastic training in the C++ API (pipesgd/elastic.h): each worker's commits (its optimizer state
// and its loop's counters as one checkpoint part "rank<r>") in memory (train/checkpointing.h's
// MemoryCommits) or as files of a directory; run_elastic's attempts; run_elastic_mpi's relaunches.
#include "pipesgd/elastic.h"

#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/checkpointing.h"
#include "pipesgd/train/elastic.h"
#include "pipesgd/train/run_context.h"

namespace pipesgd {
namespace {

constexpr const char* kOptimizerSection = "optimizer";
constexpr const char* kValuePrefix = "value.";

std::vector<std::string> worker_parts(int workers) {
  std::vector<std::string> parts;
  for (int r = 0; r < workers; ++r) parts.push_back(worker_part(r));
  return parts;
}

// Where the commits of one elastic run are; shared by its workers (thread-safe).
class CommitStore {
 public:
  virtual ~CommitStore() = default;
  virtual void put(std::int64_t step, int rank, CheckpointWriter part) = 0;
  virtual std::optional<std::int64_t> newest_complete() const = 0;
  virtual CheckpointReader read(std::int64_t step, int rank) const = 0;
};

class MemoryStore final : public CommitStore {
 public:
  explicit MemoryStore(int workers) : commits_(worker_parts(workers)) {}
  void put(std::int64_t step, int rank, CheckpointWriter part) override {
    commits_.put(step, worker_part(rank), std::move(part));
  }
  std::optional<std::int64_t> newest_complete() const override { return commits_.newest_complete(); }
  CheckpointReader read(std::int64_t step, int rank) const override { return commits_.read(step, worker_part(rank)); }

 private:
  MemoryCommits commits_;
};

// checkpoint-<step>-rank<r>.psgd files; a complete step has every worker's. The writer of each part
// prunes to the 2 newest complete steps after writing (never a newer step still being written).
class FileStore final : public CommitStore {
 public:
  FileStore(std::string dir, int workers) : dir_(std::move(dir)), parts_(worker_parts(workers)) {
    ensure_writable_directory(dir_, "ElasticOptions::commit_dir");
  }
  void put(std::int64_t step, int rank, CheckpointWriter part) override {
    part.write_atomically(checkpoint_path(dir_, step, worker_part(rank)));
    prune_checkpoints(dir_, 2, parts_, {}, step);  // this run's set: no need to read it back
  }
  std::optional<std::int64_t> newest_complete() const override {
    const auto set = find_newest_valid_checkpoint(dir_, parts_, [](const std::string& line) {
      std::cerr << "pipesgd: warning: " << line << "\n";
    });
    if (!set) return std::nullopt;
    return set->iteration;
  }
  CheckpointReader read(std::int64_t step, int rank) const override {
    return CheckpointReader::read_file(checkpoint_path(dir_, step, worker_part(rank)));
  }

 private:
  std::string dir_;
  std::vector<std::string> parts_;
};

std::unique_ptr<CommitStore> make_store(const ElasticOptions& options, int workers) {
  if (options.commit_dir.empty()) return std::make_unique<MemoryStore>(workers);
  return std::make_unique<FileStore>(options.commit_dir, workers);
}

void check_options(const ElasticOptions& options) {
  if (options.restarts < 0 || options.restarts > kMaxRestarts) {
    throw UsageError(concat("ElasticOptions::restarts must be in [0, ", kMaxRestarts, "], got ", options.restarts));
  }
}

}  // namespace

struct ElasticState::Impl {
  CommitStore& store;
  int rank = 0;
  int attempt = 0;
  std::optional<std::int64_t> rollback_step;  // the commit of this attempt (decided at its start)
  std::map<std::string, std::int64_t> values;
  std::int64_t restored_step = -1;
};

ElasticState::ElasticState(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ElasticState::~ElasticState() = default;

std::int64_t& ElasticState::value(const std::string& name) { return impl_->values[name]; }

void ElasticState::step_and_commit(DistributedOptimizer& optimizer) {
  const OptimizerState saved = optimizer.step_and_save_state();
  CheckpointWriter part;
  part.add(kOptimizerSection, std::span<const std::byte>(saved.bytes));
  for (const auto& [name, value] : impl_->values) part.add_int(concat(kValuePrefix, name), value);
  impl_->store.put(optimizer.iteration(), impl_->rank, std::move(part));
}

bool ElasticState::restore(DistributedOptimizer& optimizer) {
  if (impl_->attempt == 0 || !impl_->rollback_step) return false;
  const CheckpointReader part = impl_->store.read(*impl_->rollback_step, impl_->rank);
  const std::span<const std::byte> bytes = part.bytes(kOptimizerSection);
  optimizer.load_state(OptimizerState{std::vector<std::byte>(bytes.begin(), bytes.end())});
  impl_->values.clear();
  for (const std::string& name : part.names()) {
    if (name.rfind(kValuePrefix, 0) == 0) impl_->values[name.substr(std::string(kValuePrefix).size())] = part.integer(name);
  }
  impl_->restored_step = *impl_->rollback_step;
  return true;
}

void ElasticState::sync(Worker& worker) {
  std::vector<std::int64_t> numbers;
  for (const auto& [name, value] : impl_->values) numbers.push_back(value);
  torch::Tensor tensor = torch::tensor(numbers, torch::kInt64);
  worker.broadcast(tensor, 0);
  std::size_t i = 0;
  for (auto& [name, value] : impl_->values) value = tensor[static_cast<std::int64_t>(i++)].item<std::int64_t>();
}

int ElasticState::attempt() const { return impl_->attempt; }
std::int64_t ElasticState::restored_step() const { return impl_->restored_step; }

void run_elastic(const ElasticOptions& options, const std::function<void(Worker&, ElasticState&)>& fn) {
  check_options(options);
  const std::unique_ptr<CommitStore> store = make_store(options, std::max(1, options.world.workers));
  for (int attempt = 0;; ++attempt) {
    const std::optional<std::int64_t> rollback = attempt > 0 ? store->newest_complete() : std::nullopt;
    try {
      run_threads(options.world, [&](Worker& worker) {
        ElasticState state(std::make_unique<ElasticState::Impl>(
            ElasticState::Impl{*store, worker.rank(), attempt, rollback, {}, -1}));
        fn(worker, state);
      });
      return;
    } catch (const CommError& error) {
      const std::int64_t newest = store->newest_complete().value_or(0);
      const std::string where = options.commit_dir.empty() ? std::string("in memory")
                                                           : concat("in '", options.commit_dir, "'");
      if (attempt >= options.restarts) {
        throw CommError(concat(error.what(), "; restarts ", options.restarts, " used up (the newest commit, of step ",
                               newest, ", is ", where, ")"));
      }
      std::cerr << "pipesgd: restart " << attempt + 1 << " of " << options.restarts << ": " << error.what()
                << "; rolling back to " << (newest > 0 ? concat("the commit of step ", newest) : "the start") << "\n"
                << std::flush;
    }
  }
}

int run_elastic_mpi(int* argc, char*** argv, const ElasticOptions& options,
                    const std::function<void(Worker&, ElasticState&)>& fn) {
  check_options(options);
  if (options.commit_dir.empty()) {
    throw UsageError("run_elastic_mpi needs ElasticOptions::commit_dir (on a file system every host reads): a "
                     "relaunched world resumes from the commits there");
  }
  const std::optional<LauncherRestart> launch = launcher_restart([](const char* name) { return std::getenv(name); });
  const int attempt = launch ? launch->attempt : 0;
  std::unique_ptr<CommitStore> store;
  std::optional<std::int64_t> rollback;
  return run_mpi(argc, argv, options.world, [&](Worker& worker) {
    if (!store) {  // the workers are known once MPI runs
      store = std::make_unique<FileStore>(options.commit_dir, worker.size());
      if (attempt > 0) rollback = store->newest_complete();
    }
    ElasticState state(std::make_unique<ElasticState::Impl>(
        ElasticState::Impl{*store, worker.rank(), attempt, rollback, {}, -1}));
    fn(worker, state);
  });
}

}  // namespace pipesgd
