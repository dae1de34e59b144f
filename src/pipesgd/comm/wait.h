#pragma once
// How the runtime waits: every transport's wait on a message (LocalTransport, SharedMemoryTransport,
// MpiTransport) and a compute thread's wait on its comm thread (CommWorker) run wait_for(), the one
// wait policy; the transports name what went wrong with the same two errors and keep a run's failure
// in the same failure state. SimTransport's waits are SimGrid's own, in simulated time: it uses the
// errors and the failure state.
//
// The policy (WaitPolicy), three phases, each skipped when its bound is zero:
//   1. spin:  up to `spin_polls` polls at once, without a clock read or a system call (a message
//             about to land costs nothing more);
//   2. yield: polls with sched_yield() between them until `yield_for` after the wait began (a peer
//             about to answer is answered without a trip through the scheduler);
//   3. block: the wait's site sleeps (a condition variable, a futex, or a short sleep between polls
//             where nothing can block: MPI), at most `block_slice` per turn, until it is woken.
// The run's failure state is looked at every `polls_per_check` polls of phase 2 (0: not in phase 2),
// every `blocks_per_check` turns of phase 3, and at the deadline before a timeout is reported: a
// failure wins over a timeout.
//
// The errors: PeerFailedError "<wait> aborted: rank R failed: <reason>" and CommTimeoutError
// "<wait> timed out after S s", where <wait> is describe_message_wait()'s "<operation>: recv from rank P
// (tag ...) on rank R" (or the site's own text) and S the timeout in seconds.
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "pipesgd/comm/transport.h"
#include "pipesgd/core/clock.h"

namespace pipesgd {

// "rank R failed: <reason>": how a rank's failure reads in every wait it aborts.
std::string rank_failure_message(int rank, const std::string& reason);

// Throws PeerFailedError "<wait> aborted: <failure>" (`failure`: a rank_failure_message).
[[noreturn]] void throw_wait_aborted(const std::string& wait, const std::string& failure);

// Throws CommTimeoutError "<wait> timed out after S s<suffix>" naming `peer` (-1: not one peer's wait).
[[noreturn]] void throw_wait_timed_out(const std::string& wait, Timeout timeout, int peer, const char* suffix = "");

// The first error either of the two above threw in this process ("" if none), but for an abort by a
// rank's interruption notice (a clean stop, core/interrupt.h). Thread-safe.
std::string first_wait_error();

// A run's failure as one process sees it: the first failure recorded wins, later ones are ignored.
// Thread-safe. (SharedMemoryTransport keeps the same state in memory shared by the processes of a
// host: shm/region_layout.h.)
class FailureState {
 public:
  // Records "rank R failed: <reason>" unless a failure is recorded already; true if this one was.
  bool report(int rank, const std::string& reason) { return record(rank_failure_message(rank, reason)); }
  // Records `message` (already a rank_failure_message, e.g. from another process's notice) unless a
  // failure is recorded already; true if this one was.
  bool record(std::string message);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // "" until a failure is recorded.
  std::string message() const;

 private:
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;  // guards message_
  std::string message_;
};

// What a thread is waiting on, readable by another thread (a process's last words when its launcher
// ends it while a wait is stuck: mpi/'s LauncherWatch). One record per thread, written by that
// thread only (a sequence lock of relaxed atomics: no lock, no allocation after the thread's first
// wait); the transports open one for a wait that did not complete at its first poll.
struct WaitNote {
  const char* operation = "";  // static text
  bool is_send = false;
  int peer = -1;  // -1: not a message wait (a barrier)
  Tag tag = 0;
  int rank = 0;
  std::int64_t since_ns = 0;  // steady_clock, when the wait began (now_ns())

  // Clock::now() in nanoseconds: since_ns of a wait that begins now.
  static std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  }
};

// While alive, the calling thread's record says it waits on `note`. Not nested (a thread waits on
// one thing at a time).
class WaitNoteScope {
 public:
  explicit WaitNoteScope(const WaitNote& note);
  ~WaitNoteScope();
  WaitNoteScope(const WaitNoteScope&) = delete;
  WaitNoteScope& operator=(const WaitNoteScope&) = delete;
};

// The waits in progress now, on every thread that opened a WaitNoteScope, oldest first. Thread-safe.
std::vector<WaitNote> current_waits();

struct WaitPolicy {
  int spin_polls = 0;                    // phase 1
  Clock::duration yield_for{};           // phase 2, from the start of the wait (after phase 1)
  int polls_per_check = 0;               // phase 2: the failure state every this many polls (0: never)
  Clock::duration block_slice = Clock::duration::max();  // phase 3: the longest sleep of one turn
  int blocks_per_check = 1;              // phase 3: the failure state every this many turns
};

enum class WaitOutcome { kDone, kFailed, kTimedOut };

// Waits under `policy` until `site` is ready, the run failed, or `timeout` passed. `Site` provides
//   bool ready();          // the awaited thing is done (may make progress, e.g. MPI_Test; may throw)
//   bool polling_pays();   // false skips the rest of phases 1 and 2 (nothing can complete by polling)
//   bool failed();         // the run failed (may throw an error of its own instead)
//   void block(Clock::time_point now, Clock::time_point until);
//                          // sleeps until woken or `until` (may return early); `now`: the last clock read
// On the hot path: everything is inlined into the site's own wait, and a wait whose first polls
// succeed reads no clock.
template <typename Site>
WaitOutcome wait_for(const WaitPolicy& policy, Timeout timeout, Site& site) {
  for (int poll = 0; poll < policy.spin_polls && site.polling_pays(); ++poll) {
    if (site.ready()) return WaitOutcome::kDone;
  }
  Clock::time_point now = Clock::now();
  const Clock::time_point deadline = now + timeout;
  if (policy.yield_for > Clock::duration::zero()) {
    const Clock::time_point yield_until = now + policy.yield_for;
    for (int polls = 1; site.polling_pays(); ++polls) {
      if (site.ready()) return WaitOutcome::kDone;
      if (polls == policy.polls_per_check) {
        polls = 0;
        if (site.failed()) return WaitOutcome::kFailed;
      }
      if (now >= deadline) return site.failed() ? WaitOutcome::kFailed : WaitOutcome::kTimedOut;
      if (now >= yield_until) break;
      sched_yield();
      now = Clock::now();
    }
  }
  for (int turns = 1;; ++turns) {
    if (site.ready()) return WaitOutcome::kDone;
    if (turns >= policy.blocks_per_check) {
      turns = 0;
      if (site.failed()) return WaitOutcome::kFailed;
    }
    if (now >= deadline) return site.failed() ? WaitOutcome::kFailed : WaitOutcome::kTimedOut;
    site.block(now, deadline - now > policy.block_slice ? now + policy.block_slice : deadline);
    now = Clock::now();
  }
}

// wait_for() on a message, with the transports' errors: PeerFailedError "<describe()> aborted:
// <site.failure_message()>" if the run failed, CommTimeoutError "<describe()> timed out after S s"
// naming `peer` after `timeout`. `describe` is called only to build an error.
template <typename Site, typename Describe>
void wait_or_throw(const WaitPolicy& policy, Timeout timeout, int peer, Site& site, Describe&& describe) {
  switch (wait_for(policy, timeout, site)) {
    case WaitOutcome::kDone:
      return;
    case WaitOutcome::kFailed:
      throw_wait_aborted(describe(), site.failure_message());
    case WaitOutcome::kTimedOut:
      throw_wait_timed_out(describe(), timeout, peer);
  }
}

}  // namespace pipesgd
