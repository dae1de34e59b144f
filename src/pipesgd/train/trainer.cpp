#include "pipesgd/train/trainer.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <iomanip>
#include <memory>
#include <optional>
#include <thread>

#include "pipesgd/algo/bucketed_dsync.h"
#include "pipesgd/algo/od_sgd.h"
#include "pipesgd/algo/ps_methods.h"
#include "pipesgd/algo/sapipe.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/comm/rank_subset_transport.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/checksum.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/thread_priority.h"
#include "pipesgd/data/sampler.h"
#include "pipesgd/ps/parameter_server.h"
#include "pipesgd/train/planning.h"
#include "pipesgd/train/progress.h"
#include "pipesgd/train/report.h"

namespace pipesgd {
namespace {

// The trainer's own messages (epoch-end loss reduction and barrier, result gathering) use the
// control channel: epoch e uses sequences 2e and 2e + 1, the final gathering 2 * epochs.
Tag control_tag(std::int64_t sequence) {
  return collective_tag(Channel::kControl, static_cast<std::uint64_t>(sequence));
}

struct RunPlan {
  std::int64_t iterations_per_epoch = 0;
  std::int64_t total_iterations = 0;
  std::int64_t epochs = 0;
  std::int64_t warmup_iterations = 0;
  std::int64_t first_measured = 0;  // iterations before this are excluded from the means
};

RunPlan plan_run(const TrainConfig& config, const Dataset& train) {
  const std::size_t global_batch = static_cast<std::size_t>(config.workers) * config.batch;
  if (train.size < global_batch) {
    throw UsageError(concat("the training set has ", train.size, " examples, fewer than one global batch (",
                            config.workers, " workers x batch ", config.batch, ")"));
  }
  RunPlan plan;
  plan.iterations_per_epoch = static_cast<std::int64_t>(train.size / global_batch);
  plan.total_iterations =
      config.iterations > 0 ? config.iterations : config.epochs * plan.iterations_per_epoch;
  if (plan.total_iterations > kMaxIterations) {
    throw UsageError(concat("--epochs ", config.epochs, " x ", plan.iterations_per_epoch,
                            " iterations per epoch exceeds the ", kMaxIterations,
                            " iterations a run may have"));
  }
  plan.epochs = (plan.total_iterations + plan.iterations_per_epoch - 1) / plan.iterations_per_epoch;
  plan.warmup_iterations =
      config.warmup_epochs * plan.iterations_per_epoch + config.warmup_iterations;
  const std::int64_t steady = std::max<std::int64_t>(0, plan.total_iterations - plan.warmup_iterations);
  const std::int64_t start_up = std::min<std::int64_t>(10, steady / 10);
  plan.first_measured = std::min(plan.total_iterations - 1,
                                 std::min(plan.warmup_iterations, plan.total_iterations) + start_up);
  if (layer_wise(config.method)) {
    // The profiled iterations run the single-bucket plan: not the plan being measured.
    const std::int64_t planned = kProfileWarmupIterations + config.method.profile_iterations;
    const std::int64_t after_plan = std::max<std::int64_t>(0, plan.total_iterations - planned);
    const std::int64_t measured_from = planned + std::min<std::int64_t>(10, after_plan / 10);
    plan.first_measured =
        std::max(plan.first_measured, std::min(plan.total_iterations - 1, measured_from));
  }
  if (config.method.name == "sapipe") {
    // Iterations before the pipeline starts (warm-up, profiling) are synchronous.
    MethodConfig method = config.method;
    method.warmup_iterations = plan.warmup_iterations;
    const std::int64_t start = sapipe_pipeline_start(method);
    const std::int64_t after = std::max<std::int64_t>(0, plan.total_iterations - start);
    plan.first_measured = std::max(plan.first_measured,
                                   std::min(plan.total_iterations - 1, start + std::min<std::int64_t>(10, after / 10)));
  }
  plan.first_measured = std::max<std::int64_t>(0, plan.first_measured);
  if (config.fault.active() && config.fault.iteration >= plan.total_iterations) {
    throw UsageError(concat("--inject-fault: iteration ", config.fault.iteration, " is past the run's last (",
                            plan.total_iterations - 1, ")"));
  }
  return plan;
}

Evaluation evaluate(Model& model, const Dataset& test) {
  Evaluation total;
  for_each_chunk(test, 0, test.size, 1000, [&](const Batch& batch) {
    Evaluation part = model.evaluate(batch);
    total.loss_sum += part.loss_sum;
    total.correct += part.correct;
    total.count += part.count;
  });
  return total;
}

// What the workers share with the caller; each rank writes only its own entries.
struct SharedRunState {
  std::vector<std::vector<IterationTimes>> times;  // [rank][iteration]
  std::vector<std::uint64_t> bytes_sent;           // per rank
  std::vector<EpochRecord> epochs;                 // written by rank 0
  std::vector<std::exception_ptr> failures;        // per rank (workers, then servers)
  std::vector<std::vector<float>> final_parameters;
  double train_seconds = 0;                        // rank 0
  MethodReport method_report;                      // rank 0's
  std::vector<std::int64_t> nonfinite_skipped;     // per rank: layers zeroed by --on-nonfinite skip
  std::vector<std::int64_t> current_iteration;     // per rank: the iteration its compute thread is in
  std::int64_t consistency_checks = 0;             // rank 0: --check-consistency checks passed
  // Fault injection: set once any worker failed (threads only; nullptr when each rank is a
  // process), and whether a crash ends a thread or the process.
  const std::atomic<bool>* any_worker_failed = nullptr;
  bool rank_is_process = false;
  // --resume: the checkpoint set the workers continue from (read by each worker for its part).
  std::optional<CheckpointSet> resume_from;
};

std::string rank_part(int rank) { return concat("rank", rank); }

std::string server_part(int shard) { return concat("server", shard); }

// What a checkpoint must match to be resumed by this run.
// Everything that changes the math of the continuation is in it.
std::string run_fingerprint(const TrainConfig& config, const RunPlan& plan) {
  const MethodConfig& m = config.method;
  const int servers = resolved_servers(config);
  const std::string parameter_server =
      servers == 0 ? std::string()
                   : concat(", ", servers, " servers, local updater ", m.local_updater, " lr ", m.local_learning_rate,
                            ", dc lambda ", m.delay_compensation.lambda, " variant ",
                            variant_name(m.delay_compensation.variant), " momentum ",
                            m.delay_compensation.mean_square_decay);
  return concat("method ", config.method_spec, " (codec ", m.codec, ", K ", m.staleness, ", warm-up ",
                plan.warmup_iterations, ", optimizer ", m.optimizer, " lr ", m.sgd.learning_rate, " momentum ",
                m.sgd.momentum, " decay ", m.sgd.weight_decay, parameter_server, "), model ", config.model, ", ",
                config.workers, " workers, batch ", config.batch, ", seed ", config.seed, ", ",
                plan.total_iterations, " iterations");
}

// The parts a complete checkpoint of this run has.
std::vector<std::string> checkpoint_parts(const TrainConfig& config) {
  std::vector<std::string> parts{"shared"};
  for (int r = 0; r < config.workers; ++r) parts.push_back(rank_part(r));
  for (int s = 0; s < resolved_servers(config); ++s) parts.push_back(server_part(s));
  return parts;
}

// --resume: the newest complete valid checkpoint of this run in config.checkpoint_dir, its shared
// part read into `shared` (epoch records). Throws UsageError if there is none or it is another run's.
void find_resume_point(const TrainConfig& config, const RunPlan& plan, SharedRunState& shared, bool leader) {
  auto warn = [&](const std::string& line) {
    if (leader) std::cerr << "pipesgd: warning: " << line << "\n";
  };
  auto check_fingerprint = [&](const CheckpointReader& shared_part) {
    const std::string written_by(shared_part.string("run"));
    if (written_by != run_fingerprint(config, plan)) {
      throw UsageError(concat("--resume: the checkpoint in '", config.checkpoint_dir, "' is of another run (",
                              written_by, "; this run: ", run_fingerprint(config, plan), ")"));
    }
  };
  shared.resume_from = find_newest_valid_checkpoint(config.checkpoint_dir, checkpoint_parts(config), warn);
  if (!shared.resume_from) {
    // Say so if the directory holds another run's checkpoints (e.g. of another worker count).
    const auto any = find_newest_valid_checkpoint(config.checkpoint_dir, {"shared"}, [](const std::string&) {});
    if (any) check_fingerprint(CheckpointReader::read_file(any->parts.at("shared")));
    throw UsageError(concat("--resume: no complete, valid checkpoint in '", config.checkpoint_dir, "'"));
  }
  const CheckpointReader shared_part = CheckpointReader::read_file(shared.resume_from->parts.at("shared"));
  check_fingerprint(shared_part);
  const std::span<const std::byte> bytes = shared_part.bytes("epochs");
  constexpr std::size_t kFields = 7;
  if (bytes.size() % (kFields * sizeof(double)) != 0) {
    throw DataError(concat("checkpoint '", shared_part.origin(), "': epoch records of ", bytes.size(), " bytes"));
  }
  std::vector<double> epochs(bytes.size() / sizeof(double));
  std::memcpy(epochs.data(), bytes.data(), bytes.size());
  for (std::size_t k = 0; k + kFields <= epochs.size(); k += kFields) {
    EpochRecord record;
    record.epoch = static_cast<std::int64_t>(epochs[k]);
    record.iterations = static_cast<std::int64_t>(epochs[k + 1]);
    record.train_loss = epochs[k + 2];
    record.train_accuracy = epochs[k + 3];
    record.test_accuracy = epochs[k + 4];
    record.test_loss = epochs[k + 5];
    record.elapsed_seconds = epochs[k + 6];
    shared.epochs.push_back(record);
  }
}

// A resumed run measures its means from 10 iterations after where it resumed.
void resume_plan(RunPlan& plan, std::int64_t start) {
  plan.first_measured = std::max(plan.first_measured,
                                 std::min(plan.total_iterations - 1, start + std::min<std::int64_t>(10, (plan.total_iterations - start) / 10)));
}

[[noreturn]] void inject_fault(const FaultInjection& fault, const SharedRunState& shared, Timeout timeout);

// Writes checkpoint files on a thread of its own, so the compute thread pays only for copying the
// state (CheckpointWriter copies every section when it is added) and not for writing and syncing
// it. One write in flight per worker: the next submit waits for the last one to be on disk. A write
// failure is rethrown by the next submit() or by finish(). Compute thread only.
class BackgroundCheckpointWriter {
 public:
  using Files = std::vector<std::pair<std::filesystem::path, CheckpointWriter>>;
  // Writes `files` in order (each atomically), then runs `after` (e.g. pruning), in the background.
  void submit(Files files, std::function<void()> after) {
    finish();
    pending_ = std::async(std::launch::async, [files = std::move(files), after = std::move(after)] {
      for (const auto& [path, file] : files) file.write_atomically(path);
      if (after) after();
    });
  }
  // Waits for the write in flight; rethrows its failure.
  void finish() {
    if (pending_.valid()) pending_.get();
  }

 private:
  std::future<void> pending_;  // its destructor waits for a write in flight (never a torn file)
};

// Writes this worker's part of the checkpoint after iteration t (and rank 0 the shared part); the
// files are written by `writer` in the background.
void write_checkpoint(const TrainConfig& config, const RunPlan& plan, int rank, std::int64_t t, Model& model,
                      TrainingMethod& method, double epoch_loss_sum, double epoch_correct, SharedRunState& shared,
                      BackgroundCheckpointWriter& writer) {
  CheckpointWriter part;
  part.add_int("next_iteration", t + 1);
  part.add("model.parameters", std::span<const float>(model.parameters()));
  const double sums[2] = {epoch_loss_sum, epoch_correct};
  part.add("epoch_sums", std::as_bytes(std::span<const double>(sums)));
  method.save_state(part);
  const std::filesystem::path path = checkpoint_path(config.checkpoint_dir, t + 1, rank_part(rank));
  if (config.fault.active() && config.fault.during_checkpoint() && config.fault.rank == rank &&
      config.fault.iteration == t) {
    // --inject-fault at=checkpoint: die halfway through the write. The atomic write would leave
    // exactly this: a partial temporary file, never a torn file under the final name.
    const std::vector<std::byte> bytes = part.serialize();
    std::ofstream torn(path.parent_path() / concat(".", path.filename().string(), ".tmp.injected"), std::ios::binary);
    torn.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() / 2));
    torn.close();
    inject_fault(config.fault, shared, config.method.allreduce.timeout);
  }
  BackgroundCheckpointWriter::Files files;
  files.emplace_back(path, std::move(part));
  if (rank != 0) {
    writer.submit(std::move(files), {});
    return;
  }
  CheckpointWriter common;
  common.add_string("run", run_fingerprint(config, plan));
  common.add_int("next_iteration", t + 1);
  std::vector<double> epochs;
  for (const EpochRecord& e : shared.epochs) {
    for (double value : {double(e.epoch), double(e.iterations), e.train_loss, e.train_accuracy, e.test_accuracy,
                         e.test_loss, e.elapsed_seconds}) {
      epochs.push_back(value);
    }
  }
  common.add("epochs", std::as_bytes(std::span<const double>(epochs)));
  files.emplace_back(checkpoint_path(config.checkpoint_dir, t + 1, "shared"), std::move(common));
  writer.submit(std::move(files), [dir = config.checkpoint_dir, parts = checkpoint_parts(config)] {
    prune_checkpoints(dir, 2, parts);
  });
}

// Runs this server rank's shard of a parameter-server method: restores it
// from the checkpoint being resumed, if any, and writes the shard's part of every checkpoint (in the
// background; then prunes as rank 0 does, so whichever writer finishes a set last prunes).
void serve_shard(const TrainConfig& config, const ShardPlan& shard_plan, std::span<const float> initial_weights,
                 Transport& transport, const SharedRunState& shared, const std::atomic<bool>* stop) {
  ParameterServerShard shard(transport, shard_plan, config.workers, initial_weights, config.method.sgd);
  if (shared.resume_from) {
    shard.load_state(CheckpointReader::read_file(shared.resume_from->parts.at(server_part(shard.shard_index()))));
  }
  ServeOptions options = serve_options(config.method, config.workers);
  options.stop = stop;
  BackgroundCheckpointWriter writer;
  if (config.checkpoint_every > 0) {
    options.on_checkpoint = [&](const ParameterServerShard& served, std::int64_t iteration) {
      CheckpointWriter part;
      part.add_int("next_iteration", iteration);
      served.save_state(part);
      BackgroundCheckpointWriter::Files files;
      files.emplace_back(checkpoint_path(config.checkpoint_dir, iteration, server_part(served.shard_index())),
                         std::move(part));
      writer.submit(std::move(files), [dir = config.checkpoint_dir, parts = checkpoint_parts(config)] {
        prune_checkpoints(dir, 2, parts);
      });
    };
  }
  shard.serve(options);
  writer.finish();
}

// True if every element of `values` is finite (no NaN or Inf): the exponent bits of none are all
// ones. An integer OR over the bits, so the loop vectorizes.
bool all_finite(std::span<const float> values) {
  std::uint32_t all_ones_seen = 0;
  for (float value : values) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    all_ones_seen |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return all_ones_seen == 0;
}

// Worker `rank` fails as --inject-fault asks, at the start of `iteration`. Never returns.
[[noreturn]] void inject_fault(const FaultInjection& fault, const SharedRunState& shared, Timeout timeout) {
  if (fault.kind == FaultInjection::Kind::kCrash) {
    if (shared.rank_is_process) std::raise(SIGKILL);
    throw InjectedFault{};
  }
  // Hang: alive but silent. A thread ends (silently) once another worker has failed, or after
  // twice the comm timeout at the latest; a process sleeps until it is killed.
  const auto give_up = Clock::now() + 2 * timeout + std::chrono::seconds(10);
  while (shared.rank_is_process || Clock::now() < give_up) {
    if (shared.any_worker_failed != nullptr && shared.any_worker_failed->load(std::memory_order_acquire)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw InjectedFault{};
}

// The replicas' weight checksums, compared every --check-consistency iterations. Collective over
// the workers; throws ReplicaDivergenceError (the same on every worker) at a difference.
class ConsistencyCheck {
 public:
  ConsistencyCheck(Transport& workers, const AllreduceOptions& options)
      : codec_(make_codec("none")),
        allreduce_(workers, 4 * static_cast<std::size_t>(workers.size()), *codec_, options),
        rank_(workers.rank()),
        pieces_(4 * static_cast<std::size_t>(workers.size())) {}

  // Returns normally if every worker's checksum equals rank 0's.
  void run(std::uint64_t checksum, std::int64_t iteration, std::uint64_t sequence) {
    // 16 bits per float: exact in fp32, so the sum (all other slots zero) reproduces every checksum.
    std::fill(pieces_.begin(), pieces_.end(), 0.0f);
    for (int k = 0; k < 4; ++k) {
      pieces_[4 * static_cast<std::size_t>(rank_) + static_cast<std::size_t>(k)] =
          static_cast<float>((checksum >> (16 * k)) & 0xffffu);
    }
    allreduce_.run(pieces_, collective_tag(Channel::kConsistency, sequence));
    const std::size_t ranks = pieces_.size() / 4;
    std::vector<std::uint64_t> sums(ranks, 0);
    for (std::size_t r = 0; r < ranks; ++r) {
      for (int k = 0; k < 4; ++k) {
        sums[r] |= static_cast<std::uint64_t>(pieces_[4 * r + static_cast<std::size_t>(k)]) << (16 * k);
      }
    }
    std::vector<std::string> differing;
    for (std::size_t r = 1; r < ranks; ++r) {
      if (sums[r] != sums[0]) differing.push_back(concat(r, " (", std::hex, sums[r], std::dec, ")"));
    }
    if (!differing.empty()) {
      throw ReplicaDivergenceError(concat("replicas diverged by iteration ", iteration,
                                          ": the weights of rank", differing.size() > 1 ? "s " : " ",
                                          join(differing), " differ from rank 0's (", std::hex, sums[0],
                                          std::dec, ") (--check-consistency)"));
    }
  }

 private:
  std::unique_ptr<Codec> codec_;
  RingAllreduce allreduce_;
  int rank_;
  std::vector<float> pieces_;
};

// `mid_operation_fault`: this worker's --inject-fault at=allreduce|push decorator (armed when
// iteration N starts), or nullptr.
void train_epochs(int rank, const TrainConfig& config, const RunPlan& plan, Model& model,
                  Transport& transport, const DataSplits& data, TrainingMethod& method,
                  SharedRunState& shared, FaultInjectingTransport* mid_operation_fault);

// Runs one worker. `transport` is the run's full transport (servers included, if any).
void run_worker(int rank, const TrainConfig& config, const RunPlan& plan, Model& model,
                Transport& run_transport, const DataSplits& data, SharedRunState& shared) {
  MethodConfig method_config = config.method;
  method_config.warmup_iterations = plan.warmup_iterations;
  method_config.servers = resolved_servers(config);
  // --inject-fault at=allreduce|push: the faulty worker's sends go through a decorator that fails
  // on the targeted send of iteration N (armed by train_epochs when iteration N starts). It outlives
  // the method (declared first).
  std::optional<FaultInjectingTransport> faulty;
  if (config.fault.active() && config.fault.in_operation() && config.fault.rank == rank) {
    const bool push = config.fault.point == FaultInjection::Point::kPush;
    // Allreduce: fire on the second message (the first went out). Push: on the send to the second
    // shard (the first shard has the push), or with one server on the push's only send.
    const int fire_on = push && method_config.servers < 2 ? 1 : 2;
    faulty.emplace(run_transport, config.fault.point, fire_on,
                   [&] { inject_fault(config.fault, shared, config.method.allreduce.timeout); });
  }
  Transport& transport = faulty ? static_cast<Transport&>(*faulty) : run_transport;
  if (layer_wise(method_config) || method_config.name == "sapipe") {
    method_config.bucket_cost =
        planning_cost(method_config, config.network, config.workers,
                      static_cast<double>(model.layout().total()) * sizeof(float));
  }
  auto method = make_training_method(method_config, model, transport);
  // Workers outnumber cores here, unlike on a cluster where a node's NIC never waits for its CPU:
  // communication threads (created above) must not queue behind compute (core/thread_priority.h).
  if (config.deprioritize_compute && transport.waits_sleep() && !realtime_priority_permitted()) {
    lower_compute_thread_priority();
  }
  try {
    train_epochs(rank, config, plan, model, transport, data, *method, shared, faulty ? &*faulty : nullptr);
    if (rank == 0) shared.method_report = method->report();
  } catch (const CommTimeoutError& error) {
    // The one line names the peer, the operation and the tag; add where this worker was.
    transport.report_failure(error.what());
    throw CommTimeoutError(concat(error.what(), " (worker ", rank, " at iteration ", shared.current_iteration[rank], ")"),
                           error.peer());
  } catch (const std::exception& error) {
    // Tell the other ranks before `method` (and its comm thread) unwinds, so they stop waiting now.
    transport.report_failure(error.what());
    throw;
  }
}

void train_epochs(int rank, const TrainConfig& config, const RunPlan& plan, Model& model,
                  Transport& transport, const DataSplits& data, TrainingMethod& method,
                  SharedRunState& shared, FaultInjectingTransport* mid_operation_fault) {
  ShardedSampler sampler(data.train.size, config.workers, rank, config.batch, config.seed);
  BatchAssembler assembler(data.train, config.batch);
  auto control_codec = make_codec("none");
  // The control reductions involve the workers only (ranks 0..M-1), never the server ranks.
  RankSubsetTransport worker_ranks(transport, config.workers);
  RingAllreduce control(worker_ranks, 3, *control_codec, config.method.allreduce);
  const bool leader = rank == 0;
  ProgressReporter progress(leader && config.progress, config.method_spec);
  std::vector<IterationTimes>& times = shared.times[rank];
  const double samples_per_iteration = static_cast<double>(config.workers * config.batch);

  static const SegmentReadyFn no_reports;
  const SegmentReadyFn* ready = method.segment_ready();
  const SegmentReadyFn& method_ready = ready != nullptr ? *ready : no_reports;
  std::unique_ptr<ConsistencyCheck> consistency;
  if (config.check_consistency > 0) {
    consistency = std::make_unique<ConsistencyCheck>(worker_ranks, config.method.allreduce);
  }
  // --on-nonfinite: every segment's gradient is checked as backward reports it final, before the
  // method may send it; a model that reports no segment is checked after backward.
  const Layout& layout = model.layout();
  const bool skip_nonfinite = config.on_nonfinite == "skip";
  std::span<float> gradients;
  std::int64_t iteration_in_progress = 0;
  std::size_t segments_checked = 0;
  std::string nonfinite_layer;  // "stop": the first non-finite layer of this iteration
  std::int64_t& skipped = shared.nonfinite_skipped[rank];
  auto check_segment = [&](std::size_t segment) -> bool {  // false: do not pass it on
    ++segments_checked;
    if (!nonfinite_layer.empty()) return false;  // "stop": nothing more goes to the method
    const std::span<float> values = layout.slice(gradients, segment);
    if (all_finite(values)) return true;
    if (!skip_nonfinite) {
      if (nonfinite_layer.empty()) nonfinite_layer = layout.segment(segment).name;
      return false;
    }
    std::fill(values.begin(), values.end(), 0.0f);
    if (++skipped <= 10) {
      std::cerr << concat("pipesgd: warning: rank ", rank, ": non-finite gradient in layer '",
                          layout.segment(segment).name, "' at iteration ", iteration_in_progress,
                          " replaced by zeros (--on-nonfinite skip)", skipped == 10 ? "; further ones not shown" : "",
                          "\n");
    }
    return true;
  };
  const SegmentReadyFn on_ready = [&](std::size_t segment, double seconds) {
    if (check_segment(segment) && method_ready) method_ready(segment, seconds);
  };
  std::int64_t t = 0;
  double train_seconds = 0;
  BackgroundCheckpointWriter checkpoint_writer;
  // --resume: this worker's part of the checkpoint: weights, method state, its place in the epoch.
  std::int64_t start = 0;
  double resumed_loss_sum = 0, resumed_correct = 0;
  if (shared.resume_from) {
    const CheckpointReader part = CheckpointReader::read_file(shared.resume_from->parts.at(rank_part(rank)));
    start = part.integer("next_iteration");
    const std::span<const float> weights = part.floats("model.parameters");
    if (weights.size() != model.parameters().size()) {
      throw DataError(concat("checkpoint '", part.origin(), "': ", weights.size(), " weights for a model of ",
                             model.parameters().size()));
    }
    std::copy(weights.begin(), weights.end(), model.parameters().begin());
    method.load_state(part, start);
    const std::span<const std::byte> sums = part.bytes("epoch_sums");
    if (sums.size() != 2 * sizeof(double)) throw DataError(concat("checkpoint '", part.origin(), "': bad epoch_sums"));
    double values[2];
    std::memcpy(values, sums.data(), sizeof values);
    resumed_loss_sum = values[0];
    resumed_correct = values[1];
    if (leader) train_seconds = shared.epochs.empty() ? 0.0 : shared.epochs.back().elapsed_seconds;
  }
  t = start;
  for (std::int64_t epoch = start / plan.iterations_per_epoch; epoch < plan.epochs; ++epoch) {
    sampler.start_epoch(static_cast<std::size_t>(epoch));
    const std::int64_t epoch_start = epoch * plan.iterations_per_epoch;
    const std::int64_t count = std::min(plan.iterations_per_epoch, plan.total_iterations - epoch_start);
    progress.start_epoch(epoch, plan.epochs, count);
    Stopwatch epoch_clock;
    const bool resumed_epoch = t > epoch_start;
    double loss_sum = resumed_epoch ? resumed_loss_sum : 0;
    double correct = resumed_epoch ? resumed_correct : 0;  // training examples predicted right (before their update)
    for (std::int64_t i = t - epoch_start; i < count; ++i, ++t) {
      IterationTimes& record = times[t];
      shared.current_iteration[rank] = t;
      if (config.fault.active() && config.fault.at_iteration_start() && config.fault.rank == rank &&
          config.fault.iteration == t) {
        inject_fault(config.fault, shared, config.method.allreduce.timeout);
      }
      if (mid_operation_fault != nullptr && config.fault.iteration == t) {
        // at=allreduce|push: count the operations of iteration N on, where the method's tags tell
        // them (else any operation after N started, possibly an earlier one still in flight).
        mid_operation_fault->arm(method.first_message_sequence(t).value_or(0));
      }
      Stopwatch iteration;
      gradients = method.begin_iteration(t, record);
      iteration_in_progress = t;
      segments_checked = 0;
      nonfinite_layer.clear();
      Stopwatch loading;
      const Batch batch = assembler.assemble(sampler.batch_indices(static_cast<std::size_t>(i)));
      record.data = loading.seconds();
      const StepResult step = model.forward_backward(batch, gradients, on_ready);
      record.forward = step.forward_seconds;
      record.backward = step.backward_seconds;
      record.loss = step.loss;
      if (segments_checked < layout.segment_count()) {
        // The model reported not every segment: check them all now (before end_iteration sends).
        for (std::size_t s = 0; s < layout.segment_count(); ++s) check_segment(s);
      }
      if (!nonfinite_layer.empty()) {
        throw NumericalError(concat("rank ", rank, ": non-finite gradient (NaN or Inf) in layer '", nonfinite_layer,
                                    "' at iteration ", t, ", loss ", step.loss,
                                    " (--on-nonfinite stop; lower --lr, or skip such gradients with "
                                    "--on-nonfinite skip)"));
      }
      method.end_iteration(t, record);
      if (consistency && (t + 1) % config.check_consistency == 0) {
        consistency->run(method.replica_checksum(model), t, static_cast<std::uint64_t>((t + 1) / config.check_consistency));
        if (leader) ++shared.consistency_checks;
      }
      if (config.checkpoint_every > 0 && (t + 1) % config.checkpoint_every == 0 && t + 1 < plan.total_iterations) {
        Stopwatch writing;
        write_checkpoint(config, plan, rank, t, model, method, loss_sum + step.loss,
                         correct + static_cast<double>(step.correct), shared, checkpoint_writer);
        record.checkpoint = writing.seconds();
      }
      record.iteration = iteration.seconds();
      loss_sum += step.loss;
      correct += static_cast<double>(step.correct);
      if (leader) {
        progress.update(i + 1, loss_sum / static_cast<double>(i + 1),
                        samples_per_iteration * static_cast<double>(i + 1) / epoch_clock.seconds());
      }
    }
    if (t == plan.total_iterations) {
      IterationTimes drain;
      method.finish(drain);  // apply what is still in flight before the final evaluation
    }
    train_seconds += epoch_clock.seconds();

    // Epoch end: mean training loss over all workers (this reduction is also a barrier), then rank 0
    // evaluates while the others wait at a second barrier, so evaluation never pollutes timings.
    // (Counts up to 2^24 are exact in fp32: an epoch of this run has at most that many examples.)
    float reduced[3] = {static_cast<float>(loss_sum), static_cast<float>(count),
                        static_cast<float>(correct)};
    control.run(reduced, control_tag(2 * epoch));
    if (leader) {
      EpochRecord record;
      record.epoch = epoch + 1;
      record.iterations = t;
      record.train_loss = reduced[1] > 0 ? reduced[0] / reduced[1] : 0;
      record.train_accuracy =
          reduced[1] > 0 ? reduced[2] / (reduced[1] * static_cast<double>(config.batch)) : 0;
      record.elapsed_seconds = train_seconds;
      std::string result = concat("train loss ", std::fixed, std::setprecision(4), record.train_loss,
                                  ", train accuracy ", std::setprecision(2),
                                  record.train_accuracy * 100, "%");
      if (config.evaluate) {
        const Evaluation evaluation = evaluate(model, data.test);
        record.test_accuracy = evaluation.count ? double(evaluation.correct) / evaluation.count : 0;
        record.test_loss = evaluation.count ? evaluation.loss_sum / evaluation.count : 0;
        result += concat(", test accuracy ", std::fixed, std::setprecision(2),
                         record.test_accuracy * 100, "%");
      }
      progress.end_epoch(result);
      shared.epochs.push_back(record);
    }
    float token[1] = {0};
    control.run(token, control_tag(2 * epoch + 1));
  }
  checkpoint_writer.finish();  // the last checkpoint is on disk before the run reports success
  if (config.checkpoint_every > 0) {
    // Every worker's writes are done (a barrier on the consistency channel, whose sequence 0 no
    // check uses): now the newest sets are complete and pruning leaves exactly the 2 newest.
    float token[1] = {0};
    control.run(token, collective_tag(Channel::kConsistency, 0));
    if (leader) prune_checkpoints(config.checkpoint_dir, 2, checkpoint_parts(config));
  }
  shared.bytes_sent[rank] = transport.bytes_sent();
  if (leader) shared.train_seconds = train_seconds;
  if (config.keep_parameters) {
    auto parameters = model.parameters();
    shared.final_parameters[rank].assign(parameters.begin(), parameters.end());
  }
}

// Mean of the measured iterations over all ranks.
IterationTimes mean_times(const SharedRunState& shared, std::int64_t first, std::int64_t end) {
  IterationTimes mean;
  const double n = static_cast<double>(shared.times.size()) * static_cast<double>(end - first);
  if (n <= 0) return mean;
  for (const auto& per_rank : shared.times) {
    for (std::int64_t t = first; t < end; ++t) mean.add_scaled(per_rank[t], 1.0 / n);
  }
  return mean;
}

// When every rank is its own process: ranks 1..p-1 send their per-iteration times and byte counts
// to rank 0, which needs them for the means. Collective.
void gather_at_leader(Transport& transport, const TrainConfig& config, const RunPlan& plan,
                      SharedRunState& shared) {
  constexpr const char* kOperation = "gathering the run's timings";
  const Tag base = control_tag(2 * plan.epochs);
  const Timeout timeout = config.method.allreduce.timeout;
  const int rank = transport.rank();
  auto bytes_of_times = [&](int r) { return std::as_writable_bytes(std::span(shared.times[r])); };
  auto bytes_of_count = [&](int r) {
    return std::as_writable_bytes(std::span(&shared.bytes_sent[r], 1));
  };
  if (rank != 0) {
    Request times = transport.send(0, step_tag(base, 0, 0), bytes_of_times(rank), kOperation);
    Request count = transport.send(0, step_tag(base, 0, 1), bytes_of_count(rank), kOperation);
    times.wait(timeout);
    count.wait(timeout);
    return;
  }
  for (int peer = 1; peer < transport.size(); ++peer) {
    Request times = transport.recv(peer, step_tag(base, 0, 0), bytes_of_times(peer), kOperation);
    Request count = transport.recv(peer, step_tag(base, 0, 1), bytes_of_count(peer), kOperation);
    if (times.wait(timeout) != bytes_of_times(peer).size() || count.wait(timeout) != sizeof(std::uint64_t)) {
      throw CommError(concat(kOperation, ": rank ", peer, " ran a different number of iterations"));
    }
  }
}

bool is_bucket_plan_name(const std::string& name) {
  try {
    check_bucket_plan_name(name);
    return true;
  } catch (const UsageError&) {
    return false;
  }
}

// OD-SGD Eq. 1-3 from the run: the synchronous stage is iterations [0, switching), the pipelined
// stage the measured iterations (whose means are `pipelined`).
OdSgdReport od_sgd_report(const SharedRunState& shared, std::int64_t switching,
                          const IterationTimes& pipelined) {
  OdSgdReport report;
  report.times.compute = pipelined.iteration - pipelined.wait;
  report.times.communication = pipelined.comm;
  const std::int64_t start_up = std::min<std::int64_t>(10, switching / 10);
  report.sync_iterations = switching - start_up;
  if (report.sync_iterations > 0) {
    const IterationTimes sync = mean_times(shared, start_up, switching);
    report.sync_iteration = sync.iteration;
    report.times.sync_communication = sync.comm;
  }
  report.predicted_iteration = od_sgd_iteration_time(report.times);
  report.overlap_bound = std::max(report.times.compute, report.times.communication);
  if (report.sync_iterations > 0 && sync_ps_iteration_time(report.times) > 0 &&
      report.sync_iteration > 0) {
    report.predicted_improvement = od_sgd_improvement_rate(report.times);
    report.measured_improvement = (report.sync_iteration - pipelined.iteration) / report.sync_iteration;
  }
  return report;
}

RunSummary summarize(const TrainConfig& config, const RunPlan& plan, SharedRunState& shared,
                     Model& model, bool write_outputs) {
  RunSummary summary;
  summary.method_spec = config.method_spec;
  summary.model = config.model;
  summary.workers = config.workers;
  summary.servers = resolved_servers(config);
  summary.batch = config.batch;
  summary.network = config.network.name;
  summary.codec = config.method.codec;
  summary.segmenting = summary.servers > 0 ? std::string("none (parameter server)")
                                            : describe_segment_bytes(resolve_allreduce_options(config.method).segment_bytes);
  summary.allreduce =
      summary.servers > 0
          ? std::string("none (parameter server)")
          : resolve_allreduce_algorithm(config.method, config.workers,
                                        static_cast<double>(model.layout().total()) * sizeof(float));
  summary.staleness = config.method.name == "pipe" ? config.method.staleness
                      : config.method.name == "sapipe" ? 2
                                                       : 1;
  for (std::int64_t skipped : shared.nonfinite_skipped) summary.nonfinite_skipped += skipped;
  summary.consistency_checks = shared.consistency_checks;
  summary.resumed_from = shared.resume_from ? shared.resume_from->iteration : -1;
  summary.method_report = shared.method_report;
  summary.plan = shared.method_report.plan;
  summary.allreduce_calls = shared.method_report.allreduce_calls;
  summary.iterations = plan.total_iterations;
  summary.measured_iterations = plan.total_iterations - plan.first_measured;
  summary.mean = mean_times(shared, plan.first_measured, plan.total_iterations);
  summary.throughput = summary.mean.iteration > 0
                           ? static_cast<double>(config.workers * config.batch) / summary.mean.iteration
                           : 0;
  summary.train_seconds = shared.train_seconds;
  // The compute thread is busy for the whole iteration except its exposed waits.
  const IterationTimes& m = summary.mean;
  const double busy = m.iteration - m.wait;
  summary.stages = StageTimes{m.update, m.data, m.forward, m.backward,
                              std::max(0.0, busy - (m.update + m.data + m.forward + m.backward)), m.comm};
  summary.predicted_sync_iteration = predict_dsync_iteration(summary.stages);
  summary.predicted_pipe_iteration = predict_pipe_iteration(summary.stages);
  const bool pipelined = (config.method.name == "pipe" && config.method.staleness >= 2 &&
                          plan.warmup_iterations < plan.total_iterations) ||
                         config.method.name == "sapipe";
  summary.predicted_iteration =
      pipelined ? summary.predicted_pipe_iteration : summary.predicted_sync_iteration;
  if (config.network.emulated() && summary.servers == 0) {  // Eq. 5 is the ring's, not the server's
    RingCostParameters link;
    link.alpha = config.network.latency_seconds;
    link.beta = config.network.bits_per_second > 0 ? 1.0 / config.network.bytes_per_second() : 0;
    const double bytes = static_cast<double>(model.layout().total()) *
                         static_cast<double>(make_codec(config.method.codec)->encoded_bytes(1000)) /
                         1000.0;
    summary.link_model_comm = ring_allreduce_time(config.workers, bytes, link);
  }
  if (!summary.plan.empty()) {
    // Layer-wise: the compute thread waits for the buckets after backward only; that wait is t_c^no.
    summary.non_overlapped_comm = summary.mean.wait;
    summary.predicted_non_overlapped_comm = shared.method_report.predicted_non_overlapped;
    if (shared.method_report.predicted_iteration > 0) {
      summary.predicted_iteration = shared.method_report.predicted_iteration;
    }
  }
  if (config.method.name == "odsgd") {
    // Warm-up iterations (trained on the synchronous global weights) end at the switching
    // iteration max(N, 1) - 1 (algo/od_sgd.h); skip their start-up like the measured ones'.
    const std::int64_t switching =
        std::min(std::max<std::int64_t>(plan.warmup_iterations, 1) - 1, plan.total_iterations);
    if (switching < plan.total_iterations) {
      summary.od_sgd = od_sgd_report(shared, switching, summary.mean);
      summary.predicted_iteration = summary.od_sgd->predicted_iteration;
    }
  }
  summary.epochs = shared.epochs;
  if (!summary.epochs.empty()) {
    summary.final_test_accuracy = summary.epochs.back().test_accuracy;
    summary.final_train_accuracy = summary.epochs.back().train_accuracy;
  }
  std::uint64_t bytes = 0;
  for (auto b : shared.bytes_sent) bytes += b;
  summary.bytes_sent_per_iteration =
      plan.total_iterations ? bytes / config.workers / plan.total_iterations : 0;
  summary.final_parameters = std::move(shared.final_parameters);
  summary.weights_checksum = checksum_of(model.parameters());
  if (write_outputs && !config.out_dir.empty()) {
    write_run_outputs(config.out_dir, summary, shared.times, plan.iterations_per_epoch);
  }
  return summary;
}

}  // namespace

int resolved_servers(const TrainConfig& config) {
  if (!method_uses_servers(config.method.name)) return config.servers;
  return config.servers == 0 ? 1 : config.servers;
}

void validate_train_config(const TrainConfig& config) {
  if (config.workers < 1 || config.workers > kMaxWorkers) {
    throw UsageError(concat("--workers must be in [1, ", kMaxWorkers, "], got ", config.workers));
  }
  if (config.batch < 1 || config.batch > kMaxBatch) {
    throw UsageError(concat("--batch must be in [1, ", kMaxBatch, "], got ", config.batch));
  }
  if (config.iterations < 0 || config.iterations > kMaxIterations) {
    throw UsageError(concat("--iters must be in [0, ", kMaxIterations, "], got ", config.iterations));
  }
  if (config.iterations == 0 && (config.epochs < 1 || config.epochs > kMaxIterations)) {
    throw UsageError(concat("--epochs must be in [1, ", kMaxIterations, "], got ", config.epochs));
  }
  if (config.warmup_epochs < 0 || config.warmup_iterations < 0 ||
      config.warmup_epochs > kMaxIterations || config.warmup_iterations > kMaxIterations) {
    throw UsageError(concat("--warmup-epochs and --warmup-iters must be in [0, ", kMaxIterations, "]"));
  }
  if (config.method.staleness < 1 || config.method.staleness > kMaxStaleness) {
    throw UsageError(concat("--staleness-k must be in [1, ", kMaxStaleness, "], got ",
                            config.method.staleness));
  }
  if (config.servers < 0 || config.servers > kMaxServers) {
    throw UsageError(concat("--servers must be in [0, ", kMaxServers, "], got ", config.servers));
  }
  if (method_uses_servers(config.method.name)) {
    if (config.method.codec != "none") {
      throw UsageError(concat("method '", config.method.name, "' sends fp32 to its servers; codec '",
                              config.method.codec, "' applies only to dsync and pipe"));
    }
  }
  const bool dsync_family = config.method.name == "dsync" || !implied_bucket_plan(config.method.name).empty();
  if (config.method.name == "sapipe") {
    if (config.method.stale_layers != "auto") parse_stale_layers(config.method.stale_layers, kLayersUnknown);
    const std::vector<std::string> compensations = compensation_names();
    if (std::find(compensations.begin(), compensations.end(), config.method.compensation) == compensations.end()) {
      throw UsageError(concat("unknown --compensation '", config.method.compensation, "' (expected ",
                              join(compensations), ")"));
    }
    if (config.method.profile_iterations < 1 || config.method.profile_iterations > kMaxIterations) {
      throw UsageError(concat("--profile-iters must be in [1, ", kMaxIterations, "], got ",
                              config.method.profile_iterations));
    }
    if (!config.method.buckets.empty()) check_bucket_plan_name(config.method.buckets);
  } else if (!dsync_family && !config.method.buckets.empty()) {
    throw UsageError(concat("bucket plans apply to dsync (and wfbp, synceasgd, mgwfbp) and sapipe only, not '",
                            config.method.name, "'"));
  }
  if (layer_wise(config.method)) {
    if (config.method.name != "dsync" && !config.method.buckets.empty() &&
        config.method.buckets != implied_bucket_plan(config.method.name)) {
      throw UsageError(concat("method '", config.method.name, "' is dsync with the ",
                              implied_bucket_plan(config.method.name), " plan; for the ", config.method.buckets,
                              " plan use dsync+", config.method.buckets));
    }
    if (config.method.profile_iterations < 1 || config.method.profile_iterations > kMaxIterations) {
      throw UsageError(concat("--profile-iters must be in [1, ", kMaxIterations, "], got ",
                              config.method.profile_iterations));
    }
    if (config.method.replan_every < 0 || config.method.replan_every > kMaxIterations) {
      throw UsageError(concat("--replan-every must be in [0, ", kMaxIterations, "] (0: never), got ",
                              config.method.replan_every));
    }
    if (!config.method.buckets.empty()) check_bucket_plan_name(config.method.buckets);
  }
  if (!method_uses_servers(config.method.name) && config.servers > 0) {
    throw UsageError(concat("--servers applies only to the parameter-server methods pssync, asgd, dcasgd "
                            "and odsgd, not '",
                            config.method.name, "'"));
  }
  if (config.checkpoint_every < 0 || config.checkpoint_every > kMaxIterations) {
    throw UsageError(concat("--checkpoint-every must be in [0, ", kMaxIterations, "] (0: never), got ",
                            config.checkpoint_every));
  }
  if ((config.checkpoint_every > 0 || config.resume) && config.checkpoint_dir.empty()) {
    throw UsageError(concat(config.resume ? "--resume" : "--checkpoint-every", " needs --checkpoint-dir DIR"));
  }
  if (!config.checkpoint_dir.empty() && config.checkpoint_every == 0 && !config.resume) {
    throw UsageError("--checkpoint-dir needs --checkpoint-every N (to write checkpoints) or --resume (to read one)");
  }
  if (config.on_nonfinite != "stop" && config.on_nonfinite != "skip") {
    throw UsageError(concat("--on-nonfinite must be stop or skip, got '", config.on_nonfinite, "'"));
  }
  if (config.check_consistency < 0 || config.check_consistency > kMaxIterations) {
    throw UsageError(concat("--check-consistency must be in [0, ", kMaxIterations, "] (0: never), got ",
                            config.check_consistency));
  }
  if (config.check_consistency > 0 && !replicas_identical(config.method.name)) {
    throw UsageError(concat("--check-consistency: the replicas of '", config.method.name,
                            "' differ by design (each worker trains on its own weights); it applies to "
                            "dsync and its plans, pipe, sapipe and pssync"));
  }
  if (config.fault.active() && config.fault.during_checkpoint() &&
      (config.checkpoint_every == 0 || (config.fault.iteration + 1) % config.checkpoint_every != 0)) {
    throw UsageError(concat("--inject-fault at=checkpoint: no checkpoint is written after iteration ",
                            config.fault.iteration, " (--checkpoint-every ", config.checkpoint_every, ")"));
  }
  if (config.fault.active() && config.fault.point == FaultInjection::Point::kAllreduce &&
      method_uses_servers(config.method.name)) {
    throw UsageError(concat("--inject-fault at=allreduce: '", config.method.name,
                            "' pushes to parameter servers and runs no allreduce (use at=push)"));
  }
  if (config.fault.active() && config.fault.point == FaultInjection::Point::kPush &&
      !method_uses_servers(config.method.name)) {
    throw UsageError(concat("--inject-fault at=push: '", config.method.name,
                            "' runs no parameter servers (use at=allreduce; at=push is for pssync, asgd, dcasgd, odsgd)"));
  }
  if (config.fault.active() && config.fault.rank >= config.workers) {
    throw UsageError(concat("--inject-fault: rank ", config.fault.rank, " is not a worker (the run has ",
                            config.workers, " workers: ranks 0-", config.workers - 1, ")"));
  }
  make_codec(config.method.codec);
  if (config.method.optimizer != "sgd" && (method_uses_servers(config.method.name))) {
    throw UsageError(concat("--optimizer ", config.method.optimizer, ": the parameter-server methods run SGD on "
                            "their servers; use --optimizer sgd with '", config.method.name, "'"));
  }
  if (config.method.optimizer == "adam" && config.method.sgd.momentum != 0) {
    throw UsageError("--momentum is SGD's; Adam's first-moment decay is --adam-beta1");
  }
  Layout one_segment;
  one_segment.add("check", 1);
  make_optimizer(optimizer_options(config.method), one_segment);  // a bad --lr, betas, eps, decay
  Sgd(0, config.method.sgd);  // throws UsageError for a bad learning rate, momentum or weight decay
  DelayCompensation(0, config.method.delay_compensation);  // a bad --dc-lambda or --dc-momentum
  if (config.method.name == "odsgd") LocalUpdater(0, config.method.local_updater, config.method.sgd,
                                                  config.method.delay_compensation);
}

void apply_method_spec(const std::string& spec, TrainConfig& config) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const std::size_t plus = spec.find('+', begin);
    parts.push_back(spec.substr(begin, plus - begin));
    if (plus == std::string::npos) break;
    begin = plus + 1;
  }
  const std::vector<std::string> methods = method_names();
  if (parts[0].empty() || std::find(methods.begin(), methods.end(), parts[0]) == methods.end()) {
    throw UsageError(concat("unknown algorithm '", parts[0], "' in '", spec,
                            "' (expected ", join(methods, ", "), ", optionally followed by +codec)"));
  }
  config.method_spec = spec;
  config.method.name = parts[0];
  const std::vector<std::string> codecs = codec_names();
  bool codec_given = false, compensation_given = false;
  const std::vector<std::string> compensations = compensation_names();
  config.method.buckets = implied_bucket_plan(parts[0]);
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const bool names_plan = is_bucket_plan_name(parts[i]) || parts[i].rfind("fixed:", 0) == 0;
    if (names_plan && !implied_bucket_plan(parts[0]).empty()) {
      throw UsageError(concat("method '", parts[0], "' is dsync with the ", implied_bucket_plan(parts[0]),
                              " plan; for the ", parts[i], " plan use dsync+", parts[i]));
    }
    if (parts[0] == "sapipe" && !names_plan &&
        std::find(compensations.begin(), compensations.end(), parts[i]) != compensations.end()) {
      if (compensation_given) throw UsageError(concat("method '", spec, "' names more than one compensation"));
      compensation_given = true;
      config.method.compensation = parts[i];
      continue;
    }
    if ((parts[0] == "dsync" || parts[0] == "sapipe") && names_plan) {
      check_bucket_plan_name(parts[i]);  // e.g. fixed:0, with the plan's own message
      if (!config.method.buckets.empty()) {
        throw UsageError(concat("method '", spec, "' names more than one bucket plan"));
      }
      config.method.buckets = parts[i];
      continue;
    }
    if (std::find(codecs.begin(), codecs.end(), parts[i]) == codecs.end()) {
      throw UsageError(concat("unknown option '", parts[i], "' in method '", spec,
                              "' (options are codecs: none, bf16, int8",
                              parts[0] == "dsync" || parts[0] == "sapipe"
                                  ? "; and bucket plans: wfbp, single, mgwfbp, optimal, fixed:<MiB>"
                                  : "",
                              parts[0] == "sapipe" ? "; and compensations: none, dc, wp1, wp2, wp3" : "",
                              ")"));
    }
    if (codec_given) throw UsageError(concat("method '", spec, "' names more than one codec"));
    codec_given = true;
    config.method.codec = parts[i];
  }
}

RunSummary run_training(const TrainConfig& config, const ModelFactory& factory,
                        const DataSplits& data) {
  validate_train_config(config);  // before starting threads
  RunPlan plan = plan_run(config, data.train);
  if (!config.out_dir.empty()) ensure_directory(config.out_dir);  // fail before training, not after
  if (config.checkpoint_every > 0) ensure_directory(config.checkpoint_dir, "--checkpoint-dir");
  SharedRunState shared;
  if (config.resume) {
    find_resume_point(config, plan, shared, true);
    resume_plan(plan, shared.resume_from->iteration);
  }

  // Replicas are built one after another: model initialisation may use a global RNG.
  std::vector<std::unique_ptr<Model>> models;
  for (int rank = 0; rank < config.workers; ++rank) models.push_back(factory(config.seed));
  if (models[0]->layout().total() == 0) throw UsageError("the model has no parameters");

  // Parameter-server methods: S server ranks after the M workers, each serving one shard of the
  // plan, starting from the replicas' common initial weights (every replica is built from the seed;
  // copied from rank 0 before any training). The plan is built here so that a bad --servers fails
  // before any thread starts.
  const int servers = resolved_servers(config);
  std::unique_ptr<ShardPlan> shard_plan;
  std::vector<float> initial_weights;
  if (servers > 0) {
    shard_plan = std::make_unique<ShardPlan>(models[0]->layout(), servers);
    auto parameters = models[0]->parameters();
    initial_weights.assign(parameters.begin(), parameters.end());
  }
  const int ranks = config.workers + servers;

  LocalFabric fabric(ranks, config.network);
  shared.times.assign(config.workers, std::vector<IterationTimes>(plan.total_iterations));
  shared.bytes_sent.assign(config.workers, 0);
  shared.failures.assign(ranks, nullptr);
  shared.final_parameters.resize(config.keep_parameters ? config.workers : 0);
  shared.nonfinite_skipped.assign(config.workers, 0);
  shared.current_iteration.assign(config.workers, 0);
  std::atomic<bool> worker_failed{false};  // stops the servers at once (ServeOptions::stop)
  std::atomic<bool> injected_fault_ended{false};  // a worker ended by --inject-fault
  shared.any_worker_failed = &worker_failed;

  std::vector<std::thread> threads;
  for (int rank = 0; rank < config.workers; ++rank) {
    threads.emplace_back([&, rank] {
      Transport& transport = fabric.endpoint(rank);
      try {
        run_worker(rank, config, plan, *models[rank], transport, data, shared);
      } catch (const InjectedFault&) {
        // --inject-fault: this worker "died" without a word; the others find out by their timeouts.
        injected_fault_ended.store(true, std::memory_order_release);
      } catch (const std::exception& error) {
        shared.failures[rank] = std::current_exception();
        transport.report_failure(error.what());
        worker_failed.store(true, std::memory_order_release);
      }
    });
  }
  for (int rank = config.workers; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      Transport& transport = fabric.endpoint(rank);
      try {
        serve_shard(config, *shard_plan, initial_weights, transport, shared, &worker_failed);
      } catch (const std::exception& error) {
        shared.failures[rank] = std::current_exception();
        transport.report_failure(error.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();

  // Report the root cause: a worker's own error rather than the others' "peer failed", and a timeout
  // on a peer that went silent rather than one on a peer that itself failed (e.g. stuck behind the
  // silent one, as the ring's next rank is when a worker dies mid-allreduce).
  std::exception_ptr first_failure, consequence;
  for (const auto& failure : shared.failures) {
    if (!failure) continue;
    try {
      std::rethrow_exception(failure);
    } catch (const PeerFailedError&) {
      if (!first_failure) first_failure = failure;
    } catch (const CommTimeoutError& error) {
      const int peer = error.peer();
      if (peer < 0 || peer >= ranks || !shared.failures[peer]) std::rethrow_exception(failure);
      if (!consequence) consequence = failure;
    } catch (...) {
      std::rethrow_exception(failure);
    }
  }
  if (consequence) std::rethrow_exception(consequence);
  if (first_failure) std::rethrow_exception(first_failure);
  if (injected_fault_ended.load(std::memory_order_acquire)) {
    // No other worker was there to notice (a single worker): the run did not complete.
    throw CommError(concat("worker ", config.fault.rank, " was stopped by --inject-fault at iteration ",
                           config.fault.iteration, " and no other worker was left to report it"));
  }

  return summarize(config, plan, shared, *models[0], true);
}

RunSummary run_training_rank(const TrainConfig& config, const ModelFactory& factory,
                             const DataSplits& data, Transport& transport) {
  validate_train_config(config);
  const int servers = resolved_servers(config);
  if (config.workers + servers != transport.size()) {
    throw UsageError(concat("--workers ", config.workers,
                            servers > 0 ? concat(" + --servers ", servers) : std::string(),
                            " does not match the ", transport.size(), " ranks of ", transport.describe()));
  }
  RunPlan plan = plan_run(config, data.train);
  const int rank = transport.rank();
  if (rank == 0 && !config.out_dir.empty()) ensure_directory(config.out_dir);
  if (config.checkpoint_every > 0) ensure_directory(config.checkpoint_dir, "--checkpoint-dir");
  SharedRunState shared;
  if (config.resume) {
    // Every rank reads the same directory (a shared file system across hosts).
    find_resume_point(config, plan, shared, rank == 0);
    resume_plan(plan, shared.resume_from->iteration);
  }
  std::unique_ptr<Model> model = factory(config.seed);
  if (model->layout().total() == 0) throw UsageError("the model has no parameters");

  if (servers > 0) {
    // Every rank builds the plan, so a bad --servers is the same usage error on every rank.
    const ShardPlan shard_plan(model->layout(), servers);
    if (rank >= config.workers) {
      // A server rank: serves its shard from the replicas' common initial weights (every rank built
      // the model from the seed), then returns an empty summary (only rank 0's is printed).
      try {
        serve_shard(config, shard_plan, model->parameters(), transport, shared, nullptr);
      } catch (const std::exception& error) {
        transport.report_failure(error.what());
        throw;
      }
      RunSummary summary;
      summary.method_spec = config.method_spec;
      summary.workers = config.workers;
      summary.servers = servers;
      return summary;
    }
  }

  shared.times.assign(config.workers, std::vector<IterationTimes>(plan.total_iterations));
  shared.bytes_sent.assign(config.workers, 0);
  shared.failures.assign(config.workers, nullptr);
  shared.final_parameters.resize(config.keep_parameters ? config.workers : 0);
  shared.nonfinite_skipped.assign(config.workers, 0);
  shared.current_iteration.assign(config.workers, 0);
  shared.rank_is_process = true;
  run_worker(rank, config, plan, *model, transport, data, shared);  // reports its own failure
  try {
    // The timings are gathered among the workers only.
    RankSubsetTransport worker_ranks(transport, config.workers);
    gather_at_leader(worker_ranks, config, plan, shared);
  } catch (const std::exception& error) {
    transport.report_failure(error.what());
    throw;
  }
  return summarize(config, plan, shared, *model, rank == 0);
}

}  // namespace pipesgd
