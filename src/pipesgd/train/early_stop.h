#pragma once
// Stopping a run before its last iteration, when a flag asks to (SIGINT / SIGTERM,
// core/interrupt.h), at an iteration boundary every worker of this process agrees on: the stop
// iteration S. Every worker completes exactly the iterations [0, S) (so their collectives match),
// then stops. The agreement goes through shared memory only: no lock, no message, and on the hot
// path one atomic store and two atomic loads per iteration.
//
// Each worker publishes, at the boundary before iteration t, that it completed [0, t). The first
// worker that sees the flag decides S once: past every other worker's published iteration (that
// one may be running) and not before its own. Where each rank is a process (MPI), a process has
// one worker and stops at its own boundary; the trainer then tells the other ranks.
//
// The published counts double as progress: a reader that loads completed(w) sees worker w's
// records of those iterations (release / acquire), which the metrics stream relies on (it reads
// them as a WorkerProgress, report/worker_progress.h).
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/interrupt.h"
#include "pipesgd/report/worker_progress.h"

namespace pipesgd {

// Where each rank is a process, a rank that stopped early tells the others with
// interruption_notice(signal) (core/interrupt.h).
// The signal of a PeerFailedError that carries a peer's interruption_notice (the transports report
// a failure as "rank R failed: <reason>"); nullopt for any other failure.
std::optional<int> peer_interruption(const PeerFailedError& error);

class EarlyStop final : public WorkerProgress {
 public:
  static constexpr std::int64_t kNever = std::numeric_limits<std::int64_t>::max();

  // `workers`: the workers of this process, indexed 0..workers-1. `flag`: 0, or the signal that
  // asks to stop (nullptr: never stop early). `timeout`: how long a worker may wait for another
  // to finish deciding S (microseconds in practice).
  EarlyStop(int workers, const std::atomic<int>* flag, Timeout timeout);

  // At worker `worker`'s boundary before iteration `next` (it completed [0, next)): publishes
  // that, and returns true if it must stop here. Called by that worker's thread only.
  bool stop_before(int worker, std::int64_t next);
  // Publishes that worker `worker` completed [0, next) (its last boundary, at the run's end).
  void publish(int worker, std::int64_t next);

  // The iterations worker `worker` has published as completed; its records of them are visible to
  // the caller.
  std::int64_t completed(int worker) const override;
  // S once decided, else kNever.
  std::int64_t stop_iteration() const;
  // The flag's signal when S was decided (0 if it never was).
  int signal() const;

 private:
  static constexpr std::int64_t kDeciding = kNever - 1;
  void decide(int worker, std::int64_t next);

  struct alignas(64) Slot {  // one cache line per worker: the stores of one do not slow the others
    std::atomic<std::int64_t> next{0};
  };
  const int workers_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<std::int64_t> stop_at_{kNever};
  std::atomic<int> signal_{0};
  const std::atomic<int>* flag_;
  Timeout timeout_;
};

}  // namespace pipesgd
