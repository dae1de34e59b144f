#include "pipesgd/train/early_stop.h"

#include <algorithm>
#include <csignal>
#include <thread>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/interrupt.h"

namespace pipesgd {

// Memory ordering. A worker's boundary is W: slot.store(t), then R: stop_at_.load(); the decider's
// is D1: stop_at_ kNever -> kDeciding (CAS), D2: every slot.load(), D3: stop_at_.store(S). All are
// seq_cst, so they have one total order. If a worker's R read kNever (it went on into iteration t),
// R precedes D1, hence its W precedes D2, and D2 reads t or later: S > t. A worker whose R came
// after D1 reads kDeciding or S, and waits for S before going on. So no worker runs an iteration
// >= S, and each stops at its first boundary >= S, which is S. (Store-load ordering across two
// variables, as here, needs seq_cst; acquire / release would let W and R, or D1 and D2, swap.)

std::optional<int> peer_interruption(const PeerFailedError& error) { return interruption_in(error.what()); }

EarlyStop::EarlyStop(int workers, const std::atomic<int>* flag, Timeout timeout)
    : workers_(workers), slots_(std::make_unique<Slot[]>(static_cast<std::size_t>(workers))), flag_(flag),
      timeout_(timeout) {
  PIPESGD_ASSERT(workers > 0);
}

bool EarlyStop::stop_before(int worker, std::int64_t next) {
  slots_[static_cast<std::size_t>(worker)].next.store(next, std::memory_order_seq_cst);
  std::int64_t stop = stop_at_.load(std::memory_order_seq_cst);
  if (stop == kNever) {
    if (flag_ == nullptr || flag_->load(std::memory_order_relaxed) == 0) return false;
    decide(worker, next);
    stop = stop_at_.load(std::memory_order_seq_cst);
  }
  const auto deadline = Clock::now() + timeout_;
  while (stop == kDeciding) {
    if (Clock::now() > deadline) {
      throw CommError(concat("worker ", worker, " waited more than ", timeout_.count(),
                             " ms for the other workers to agree where to stop"));
    }
    std::this_thread::yield();
    stop = stop_at_.load(std::memory_order_seq_cst);
  }
  return next >= stop;
}

void EarlyStop::decide(int worker, std::int64_t next) {
  std::int64_t expected = kNever;
  if (!stop_at_.compare_exchange_strong(expected, kDeciding, std::memory_order_seq_cst)) return;  // decided elsewhere
  // This worker has not started `next`; another one that published n may be running n.
  std::int64_t stop = next;
  for (int w = 0; w < workers_; ++w) {
    if (w != worker) stop = std::max(stop, slots_[static_cast<std::size_t>(w)].next.load(std::memory_order_seq_cst) + 1);
  }
  signal_.store(flag_->load(std::memory_order_relaxed), std::memory_order_relaxed);
  stop_at_.store(stop, std::memory_order_seq_cst);  // publishes signal_ too
}

void EarlyStop::publish(int worker, std::int64_t next) {
  slots_[static_cast<std::size_t>(worker)].next.store(next, std::memory_order_seq_cst);
}

std::int64_t EarlyStop::completed(int worker) const {
  return slots_[static_cast<std::size_t>(worker)].next.load(std::memory_order_acquire);
}

int EarlyStop::signal() const {
  return stop_iteration() == kNever ? 0 : signal_.load(std::memory_order_relaxed);  // after the acquire of S
}

std::int64_t EarlyStop::stop_iteration() const {
  const std::int64_t stop = stop_at_.load(std::memory_order_acquire);
  return stop == kDeciding ? kNever : stop;
}

}  // namespace pipesgd
