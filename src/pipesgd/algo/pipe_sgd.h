#pragma once
// Pipe-SGD (pipe-sgd.txt Alg. 1): iterations pipelined with width K. The update at iteration t uses
// the aggregated gradient of iteration t-K; the allreduce of iteration t's gradient runs on this
// worker's comm thread while the compute thread goes on with iterations t+1 .. t+K-1.
//
// StaleGradientSlots: K gradient buffers; iteration t writes its local gradient into slot t % K,
// which by then has delivered g_sum[t-K] to the update of iteration t. Slots that never held a
// gradient (the first K iterations, Alg. 1's zero-initialised g_sum[1-K..0]) mean "no update".
// K = 1 is exactly D-Sync (bit-identical weights). finish() drains the pipeline: the last K
// aggregated gradients are applied in iteration order, so no computed gradient is dropped.
// Warm-up: the first `warmup_iterations` run as D-Sync (paper Sec. 4); the slots start empty after.
//
// Threads: the compute thread calls begin/end/finish; the comm thread (owned here) runs allreduces
// in submission order. Slot states are guarded by one per-worker mutex (not global).
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "pipesgd/algo/training_method.h"
#include "pipesgd/collective/allreduce.h"

namespace pipesgd {

class PipeSgd final : public TrainingMethod {
 public:
  PipeSgd(const MethodConfig& config, Model& model, Transport& transport);
  ~PipeSgd() override;
  std::span<float> begin_iteration(std::int64_t t, IterationTimes& times) override;
  void end_iteration(std::int64_t t, IterationTimes& times) override;
  void finish(IterationTimes& times) override;
  std::optional<std::uint64_t> first_message_sequence(std::int64_t t) const override {
    return static_cast<std::uint64_t>(t);
  }
  // The K slots: their state, iteration and gradient (in-flight allreduces are waited for first).
  void save_state(CheckpointWriter& out) override;
  void load_state(const CheckpointReader& in, std::int64_t next_iteration) override;
  MethodReport report() const override {
    MethodReport report;
    report.allreduce_calls = 1;
    return report;
  }

 private:
  enum class SlotState { empty, queued, reduced };
  struct Slot {
    std::vector<float> gradient;
    SlotState state = SlotState::empty;
    std::int64_t iteration = -1;
    double comm_seconds = 0;
  };

  // Waits for slot t % K; if it holds g_sum[t-K], applies it. Compute thread only.
  void consume_slot(std::int64_t t, IterationTimes& times);
  void comm_loop();
  bool in_warmup(std::int64_t t) const { return t < warmup_iterations_; }

  Model& model_;
  Transport& transport_;
  std::unique_ptr<Codec> codec_;
  std::unique_ptr<Allreduce> allreduce_;  // the comm thread's after warm-up; the compute thread's during it
  std::unique_ptr<Optimizer> optimizer_;
  const int staleness_;
  const std::int64_t warmup_iterations_;
  const Timeout timeout_;
  const float gradient_scale_;
  std::int64_t next_iteration_ = 0;

  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::condition_variable work_submitted_;  // the comm thread waits on it
  std::condition_variable slot_reduced_;    // the compute thread waits on it
  std::vector<int> queue_;  // circular, capacity K: slots submitted to the comm thread, in order
  std::size_t queue_head_ = 0, queue_size_ = 0;
  bool stopping_ = false;
  std::exception_ptr comm_failure_;
  std::thread comm_thread_;
};

}  // namespace pipesgd
