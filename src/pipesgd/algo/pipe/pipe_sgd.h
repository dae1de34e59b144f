#pragma once
// Pipe-SGD (the paper's Alg. 1): iterations pipelined with width K. The update at iteration t uses
// the aggregated gradient of iteration t-K; the allreduce of iteration t's gradient runs on this
// worker's comm thread while the compute thread goes on with iterations t+1 .. t+K-1.
//
// StaleGradientSlots: K gradient buffers; iteration t writes its local gradient into slot t % K,
// which by then has delivered g_sum[t-K] to the update of iteration t. Slots that never held a
// gradient (the first K iterations, Alg. 1's zero-initialised g_sum[1-K..0]) mean "no update".
// finish() ends the pipeline as --final-gradients says (FinalGradients): by default it applies the
// last K aggregated gradients in iteration order, so no computed gradient is lost and K = 1 is
// exactly D-Sync (bit-identical weights); `drop` waits for them and discards them, leaving the final
// weights of Alg. 1 as printed (its comm thread reduces iterations 1..T-K only).
// Warm-up: the first `warmup_iterations` run as D-Sync (paper Sec. 4); the slots start empty after.
//
// Threads: the compute thread calls begin/end/finish and owns the slots' states; the worker's
// CommWorker runs the allreduces in submission order (a queued slot's gradient is the comm thread's
// until its ticket is done).
#include <memory>
#include <vector>

#include "pipesgd/algo/method_descriptor.h"
#include "pipesgd/collective/allreduce.h"
#include "pipesgd/comm/comm_worker.h"

namespace pipesgd {

// What finish() does with the aggregated gradients of the last K iterations (--final-gradients):
//   kApply  applies them: T iterations apply T gradients, as D-Sync does (K = 1 is D-Sync).
//   kDrop   discards them (their allreduces still run: a worker does not know T when it submits):
//           Alg. 1 as printed, w[T] = w[0] - lr * (g_sum[1] + ... + g_sum[T-K]) for plain SGD.
// With a warm-up W only pipelined iterations are involved: the last min(K, T - W) gradients.
enum class FinalGradients { kApply, kDrop };
inline constexpr const char* kFinalGradientsNames = "apply or drop";
const char* final_gradients_name(FinalGradients final_gradients);  // "apply" | "drop"
// "apply" or "drop"; UsageError naming --final-gradients otherwise.
FinalGradients parse_final_gradients(const std::string& text);

// Pipe-SGD's `auto` allreduce segment: measured on the MLP (2 workers, emulated 10GbE, its 1.3 MB
// ring chunks in two segments), 2.18 ms per iteration against 2.31 ms unsegmented (git show d620cdd:docs/results.md).
inline constexpr std::size_t kPipeSegmentBytes = 640 * 1024;

// Pipe-SGD's options: the iteration dependency K, the warm-up and the end of training.
class PipeOptions final : public MethodOptions {
 public:
  int k = 2;  // in [1, kMaxStaleness]
  WarmUp warmup_given;
  FinalGradients final_gradients = FinalGradients::kApply;

  WarmUp warmup() const override { return warmup_given; }
  std::optional<DeferredPhase> deferred_phase(std::int64_t warmup_iterations) const override;
  int staleness() const override { return k; }
  bool pipelined() const override { return k >= 2; }
  // Pipe-SGD sends large segments (kPipeSegmentBytes): its allreduce is hidden behind compute, and
  // every extra segment costs a message's latency and a wake-up on a core that computes (the
  // paper's Eq. 5 vs 6), but a chunk of a megabyte or more reduces its first part while the second
  // is on the wire (docs/ARCHITECTURE.md, "Segmenting policy").
  std::size_t default_segment_bytes() const override { return kPipeSegmentBytes; }
  std::string fingerprint() const override;
};

inline constexpr int kMaxStaleness = 64;  // upper bound of --staleness-k

// pipe's report: one allreduce per iteration; summary.json "final_gradients" ("apply" | "drop") and
// a line of train's report saying what finish() did with the last gradients.
class PipeReport final : public MethodReport {
 public:
  PipeReport(FinalGradients final_gradients, int staleness) : final_gradients_(final_gradients), staleness_(staleness) {}
  std::size_t allreduce_calls() const override { return 1; }
  void add_json(nlohmann::json& summary, const RunFigures& run) const override;
  void print(std::ostream& out, const RunFigures& run) const override;

 private:
  FinalGradients final_gradients_;
  int staleness_;
};

class PipeSgd final : public TrainingMethod {
 public:
  explicit PipeSgd(const MethodContext& context);
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  void finish(IterationTimes& times) override;
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    return static_cast<std::uint64_t>(t);
  }
  // The K slots: their state, iteration and gradient (in-flight allreduces are waited for first).
  void save_state(CheckpointWriter& out) override;
  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override;
  // Does not drain: the slots still reduced go into the commit when their allreduces end on their
  // own (their waits in begin_iteration), so a commit costs the copies, not the overlap.
  void save_state_when_ready(CheckpointWriter out, const CommitReady& ready) override;
  std::shared_ptr<MethodReport> report() const override;
  Optimizer* optimizer() override { return optimizer_.get(); }

 private:
  enum class SlotState { empty, queued, reduced };
  struct Slot {
    std::vector<float> gradient;
    SlotState state = SlotState::empty;
    std::int64_t iteration = -1;
    CommWorker::Ticket ticket = 0;  // of its allreduce, while queued
    double comm_seconds = 0;        // its allreduce's time, once reduced
    std::uint64_t bytes_sent_after = 0;  // the transport's count when its allreduce ended (comm thread)
  };
  // A commit waiting for the allreduces that were in flight at its boundary (save_state_when_ready).
  struct PendingCommit {
    CheckpointWriter part;
    CommitReady ready;
    std::vector<int> waiting;  // slots whose gradient is still to add
    std::uint64_t bytes_sent = 0;
  };
  // The slots' part of a commit: their states, and the gradients of those reduced (queued ones
  // are recorded as reduced; their gradients are added once they are).
  void add_slots(CheckpointWriter& out, std::vector<int>* queued) const;
  // A slot's allreduce ended (compute thread, after its wait): a pending commit takes its gradient.
  void note_reduced(const Slot& slot);

  // Waits for slot t % K; if it holds g_sum[t-K], applies it (unless `apply` is false) and empties
  // the slot. Compute thread only.
  void consume_slot(std::int64_t t, IterationTimes& times, bool apply = true);
  // Waits for the allreduce of a queued slot; the slot is reduced after.
  void wait_reduced(Slot& slot, IterationTimes& times);
  bool in_warmup(std::int64_t t) const { return t < warmup_iterations_; }

  FlatParameters& model_;
  Transport& transport_;
  std::optional<PendingCommit> pending_commit_;
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Allreduce> allreduce_;  // the comm thread's after warm-up; the compute thread's during it
  std::unique_ptr<Optimizer> optimizer_;
  const LrSchedule schedule_;  // the update of g_sum[i] uses factor(i)
  const int staleness_;
  const std::int64_t warmup_iterations_;
  const FinalGradients final_gradients_;
  const float gradient_scale_;
  std::int64_t next_iteration_ = 0;

  std::vector<Slot> slots_;
  CommWorker comm_;  // last: its thread stops before the slots go
};

}  // namespace pipesgd
