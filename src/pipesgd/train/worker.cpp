#include "pipesgd/train/worker.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>

#include "pipesgd/collective/allreduce_meter.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/comm/rank_subset_transport.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/thread_priority.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/data/sampler.h"
#include "pipesgd/train/checkpointing.h"
#include "pipesgd/train/elastic.h"
#include "pipesgd/train/progress.h"
#include "pipesgd/report/short_run.h"

namespace pipesgd {
namespace {

// The trainer's own messages (epoch-end loss reduction and rank 0's evaluation) use the control
// channel: epoch e uses sequences 2e and 2e + 1 (the result gathering after the run 2 * epochs).
Tag control_tag(std::int64_t sequence) { return collective_tag(Channel::kControl, static_cast<std::uint64_t>(sequence)); }

// Rank 0's words to the others while it evaluates (message k of epoch e: step k of sequence 2e + 1,
// one byte). The step field has 12 bits: rank 0 stops sending kStillEvaluating before the last.
constexpr std::byte kStillEvaluating{1};
constexpr std::byte kEvaluationDone{0};
constexpr int kLastEvaluationMessage = (1 << 12) - 1;
constexpr const char* kEvaluationWait = "waiting for rank 0's evaluation";

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

// --on-nonfinite: every segment's gradient is checked as backward reports it final, before the
// method may send it; a model that reports no segment is checked after backward.
class NonfiniteGuard {
 public:
  NonfiniteGuard(int rank, const Layout& layout, bool skip, std::int64_t& skipped)
      : rank_(rank), layout_(layout), skip_(skip), skipped_(skipped) {}

  void start(std::int64_t t, std::span<float> gradients) {
    iteration_ = t;
    gradients_ = gradients;
    checked_ = 0;
    bad_layer_.clear();
  }
  // Checks segment `segment`; false: the method must not see it ("stop" found a non-finite one).
  bool check(std::size_t segment) {
    ++checked_;
    if (!bad_layer_.empty()) return false;  // "stop": nothing more goes to the method
    const std::span<float> values = layout_.slice(gradients_, segment);
    if (all_finite(values)) return true;
    if (!skip_) {
      bad_layer_ = layout_.segment(segment).name;
      return false;
    }
    std::fill(values.begin(), values.end(), 0.0f);
    if (++skipped_ <= 10) {
      std::cerr << concat("pipesgd: warning: rank ", rank_, ": non-finite gradient in layer '",
                          layout_.segment(segment).name, "' at iteration ", iteration_,
                          " replaced by zeros (--on-nonfinite skip)", skipped_ == 10 ? "; further ones not shown" : "",
                          "\n");
    }
    return true;
  }
  // After backward: checks what the model did not report; throws NumericalError for "stop".
  void finish(double loss) {
    if (checked_ < layout_.segment_count()) {
      for (std::size_t s = 0; s < layout_.segment_count(); ++s) check(s);
    }
    if (bad_layer_.empty()) return;
    throw NumericalError(concat("rank ", rank_, ": non-finite gradient (NaN or Inf) in layer '", bad_layer_,
                                "' at iteration ", iteration_, ", loss ", loss,
                                " (--on-nonfinite stop; lower --lr, or skip such gradients with --on-nonfinite skip)"));
  }

 private:
  const int rank_;
  const Layout& layout_;
  const bool skip_;
  std::int64_t& skipped_;
  std::int64_t iteration_ = 0;
  std::span<float> gradients_;
  std::size_t checked_ = 0;
  std::string bad_layer_;  // "stop": the first non-finite layer of this iteration
};

// The replicas' weight checksums, compared every --check-consistency iterations. Collective over
// the workers; throws ReplicaDivergenceError (the same on every worker) at a difference.
class ConsistencyCheck {
 public:
  ConsistencyCheck(Transport& workers, Timeout timeout)
      : codec_(make_codec("none")),
        allreduce_(workers, 4 * static_cast<std::size_t>(workers.size()), *codec_, AllreduceOptions{timeout, kAutoSegmentBytes}),
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
      throw ReplicaDivergenceError(concat("replicas diverged by iteration ", iteration, ": the weights of rank",
                                          differing.size() > 1 ? "s " : " ", join(differing), " differ from rank 0's (",
                                          std::hex, sums[0], std::dec, ") (--check-consistency)"));
    }
  }

 private:
  std::unique_ptr<Codec> codec_;
  RingAllreduce allreduce_;
  int rank_;
  std::vector<float> pieces_;
};

// The whole test set through `model`, 1000 examples at a time; after_chunk runs after each.
Evaluation evaluate(Model& model, const Dataset& test, const std::function<void()>& after_chunk) {
  Evaluation total;
  for_each_chunk(test, 0, test.size, 1000, [&](const Batch& batch) {
    Evaluation part = model.evaluate(batch);
    total.loss_sum += part.loss_sum;
    total.correct += part.correct;
    total.count += part.count;
    after_chunk();
  });
  return total;
}

// This worker's share of the training set, epoch by epoch (its compute thread only).
class BatchFeed {
 public:
  BatchFeed(const Dataset& train, const TrainConfig& config, int rank)
      : sampler_(train.size, config.workers, rank, config.batch, config.seed), assembler_(train, config.batch) {}

  void start_epoch(std::int64_t epoch) { sampler_.start_epoch(static_cast<std::size_t>(epoch)); }
  // Batch i of the epoch; it points into the feed until the next call.
  Batch batch(std::int64_t i) { return assembler_.assemble(sampler_.batch_indices(static_cast<std::size_t>(i))); }

 private:
  ShardedSampler sampler_;
  BatchAssembler assembler_;
};

// The trainer's own messages among the workers, never the server ranks (its compute thread only):
// the epoch ends' sums, rank 0's words while it evaluates, the barrier before the last pruning.
class WorkerControl {
 public:
  WorkerControl(Transport& transport, int workers, Timeout timeout)
      : workers_(first_ranks(transport, workers)),
        codec_(make_codec("none")),
        allreduce_(workers_, 3, *codec_, AllreduceOptions{timeout, kAutoSegmentBytes}),
        timeout_(timeout) {}

  // The workers' transport (its rank r is worker r).
  Transport& workers() { return workers_; }

  // Sums `values` (at most 3) over the workers under `tag`; also a barrier.
  void sum(std::span<float> values, Tag tag) { allreduce_.run(values, tag); }

  // Every worker is here: a sum on the consistency channel, whose sequence 0 no check uses.
  void barrier() {
    float token[1] = {0};
    allreduce_.run(token, collective_tag(Channel::kConsistency, 0));
  }

  // Rank 0 tells every other worker `word` as epoch `epoch`'s message `message` (then counts it).
  void tell_workers(std::int64_t epoch, int& message, std::byte word) {
    const Tag tag = step_tag(control_tag(2 * epoch + 1), message++, 0);
    std::vector<Request> sends;
    for (int peer = 1; peer < workers_.size(); ++peer) {
      sends.push_back(workers_.send(peer, tag, std::span<const std::byte>(&word, 1), kEvaluationWait));
    }
    for (Request& send : sends) send.wait(timeout_);
  }

  // The other workers: wait until rank 0 says its evaluation is done. Each wait has the comm
  // timeout; rank 0 says it is still evaluating often enough (WorkerLoop::end_epoch).
  void wait_for_evaluation(std::int64_t epoch) {
    for (int message = 0;; ++message) {
      std::byte word{};
      workers_
          .recv(0, step_tag(control_tag(2 * epoch + 1), message, 0), std::span<std::byte>(&word, 1), kEvaluationWait)
          .wait(timeout_);
      if (word == kEvaluationDone) return;
      if (message == kLastEvaluationMessage) {
        throw CommError(concat(kEvaluationWait, ": rank 0 sent ", message + 1, " messages without finishing"));
      }
    }
  }

 private:
  RankSubsetTransport workers_;
  std::unique_ptr<Codec> codec_;
  RingAllreduce allreduce_;
  Timeout timeout_;
};

// --trace: a step's spans on the compute thread's trace (none installed: nothing recorded): forward,
// backward and one per layer's backward. The compute thread only.
class StepTrace {
 public:
  // Interns "backward <layer>" for each segment of `layout`.
  explicit StepTrace(const Layout& layout) : trace_(current_thread_trace()) {
    if (trace_ == nullptr) return;
    for (std::size_t s = 0; s < layout.segment_count(); ++s) {
      layer_names_.push_back(trace_->recorder().intern(concat("backward ", layout.segment(s).name)));
    }
  }

  void start_iteration(std::int64_t t) {
    if (trace_ != nullptr) trace_->set_iteration(t);
    layers_traced_ = 0;
  }

  // Layer `segment`'s backward in iteration t, which took `seconds` up to now; clipped so that the
  // layers' spans never overlap (the model's clock reads and this one differ by nanoseconds).
  void layer(std::size_t segment, double seconds, std::int64_t t) {
    if (trace_ == nullptr || !trace_->recording() || segment >= layer_names_.size()) return;
    const TraceClock::time_point now = TraceClock::now();
    TraceClock::time_point start = now - std::chrono::duration_cast<TraceClock::duration>(Seconds(seconds));
    if (layers_traced_ > 0 && start < last_layer_end_) start = last_layer_end_;
    if (layers_traced_ == 0) first_layer_start_ = start;
    TraceArgs args;
    args.iteration = t;
    args.layer = static_cast<std::int64_t>(segment);
    trace_->span(layer_names_[segment], kTraceCompute, start, now, args);
    last_layer_end_ = now;
    ++layers_traced_;
  }

  // The forward and backward spans of iteration t's step that ended at `end`, after data loading
  // ended at `data_end`: backward is the model's backward time before `end` (or from the first
  // layer's span, if earlier), forward what came before it (including a method's forward hooks).
  void step(TraceClock::time_point data_end, TraceClock::time_point end, const StepResult& step, std::int64_t t) {
    if (trace_ == nullptr || !trace_->recording()) return;
    TraceClock::time_point backward_start =
        end - std::chrono::duration_cast<TraceClock::duration>(Seconds(step.backward_seconds));
    if (layers_traced_ > 0 && first_layer_start_ < backward_start) backward_start = first_layer_start_;
    if (backward_start < data_end) backward_start = data_end;
    TraceArgs args;
    args.iteration = t;
    trace_->span("forward", kTraceCompute, data_end, backward_start, args);
    trace_->span("backward", kTraceCompute, backward_start, end, args);
  }

 private:
  ThreadTrace* const trace_;
  std::vector<const char*> layer_names_;  // by segment
  // Where the current iteration's layer spans are.
  std::size_t layers_traced_ = 0;
  TraceClock::time_point first_layer_start_{};
  TraceClock::time_point last_layer_end_{};
};

// The method's allreduces that finished since the last reading: their CPU time and bytes
// (collective/allreduce_meter.h, the meter installed on this thread, if any), on whichever thread
// ran them.
class AllreduceCostReader {
 public:
  AllreduceCostReader() : meter_(current_allreduce_meter()) {}

  void record(IterationTimes& times) {
    if (meter_ == nullptr) return;
    const std::uint64_t cpu = meter_->cpu_nanoseconds.load(std::memory_order_relaxed);
    const std::uint64_t bytes = meter_->bytes.load(std::memory_order_relaxed);
    times.comm_cpu = 1e-9 * static_cast<double>(cpu - read_cpu_nanoseconds_);
    times.comm_bytes = static_cast<double>(bytes - read_bytes_);
    read_cpu_nanoseconds_ = cpu;
    read_bytes_ = bytes;
  }

 private:
  const AllreduceMeter* const meter_;
  std::uint64_t read_cpu_nanoseconds_ = 0, read_bytes_ = 0;  // its totals at the last reading
};

// What one worker owns for the run (built by run_worker).
struct WorkerReplica {
  int rank;
  Model& model;
  Transport& transport;  // the run's, or its fault-injecting decorator
  TrainingMethod& method;
  FaultInjectingTransport* mid_operation_fault;  // --inject-fault at=allreduce|push on this worker
};

// One worker's epochs.
class WorkerLoop {
 public:
  WorkerLoop(const WorkerRun& shared, const WorkerReplica& own, const WorkerSinks& sinks)
      : shared_(shared),
        own_(own),
        sinks_(sinks),
        stop_slot_(shared.faults.rank_is_process ? 0 : own.rank),
        batches_(shared.data.train, shared.run.config, own.rank),
        control_(own.transport, shared.run.config.workers, shared.run.config.method.common.timeout),
        progress_(sinks.leader != nullptr && shared.run.config.progress, shared.run.config.method.spec),
        nonfinite_(own.rank, own.model.layout(), shared.run.config.reliability.on_nonfinite == "skip",
                   sinks.record.nonfinite_skipped),
        step_trace_(own.model.layout()) {
    static const SegmentReadyFn no_reports;
    const SegmentReadyFn* ready = own.method.segment_ready();
    method_ready_ = ready != nullptr ? ready : &no_reports;
    on_ready_ = [this](std::size_t segment, double seconds) {
      step_trace_.layer(segment, seconds, t_);
      if (nonfinite_.check(segment) && *method_ready_) (*method_ready_)(segment, seconds);
    };
    if (config().reliability.check_consistency > 0) {
      consistency_.emplace(control_.workers(), config().method.common.timeout);
    }
  }

  // The iteration the compute thread is in (for failure messages).
  std::int64_t iteration() const { return t_; }

  void run() {
    const RunPlan& plan = shared_.run.plan;
    if (shared_.run.resume_from) resume();
    bool stopped = false;
    for (std::int64_t epoch = plan.epoch_of(t_); epoch < plan.epochs && !stopped; ++epoch) {
      const std::int64_t epoch_start = plan.epoch_start(epoch);
      const std::int64_t count = std::min(plan.iterations_per_epoch, plan.total_iterations - epoch_start);
      batches_.start_epoch(epoch);
      progress_.start_epoch(epoch, plan.epochs, count, plan.iterations_per_epoch);
      epoch_clock_.restart();
      if (t_ == epoch_start) sums_ = EpochSums{};  // else resumed inside this epoch with its sums
      for (std::int64_t i = t_ - epoch_start; i < count; ++i, ++t_) {
        if (shared_.stop.stop_before(stop_slot_, t_)) {
          stopped = true;
          break;
        }
        iterate(i);
        if (sinks_.leader != nullptr) {
          progress_.update(i + 1, sums_.loss / std::max(1.0, sums_.iterations),
                           samples_per_iteration() * static_cast<double>(i + 1) / epoch_clock_.seconds());
        }
      }
      if (t_ == plan.total_iterations) {
        IterationTimes drain;
        own_.method.finish(drain);  // apply what is still in flight before the final evaluation
      }
      train_seconds_ += epoch_clock_.seconds();
      if (!stopped) end_epoch(epoch);  // an epoch cut short has no record
    }
    shared_.stop.publish(stop_slot_, t_);
    if (stopped) stop_early();
    checkpoints_.finish();  // the last checkpoint is on disk before the run reports success
    if (config().reliability.checkpoint_every > 0 && !(stopped && shared_.faults.rank_is_process)) {
      // Every worker's writes are done (a barrier on the consistency channel, whose sequence 0 no
      // check uses): now the newest sets are complete and pruning leaves exactly the 2 newest.
      control_.barrier();
      if (sinks_.leader != nullptr) prune_run_checkpoints(shared_.run);
    }
    finish_record();
  }

  // Where each rank is a process: another rank stopped early, by `signal`, and told this one in a
  // wait of iteration t_; the iterations before are what it completed.
  void stopped_by_peer(int signal) {
    shared_.stop.publish(stop_slot_, t_);
    progress_.interrupt();
    sinks_.record.stop_signal = signal;
    finish_record();
  }

 private:
  double samples_per_iteration() const { return static_cast<double>(config().workers * config().batch); }

  void resume() {
    const RestoredWorker restored = restore_worker(shared_.run, own_.rank, own_.model, own_.method);
    t_ = restored.next;
    sums_ = restored.sums;
    history_ = restored.history;
    sinks_.record.nonfinite_skipped = history_.nonfinite_skipped;
    sinks_.record.loss_sum = history_.loss_sum;
    train_seconds_ = shared_.run.resumed_history.train_seconds;
    if (sinks_.leader != nullptr) {
      sinks_.leader->epochs = shared_.run.resumed_epochs;
      sinks_.leader->consistency_checks = shared_.run.resumed_history.consistency_checks;
    }
    const RunPlan& plan = shared_.run.plan;
    if ((t_ - plan.shift) % plan.iterations_per_epoch == 0 && t_ > plan.shift) {
      // The checkpoint after an epoch's last iteration precedes that epoch's end: end it now, as
      // the run not interrupted did next (its record, its barrier, its evaluation of these weights).
      const std::int64_t ended = plan.epoch_of(t_) - 1;
      progress_.start_epoch(ended, plan.epochs, plan.iterations_per_epoch, plan.iterations_per_epoch);
      end_epoch(ended);
    }
  }

  // After the agreed stop: among threads apply what is in flight, as at the run's end (every
  // worker completed the same iterations); where each rank is a process, abandon it and tell the
  // other ranks, which may be waiting for this one.
  void stop_early() {
    progress_.interrupt();
    sinks_.record.stop_signal = shared_.stop.signal();
    if (shared_.faults.rank_is_process) {
      own_.transport.report_failure(interruption_notice(shared_.stop.signal()));
      return;
    }
    IterationTimes drain;
    own_.method.finish(drain);
  }

  void finish_record() {
    sinks_.record.completed = t_;
    sinks_.record.bytes_sent = history_.bytes_sent + own_.transport.bytes_sent();
    if (sinks_.leader != nullptr) sinks_.leader->train_seconds = train_seconds_;
    if (config().keep_parameters) {
      const std::span<const float> parameters = own_.model.parameters();
      sinks_.record.final_parameters.assign(parameters.begin(), parameters.end());
    }
  }

  // Iteration t_, the i-th of its epoch.
  void iterate(std::int64_t i) {
    const FaultInjection& fault = config().reliability.fault;
    IterationTimes& times = sinks_.record.times[static_cast<std::size_t>(t_)];
    step_trace_.start_iteration(t_);
    if (fault.active() && fault.slows_link() && fault.rank == own_.rank && fault.iteration == t_) {
      trace_instant("link slowed", kTraceRun, iteration_args());
      shared_.faults.slow_link(own_.rank, fault.factor);
    } else if (fault.active() && fault.at_iteration_start() && fault.rank == own_.rank && fault.iteration == t_) {
      trace_instant("injected fault", kTraceRun, iteration_args());
      inject_fault(fault, shared_.faults);
    }
    if (own_.mid_operation_fault != nullptr && fault.iteration == t_) {
      // at=allreduce|push: count the operations of iteration N on, where the method's tags tell
      // them (else any operation after N started, possibly an earlier one still in flight).
      own_.mid_operation_fault->arm(own_.method.first_message_sequence(t_).value_or(0));
    }
    Stopwatch iteration;
    const std::span<float> gradients = own_.method.begin_iteration(t_, times);
    nonfinite_.start(t_, gradients);
    TracedStopwatch loading("data");
    const Batch batch = batches_.batch(i);
    times.data = loading.stop();
    const TraceClock::time_point data_end = TraceClock::now();
    const StepResult step = own_.model.forward_backward(batch, gradients, on_ready_);
    step_trace_.step(data_end, TraceClock::now(), step, t_);
    times.forward = step.forward_seconds;
    times.backward = step.backward_seconds;
    times.loss = step.loss;
    nonfinite_.finish(step.loss);  // before end_iteration sends what the model did not report
    if (t_ >= shared_.run.plan.loss_from) sinks_.record.loss_sum += step.loss;
    own_.method.end_iteration(t_, times);
    allreduce_cost_.record(times);
    const ReliabilityOptions& reliability = config().reliability;
    if (consistency_ && (t_ + 1) % reliability.check_consistency == 0) {
      const TraceSpan span("consistency check", kTraceRun, iteration_args());
      consistency_->run(own_.method.replica_checksum(own_.model), t_,
                        static_cast<std::uint64_t>((t_ + 1) / reliability.check_consistency));
      if (sinks_.leader != nullptr) ++sinks_.leader->consistency_checks;
    }
    const EpochSums sums{sums_.loss + step.loss, sums_.correct + static_cast<double>(step.correct),
                         sums_.iterations + 1};
    if (reliability.checkpoint_every > 0 && (t_ + 1) % reliability.checkpoint_every == 0 &&
        t_ + 1 < shared_.run.plan.total_iterations) {
      TracedStopwatch writing("checkpoint", kTraceRun, iteration_args());
      save_checkpoint(sums);
      times.checkpoint = writing.stop();
    }
    times.iteration = iteration.seconds();
    sums_ = sums;
    if (RecoveryLog* recovery = config().recovery) recovery->note_iteration_done(own_.rank, t_ + 1);
  }

  TraceArgs iteration_args() const {
    TraceArgs args;
    args.iteration = t_;
    return args;
  }

  // This worker's part of the checkpoint after iteration t_ (and rank 0 the shared part), written
  // in the background.
  void save_checkpoint(const EpochSums& sums) {
    const std::string& dir = config().reliability.checkpoint_dir;
    const FaultInjection& fault = config().reliability.fault;
    const bool fault_now = fault.active() && fault.during_checkpoint() && fault.rank == own_.rank && fault.iteration == t_;
    if (MemoryCommits* commits = shared_.run.memory_commits) {
      // In memory: the part is handed over whole, or (a fault mid-commit) not at all; the method
      // may complete it once the communication in flight at this boundary ended on its own.
      if (fault_now) {
        trace_instant("injected fault", kTraceRun, iteration_args());
        inject_fault(fault, shared_.faults);
      }
      if (sinks_.leader != nullptr) {
        if (RecoveryLog* recovery = config().recovery) recovery->note_commit(t_ + 1);
        const RunHistory history{sinks_.leader->consistency_checks, train_seconds_ + epoch_clock_.seconds()};
        commits->put(t_ + 1, "shared", shared_checkpoint(shared_.run, t_, sinks_.leader->epochs, history));
      }
      CheckpointWriter part = worker_checkpoint(shared_.run, t_, own_.model, own_.method, sums, nullptr,
                                                /*method_state=*/false);
      own_.method.save_state_when_ready(
          std::move(part), [this, commits, iteration = t_ + 1, skipped = sinks_.record.nonfinite_skipped,
                            loss_sum = sinks_.record.loss_sum](CheckpointWriter ready, std::optional<std::uint64_t> sent) {
            add_history(ready, WorkerHistory{history_.bytes_sent + sent.value_or(own_.transport.bytes_sent()), skipped,
                                             loss_sum});
            commits->put(iteration, worker_part(own_.rank), std::move(ready));
          });
      return;
    }
    std::string torchscript;  // rank 0's model, beside the set
    CheckpointWriter part = worker_checkpoint(shared_.run, t_, own_.model, own_.method, sums,
                                              sinks_.leader != nullptr ? &torchscript : nullptr);
    add_history(part, WorkerHistory{history_.bytes_sent + own_.transport.bytes_sent(), sinks_.record.nonfinite_skipped,
                                    sinks_.record.loss_sum});
    const std::filesystem::path path = checkpoint_path(dir, t_ + 1, worker_part(own_.rank));
    if (fault_now) {
      // --inject-fault at=checkpoint: die halfway through the write. The atomic write would leave
      // exactly this: a partial temporary file, never a torn file under the final name.
      const std::vector<std::byte> bytes = part.serialize();
      std::ofstream torn(path.parent_path() / concat(".", path.filename().string(), ".tmp.injected"), std::ios::binary);
      torn.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() / 2));
      torn.close();
      trace_instant("injected fault", kTraceRun, iteration_args());
      inject_fault(fault, shared_.faults);
    }
    BackgroundCheckpointWriter::Files files;
    files.emplace_back(path, std::move(part));
    if (sinks_.leader == nullptr) {
      checkpoints_.submit(std::move(files), {});
      return;
    }
    if (RecoveryLog* recovery = config().recovery) recovery->note_commit(t_ + 1);
    const RunHistory history{sinks_.leader->consistency_checks, train_seconds_ + epoch_clock_.seconds()};
    files.emplace_back(checkpoint_path(dir, t_ + 1, "shared"),
                       shared_checkpoint(shared_.run, t_, sinks_.leader->epochs, history));
    checkpoints_.submit(std::move(files), [this, model_path = checkpoint_model_path(dir, t_ + 1),
                                           torchscript = std::move(torchscript)] {
      if (!torchscript.empty()) write_file_atomically(model_path, std::string_view(torchscript), "model");
      prune_run_checkpoints(shared_.run);
    });
  }

  // Epoch end: mean training loss over all workers (this reduction is also a barrier), then rank 0
  // evaluates while the others wait for its word that it is done, so evaluation never pollutes
  // timings. Evaluating a large model on one core can take longer than the comm timeout: between
  // test chunks, whenever a quarter of the timeout has passed since its last word, rank 0 tells the
  // others it is still evaluating, so a long evaluation never looks like a dead peer (a single
  // 1000-example chunk must still take less than the timeout).
  // (Counts up to 2^24 are exact in fp32: an epoch of this run has at most that many examples.)
  void end_epoch(std::int64_t epoch) {
    const TraceSpan span("epoch end", kTraceRun, iteration_args());  // the loss reduction and evaluation
    // Every worker's iterations of the epoch (count each, unless the epoch began in another world).
    float reduced[3] = {static_cast<float>(sums_.loss), static_cast<float>(sums_.iterations),
                        static_cast<float>(sums_.correct)};
    control_.sum(reduced, control_tag(2 * epoch));
    if (sinks_.leader == nullptr) {
      control_.wait_for_evaluation(epoch);
      return;
    }
    int message = 0;
    EpochRecord record;
    record.epoch = epoch + 1;
    record.iterations = t_;
    record.train_loss = reduced[1] > 0 ? reduced[0] / reduced[1] : 0;
    record.train_accuracy = reduced[1] > 0 ? reduced[2] / (reduced[1] * static_cast<double>(config().batch)) : 0;
    record.elapsed_seconds = train_seconds_;
    if (!config().has_accuracy) record.train_accuracy = -1;
    std::string result = concat("train loss ", std::fixed, std::setprecision(4), record.train_loss);
    if (config().has_accuracy) {
      result += concat(", train accuracy ", std::fixed, std::setprecision(2), record.train_accuracy * 100, "%");
    }
    if (config().evaluate) {
      Clock::time_point last_word = Clock::now();
      const auto word_interval = config().method.common.timeout / 4;
      const Evaluation evaluation = evaluate(own_.model, shared_.data.test, [&] {
        if (Clock::now() - last_word < word_interval || message == kLastEvaluationMessage) return;
        control_.tell_workers(epoch, message, kStillEvaluating);
        last_word = Clock::now();
      });
      record.test_accuracy = evaluation.count && config().has_accuracy ? double(evaluation.correct) / evaluation.count
                                                                      : (config().has_accuracy ? 0 : -1);
      record.test_loss = evaluation.count ? evaluation.loss_sum / evaluation.count : 0;
      if (config().has_accuracy) {
        result += concat(", test accuracy ", std::fixed, std::setprecision(2), record.test_accuracy * 100, "%");
      } else {
        result += concat(", test loss ", std::fixed, std::setprecision(4), record.test_loss);
      }
    }
    progress_.end_epoch(result);
    sinks_.leader->epochs.push_back(record);
    if (sinks_.metrics != nullptr) sinks_.metrics->add_epoch(record);
    control_.tell_workers(epoch, message, kEvaluationDone);
  }

  const TrainConfig& config() const { return shared_.run.config; }

  // What the run gives every worker of this process, what this worker owns, where its results go.
  const WorkerRun shared_;
  const WorkerReplica own_;
  const WorkerSinks sinks_;
  const int stop_slot_;  // its slot in shared_.stop
  // Its parts, built for the run (its compute thread only).
  BatchFeed batches_;
  WorkerControl control_;
  ProgressReporter progress_;
  NonfiniteGuard nonfinite_;
  std::optional<ConsistencyCheck> consistency_;  // --check-consistency
  const SegmentReadyFn* method_ready_ = nullptr;  // the method's, or one that does nothing
  SegmentReadyFn on_ready_;                       // what the model calls as a segment's gradient is final
  BackgroundCheckpointWriter checkpoints_;
  // Where it is.
  std::int64_t t_ = 0;
  EpochSums sums_;
  WorkerHistory history_;  // what the checkpoint resumed from carried (zeros if none)
  Stopwatch epoch_clock_;
  double train_seconds_ = 0;
  // What it measures besides the model's times.
  StepTrace step_trace_;
  AllreduceCostReader allreduce_cost_;  // the method's allreduces' (run_worker's meter), if installed
};

}  // namespace

std::size_t trace_events_per_thread(const TraceWindow& window, std::int64_t total_iterations, std::size_t layers) {
  constexpr std::size_t kMaxEvents = 2'000'000;  // ~100 MB per thread
  const std::int64_t first = std::min(window.first, total_iterations);
  const std::int64_t end = std::min(window.end, total_iterations);
  // Per iteration: data, forward, backward, a span per layer, waits, updates, compensation, a
  // bucket, an allreduce and an arrow's two ends per layer, instants; the end's drain on top.
  const auto iterations = static_cast<std::size_t>(std::max<std::int64_t>(0, end - first)) + 2;
  return std::min(kMaxEvents, iterations * (4 * layers + 16));
}

void run_worker(const WorkerRun& shared, int rank, Model& model, Transport& run_transport, const WorkerSinks& sinks) {
  const RunContext& run = shared.run;
  const TrainConfig& config = run.config;
  sinks.record.times.assign(static_cast<std::size_t>(run.plan.total_iterations), IterationTimes{});
  // --inject-fault at=allreduce|push: the faulty worker's sends go through a decorator that fails
  // on the targeted send of iteration N (armed when iteration N starts). It outlives the method.
  const FaultInjection& fault = config.reliability.fault;
  std::optional<FaultInjectingTransport> faulty;
  if (fault.active() && fault.in_operation() && fault.rank == rank) {
    const bool push = fault.point == FaultInjection::Point::kPush;
    // Allreduce: fire on the second message (the first went out). Push: on the send to the second
    // shard (the first shard has the push), or with one server on the push's only send.
    const int fire_on = push && run.servers < 2 ? 1 : 2;
    faulty.emplace(run_transport, fault.point, fire_on, [&] {
      trace_instant("injected fault", kTraceRun);
      inject_fault(fault, shared.faults);
    });
  }
  Transport& transport = faulty ? static_cast<Transport&>(*faulty) : run_transport;
  // --trace: this thread's track, installed before the method is built so that its comm thread and
  // allreduces join the trace.
  ThreadTrace* trace = nullptr;
  if (const TraceTarget& target = config.trace; target.recorder != nullptr) {
    trace = &target.recorder->add_thread(target.first_process + rank, concat(target.label, "worker ", rank), "compute",
                                         trace_events_per_thread(target.recorder->window(), run.plan.total_iterations,
                                                                 model.layout().segment_count()));
  }
  const ScopedThreadTrace installed(trace);
  // The method's gradient allreduces report their CPU time and bytes here (per iteration: comm_cpu).
  AllreduceMeter allreduce_meter;
  const ScopedAllreduceMeter metered(&allreduce_meter);
  std::function<void(const std::string&)> announce;
  if (sinks.leader != nullptr) announce = [](const std::string& line) { std::cerr << "pipesgd: " << line << std::endl; };
  std::unique_ptr<TrainingMethod> method = make_method(config.method, transport, model, run.plan.warmup_iterations,
                                                       config.network, schedule_length(run.plan), std::move(announce));
  // Once the method is built (its usage errors come first): a run too short for its steady state.
  if (sinks.leader != nullptr && config.warn_short_run && run.plan.unreached_phase) {
    std::cerr << short_run_warning(*run.plan.unreached_phase, run.plan.total_iterations) << std::flush;
  }
  // Workers outnumber cores here, unlike on a cluster where a node's NIC never waits for its CPU:
  // communication threads (created above) must not queue behind compute (core/thread_priority.h).
  if (config.deprioritize_compute && transport.waits_sleep() && !realtime_priority_permitted()) {
    lower_compute_thread_priority();
  }
  WorkerLoop loop(shared, WorkerReplica{rank, model, transport, *method, faulty ? &*faulty : nullptr}, sinks);
  try {
    loop.run();
    if (sinks.leader != nullptr) sinks.leader->method_report = method->report();
  } catch (const PeerFailedError& error) {
    const std::optional<int> signal = peer_interruption(error);
    if (!shared.faults.rank_is_process || !signal) {
      transport.report_failure(error.what());
      throw;
    }
    loop.stopped_by_peer(*signal);
    if (sinks.leader != nullptr) sinks.leader->method_report = method->report();
  } catch (const CommTimeoutError& error) {
    // The one line names the peer, the operation and the tag; add where this worker was.
    transport.report_failure(error.what());
    throw CommTimeoutError(concat(error.what(), " (worker ", rank, " at iteration ", loop.iteration(), ")"), error.peer());
  } catch (const std::exception& error) {
    // Tell the other ranks before the method (and its comm thread) unwinds, so they stop waiting now.
    transport.report_failure(error.what());
    throw;
  }
}


}  // namespace pipesgd
