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
#include "pipesgd/train/progress.h"
#include "pipesgd/train/short_run.h"

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

// One worker's epochs.
class WorkerLoop {
 public:
  WorkerLoop(const RunContext& run, int rank, Model& model, Transport& transport, TrainingMethod& method,
             const DataSplits& data, const FaultControl& faults, FaultInjectingTransport* mid_operation_fault,
             EarlyStop& stop, WorkerRecord& record, LeaderRecord* leader, MetricsStream* metrics)
      : run_(run),
        config_(run.config),
        rank_(rank),
        model_(model),
        transport_(transport),
        method_(method),
        data_(data),
        faults_(faults),
        mid_operation_fault_(mid_operation_fault),
        stop_(stop),
        stop_slot_(faults.rank_is_process ? 0 : rank),
        record_(record),
        leader_(leader),
        metrics_(metrics),
        sampler_(data.train.size, config_.workers, rank, config_.batch, config_.seed),
        assembler_(data.train, config_.batch),
        worker_ranks_(first_ranks(transport, config_.workers)),  // the workers, never the server ranks
        control_codec_(make_codec("none")),
        control_(worker_ranks_, 3, *control_codec_, AllreduceOptions{config_.method.common.timeout, kAutoSegmentBytes}),
        progress_(leader != nullptr && config_.progress, config_.method.spec),
        nonfinite_(rank, model.layout(), config_.reliability.on_nonfinite == "skip", record.nonfinite_skipped) {
    static const SegmentReadyFn no_reports;
    const SegmentReadyFn* ready = method.segment_ready();
    method_ready_ = ready != nullptr ? ready : &no_reports;
    on_ready_ = [this](std::size_t segment, double seconds) {
      trace_layer(segment, seconds);
      if (nonfinite_.check(segment) && *method_ready_) (*method_ready_)(segment, seconds);
    };
    meter_ = current_allreduce_meter();
    if (ThreadTrace* trace = current_thread_trace()) {
      trace_ = trace;
      const Layout& layout = model.layout();
      for (std::size_t s = 0; s < layout.segment_count(); ++s) {
        layer_names_.push_back(trace->recorder().intern(concat("backward ", layout.segment(s).name)));
      }
    }
    if (config_.reliability.check_consistency > 0) consistency_.emplace(worker_ranks_, config_.method.common.timeout);
  }

  // The iteration the compute thread is in (for failure messages).
  std::int64_t iteration() const { return t_; }

  void run() {
    const RunPlan& plan = run_.plan;
    if (run_.resume_from) resume();
    bool stopped = false;
    for (std::int64_t epoch = t_ / plan.iterations_per_epoch; epoch < plan.epochs && !stopped; ++epoch) {
      const std::int64_t epoch_start = epoch * plan.iterations_per_epoch;
      const std::int64_t count = std::min(plan.iterations_per_epoch, plan.total_iterations - epoch_start);
      sampler_.start_epoch(static_cast<std::size_t>(epoch));
      progress_.start_epoch(epoch, plan.epochs, count, plan.iterations_per_epoch);
      epoch_clock_.restart();
      if (t_ == epoch_start) sums_ = EpochSums{};  // else resumed inside this epoch with its sums
      for (std::int64_t i = t_ - epoch_start; i < count; ++i, ++t_) {
        if (stop_.stop_before(stop_slot_, t_)) {
          stopped = true;
          break;
        }
        iterate(i);
        if (leader_ != nullptr) {
          progress_.update(i + 1, sums_.loss / static_cast<double>(i + 1),
                           samples_per_iteration() * static_cast<double>(i + 1) / epoch_clock_.seconds());
        }
      }
      if (t_ == plan.total_iterations) {
        IterationTimes drain;
        method_.finish(drain);  // apply what is still in flight before the final evaluation
      }
      train_seconds_ += epoch_clock_.seconds();
      if (!stopped) end_epoch(epoch, count);  // an epoch cut short has no record
    }
    stop_.publish(stop_slot_, t_);
    if (stopped) stop_early();
    checkpoints_.finish();  // the last checkpoint is on disk before the run reports success
    if (config_.reliability.checkpoint_every > 0 && !(stopped && faults_.rank_is_process)) {
      // Every worker's writes are done (a barrier on the consistency channel, whose sequence 0 no
      // check uses): now the newest sets are complete and pruning leaves exactly the 2 newest.
      float token[1] = {0};
      control_.run(token, collective_tag(Channel::kConsistency, 0));
      if (leader_ != nullptr) prune_run_checkpoints(run_);
    }
    finish_record();
  }

  // Where each rank is a process: another rank stopped early, by `signal`, and told this one in a
  // wait of iteration t_; the iterations before are what it completed.
  void stopped_by_peer(int signal) {
    stop_.publish(stop_slot_, t_);
    progress_.interrupt();
    record_.stop_signal = signal;
    finish_record();
  }

 private:
  double samples_per_iteration() const { return static_cast<double>(config_.workers * config_.batch); }

  void resume() {
    const RestoredWorker restored = restore_worker(run_, rank_, model_, method_);
    t_ = restored.next;
    sums_ = restored.sums;
    history_ = restored.history;
    record_.nonfinite_skipped = history_.nonfinite_skipped;
    record_.loss_sum = history_.loss_sum;
    train_seconds_ = run_.resumed_history.train_seconds;
    if (leader_ != nullptr) {
      leader_->epochs = run_.resumed_epochs;
      leader_->consistency_checks = run_.resumed_history.consistency_checks;
    }
    const RunPlan& plan = run_.plan;
    if (t_ % plan.iterations_per_epoch == 0 && t_ > 0) {
      // The checkpoint after an epoch's last iteration precedes that epoch's end: end it now, as
      // the run not interrupted did next (its record, its barrier, its evaluation of these weights).
      const std::int64_t ended = t_ / plan.iterations_per_epoch - 1;
      progress_.start_epoch(ended, plan.epochs, plan.iterations_per_epoch, plan.iterations_per_epoch);
      end_epoch(ended, plan.iterations_per_epoch);
    }
  }

  // After the agreed stop: among threads apply what is in flight, as at the run's end (every
  // worker completed the same iterations); where each rank is a process, abandon it and tell the
  // other ranks, which may be waiting for this one.
  void stop_early() {
    progress_.interrupt();
    record_.stop_signal = stop_.signal();
    if (faults_.rank_is_process) {
      transport_.report_failure(interruption_notice(stop_.signal()));
      return;
    }
    IterationTimes drain;
    method_.finish(drain);
  }

  void finish_record() {
    record_.completed = t_;
    record_.bytes_sent = history_.bytes_sent + transport_.bytes_sent();
    if (leader_ != nullptr) leader_->train_seconds = train_seconds_;
    if (config_.keep_parameters) {
      const std::span<const float> parameters = model_.parameters();
      record_.final_parameters.assign(parameters.begin(), parameters.end());
    }
  }

  // --trace: layer `segment`'s backward, which took `seconds` up to now; clipped so that the layers'
  // spans never overlap (the model's clock reads and this one differ by nanoseconds).
  void trace_layer(std::size_t segment, double seconds) {
    if (trace_ == nullptr || !trace_->recording() || segment >= layer_names_.size()) return;
    const TraceClock::time_point now = TraceClock::now();
    TraceClock::time_point start = now - std::chrono::duration_cast<TraceClock::duration>(Seconds(seconds));
    if (layers_traced_ > 0 && start < last_layer_end_) start = last_layer_end_;
    if (layers_traced_ == 0) first_layer_start_ = start;
    TraceArgs args;
    args.iteration = t_;
    args.layer = static_cast<std::int64_t>(segment);
    trace_->span(layer_names_[segment], kTraceCompute, start, now, args);
    last_layer_end_ = now;
    ++layers_traced_;
  }

  // --trace: the forward and backward spans of a step that ended at `end`, after data loading ended
  // at `data_end`: backward is the model's backward time before `end` (or from the first layer's
  // span, if earlier), forward what came before it (including a method's forward hooks).
  void trace_step(TraceClock::time_point data_end, TraceClock::time_point end, const StepResult& step) {
    if (trace_ == nullptr || !trace_->recording()) return;
    TraceClock::time_point backward_start =
        end - std::chrono::duration_cast<TraceClock::duration>(Seconds(step.backward_seconds));
    if (layers_traced_ > 0 && first_layer_start_ < backward_start) backward_start = first_layer_start_;
    if (backward_start < data_end) backward_start = data_end;
    TraceArgs args;
    args.iteration = t_;
    trace_->span("forward", kTraceCompute, data_end, backward_start, args);
    trace_->span("backward", kTraceCompute, backward_start, end, args);
  }

  // Iteration t_, the i-th of its epoch.
  void iterate(std::int64_t i) {
    const FaultInjection& fault = config_.reliability.fault;
    IterationTimes& times = record_.times[static_cast<std::size_t>(t_)];
    if (trace_ != nullptr) trace_->set_iteration(t_);
    layers_traced_ = 0;
    if (fault.active() && fault.at_iteration_start() && fault.rank == rank_ && fault.iteration == t_) {
      trace_instant("injected fault", kTraceRun, iteration_args());
      inject_fault(fault, faults_);
    }
    if (mid_operation_fault_ != nullptr && fault.iteration == t_) {
      // at=allreduce|push: count the operations of iteration N on, where the method's tags tell
      // them (else any operation after N started, possibly an earlier one still in flight).
      mid_operation_fault_->arm(method_.first_message_sequence(t_).value_or(0));
    }
    Stopwatch iteration;
    const std::span<float> gradients = method_.begin_iteration(t_, times);
    nonfinite_.start(t_, gradients);
    TracedStopwatch loading("data");
    const Batch batch = assembler_.assemble(sampler_.batch_indices(static_cast<std::size_t>(i)));
    times.data = loading.stop();
    const TraceClock::time_point data_end = TraceClock::now();
    const StepResult step = model_.forward_backward(batch, gradients, on_ready_);
    trace_step(data_end, TraceClock::now(), step);
    times.forward = step.forward_seconds;
    times.backward = step.backward_seconds;
    times.loss = step.loss;
    nonfinite_.finish(step.loss);  // before end_iteration sends what the model did not report
    if (t_ >= run_.plan.loss_from) record_.loss_sum += step.loss;
    method_.end_iteration(t_, times);
    record_allreduce_cost(times);
    const ReliabilityOptions& reliability = config_.reliability;
    if (consistency_ && (t_ + 1) % reliability.check_consistency == 0) {
      const TraceSpan span("consistency check", kTraceRun, iteration_args());
      consistency_->run(method_.replica_checksum(model_), t_,
                        static_cast<std::uint64_t>((t_ + 1) / reliability.check_consistency));
      if (leader_ != nullptr) ++leader_->consistency_checks;
    }
    const EpochSums sums{sums_.loss + step.loss, sums_.correct + static_cast<double>(step.correct)};
    if (reliability.checkpoint_every > 0 && (t_ + 1) % reliability.checkpoint_every == 0 &&
        t_ + 1 < run_.plan.total_iterations) {
      TracedStopwatch writing("checkpoint", kTraceRun, iteration_args());
      save_checkpoint(sums);
      times.checkpoint = writing.stop();
    }
    times.iteration = iteration.seconds();
    sums_ = sums;
  }

  // The method's allreduces that finished since the last iteration's: their CPU time and bytes
  // (collective/allreduce_meter.h), on whichever thread ran them.
  void record_allreduce_cost(IterationTimes& times) {
    if (meter_ == nullptr) return;
    const std::uint64_t cpu = meter_->cpu_nanoseconds.load(std::memory_order_relaxed);
    const std::uint64_t bytes = meter_->bytes.load(std::memory_order_relaxed);
    times.comm_cpu = 1e-9 * static_cast<double>(cpu - metered_cpu_nanoseconds_);
    times.comm_bytes = static_cast<double>(bytes - metered_bytes_);
    metered_cpu_nanoseconds_ = cpu;
    metered_bytes_ = bytes;
  }

  TraceArgs iteration_args() const {
    TraceArgs args;
    args.iteration = t_;
    return args;
  }

  // This worker's part of the checkpoint after iteration t_ (and rank 0 the shared part), written
  // in the background.
  void save_checkpoint(const EpochSums& sums) {
    const std::string& dir = config_.reliability.checkpoint_dir;
    std::string torchscript;  // rank 0's model, beside the set
    CheckpointWriter part = worker_checkpoint(run_, t_, model_, method_, sums, leader_ != nullptr ? &torchscript : nullptr);
    add_history(part, WorkerHistory{history_.bytes_sent + transport_.bytes_sent(), record_.nonfinite_skipped,
                                    record_.loss_sum});
    const std::filesystem::path path = checkpoint_path(dir, t_ + 1, worker_part(rank_));
    const FaultInjection& fault = config_.reliability.fault;
    if (fault.active() && fault.during_checkpoint() && fault.rank == rank_ && fault.iteration == t_) {
      // --inject-fault at=checkpoint: die halfway through the write. The atomic write would leave
      // exactly this: a partial temporary file, never a torn file under the final name.
      const std::vector<std::byte> bytes = part.serialize();
      std::ofstream torn(path.parent_path() / concat(".", path.filename().string(), ".tmp.injected"), std::ios::binary);
      torn.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() / 2));
      torn.close();
      trace_instant("injected fault", kTraceRun, iteration_args());
      inject_fault(fault, faults_);
    }
    BackgroundCheckpointWriter::Files files;
    files.emplace_back(path, std::move(part));
    if (leader_ == nullptr) {
      checkpoints_.submit(std::move(files), {});
      return;
    }
    const RunHistory history{leader_->consistency_checks, train_seconds_ + epoch_clock_.seconds()};
    files.emplace_back(checkpoint_path(dir, t_ + 1, "shared"), shared_checkpoint(run_, t_, leader_->epochs, history));
    checkpoints_.submit(std::move(files), [this, model_path = checkpoint_model_path(dir, t_ + 1),
                                           torchscript = std::move(torchscript)] {
      if (!torchscript.empty()) write_file_atomically(model_path, std::string_view(torchscript), "model");
      prune_run_checkpoints(run_);
    });
  }

  // Rank 0 tells every other worker `word` as epoch `epoch`'s message `message` (then counts it).
  void tell_workers(std::int64_t epoch, int& message, std::byte word) {
    const Tag tag = step_tag(control_tag(2 * epoch + 1), message++, 0);
    std::vector<Request> sends;
    for (int peer = 1; peer < worker_ranks_.size(); ++peer) {
      sends.push_back(worker_ranks_.send(peer, tag, std::span<const std::byte>(&word, 1), kEvaluationWait));
    }
    for (Request& send : sends) send.wait(config_.method.common.timeout);
  }

  // The other workers: wait until rank 0 says its evaluation is done. Each wait has the comm
  // timeout; rank 0 says it is still evaluating often enough (see end_epoch).
  void wait_for_evaluation(std::int64_t epoch) {
    for (int message = 0;; ++message) {
      std::byte word{};
      worker_ranks_.recv(0, step_tag(control_tag(2 * epoch + 1), message, 0), std::span<std::byte>(&word, 1), kEvaluationWait)
          .wait(config_.method.common.timeout);
      if (word == kEvaluationDone) return;
      if (message == kLastEvaluationMessage) {
        throw CommError(concat(kEvaluationWait, ": rank 0 sent ", message + 1, " messages without finishing"));
      }
    }
  }

  // Epoch end: mean training loss over all workers (this reduction is also a barrier), then rank 0
  // evaluates while the others wait for its word that it is done, so evaluation never pollutes
  // timings. Evaluating a large model on one core can take longer than the comm timeout: between
  // test chunks, whenever a quarter of the timeout has passed since its last word, rank 0 tells the
  // others it is still evaluating, so a long evaluation never looks like a dead peer (a single
  // 1000-example chunk must still take less than the timeout).
  // (Counts up to 2^24 are exact in fp32: an epoch of this run has at most that many examples.)
  void end_epoch(std::int64_t epoch, std::int64_t count) {
    const TraceSpan span("epoch end", kTraceRun, iteration_args());  // the loss reduction and evaluation
    float reduced[3] = {static_cast<float>(sums_.loss), static_cast<float>(count), static_cast<float>(sums_.correct)};
    control_.run(reduced, control_tag(2 * epoch));
    if (leader_ == nullptr) {
      wait_for_evaluation(epoch);
      return;
    }
    int message = 0;
    EpochRecord record;
    record.epoch = epoch + 1;
    record.iterations = t_;
    record.train_loss = reduced[1] > 0 ? reduced[0] / reduced[1] : 0;
    record.train_accuracy = reduced[1] > 0 ? reduced[2] / (reduced[1] * static_cast<double>(config_.batch)) : 0;
    record.elapsed_seconds = train_seconds_;
    if (!config_.has_accuracy) record.train_accuracy = -1;
    std::string result = concat("train loss ", std::fixed, std::setprecision(4), record.train_loss);
    if (config_.has_accuracy) {
      result += concat(", train accuracy ", std::fixed, std::setprecision(2), record.train_accuracy * 100, "%");
    }
    if (config_.evaluate) {
      Clock::time_point last_word = Clock::now();
      const auto word_interval = config_.method.common.timeout / 4;
      const Evaluation evaluation = evaluate(model_, data_.test, [&] {
        if (Clock::now() - last_word < word_interval || message == kLastEvaluationMessage) return;
        tell_workers(epoch, message, kStillEvaluating);
        last_word = Clock::now();
      });
      record.test_accuracy = evaluation.count && config_.has_accuracy ? double(evaluation.correct) / evaluation.count
                                                                      : (config_.has_accuracy ? 0 : -1);
      record.test_loss = evaluation.count ? evaluation.loss_sum / evaluation.count : 0;
      if (config_.has_accuracy) {
        result += concat(", test accuracy ", std::fixed, std::setprecision(2), record.test_accuracy * 100, "%");
      } else {
        result += concat(", test loss ", std::fixed, std::setprecision(4), record.test_loss);
      }
    }
    progress_.end_epoch(result);
    leader_->epochs.push_back(record);
    if (metrics_ != nullptr) metrics_->add_epoch(record);
    tell_workers(epoch, message, kEvaluationDone);
  }

  const RunContext& run_;
  const TrainConfig& config_;
  const int rank_;
  Model& model_;
  Transport& transport_;
  TrainingMethod& method_;
  const DataSplits& data_;
  const FaultControl& faults_;
  FaultInjectingTransport* mid_operation_fault_;
  EarlyStop& stop_;
  const int stop_slot_;
  WorkerRecord& record_;
  LeaderRecord* leader_;
  MetricsStream* metrics_;
  ShardedSampler sampler_;
  BatchAssembler assembler_;
  RankSubsetTransport worker_ranks_;
  std::unique_ptr<Codec> control_codec_;
  RingAllreduce control_;
  ProgressReporter progress_;
  NonfiniteGuard nonfinite_;
  std::optional<ConsistencyCheck> consistency_;
  const SegmentReadyFn* method_ready_ = nullptr;
  SegmentReadyFn on_ready_;
  BackgroundCheckpointWriter checkpoints_;
  std::int64_t t_ = 0;
  EpochSums sums_;
  WorkerHistory history_;  // what the checkpoint resumed from carried (zeros if none)
  Stopwatch epoch_clock_;
  double train_seconds_ = 0;
  // --trace (nullptr: not recorded): this compute thread's trace, "backward <layer>" by segment,
  // and where the current iteration's layer spans are.
  ThreadTrace* trace_ = nullptr;
  std::vector<const char*> layer_names_;
  std::size_t layers_traced_ = 0;
  TraceClock::time_point first_layer_start_{};
  TraceClock::time_point last_layer_end_{};
  const AllreduceMeter* meter_ = nullptr;  // the method's allreduces' (run_worker's), if installed
  std::uint64_t metered_cpu_nanoseconds_ = 0, metered_bytes_ = 0;  // its totals at the last iteration's end
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

void run_worker(const RunContext& run, int rank, Model& model, Transport& run_transport, const DataSplits& data,
                const FaultControl& faults, EarlyStop& stop, WorkerRecord& record, LeaderRecord* leader,
                MetricsStream* metrics) {
  const TrainConfig& config = run.config;
  record.times.assign(static_cast<std::size_t>(run.plan.total_iterations), IterationTimes{});
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
      inject_fault(fault, faults);
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
  std::unique_ptr<TrainingMethod> method =
      make_method(config.method, transport, model, run.plan.warmup_iterations, config.network, schedule_length(run.plan));
  // Once the method is built (its usage errors come first): a run too short for its steady state.
  if (leader != nullptr && config.warn_short_run && run.plan.unreached_phase) {
    std::cerr << short_run_warning(*run.plan.unreached_phase, run.plan.total_iterations) << std::flush;
  }
  // Workers outnumber cores here, unlike on a cluster where a node's NIC never waits for its CPU:
  // communication threads (created above) must not queue behind compute (core/thread_priority.h).
  if (config.deprioritize_compute && transport.waits_sleep() && !realtime_priority_permitted()) {
    lower_compute_thread_priority();
  }
  WorkerLoop loop(run, rank, model, transport, *method, data, faults, faulty ? &*faulty : nullptr, stop, record, leader,
                  metrics);
  try {
    loop.run();
    if (leader != nullptr) leader->method_report = method->report();
  } catch (const PeerFailedError& error) {
    const std::optional<int> signal = peer_interruption(error);
    if (!faults.rank_is_process || !signal) {
      transport.report_failure(error.what());
      throw;
    }
    loop.stopped_by_peer(*signal);
    if (leader != nullptr) leader->method_report = method->report();
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
