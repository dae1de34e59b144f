#pragma once
// The synchronisation primitives of SharedMemoryTransport, for memory shared by the processes of one
// host: futex waits and wake-ups on a word of that memory, process-shared robust mutexes (a lock
// whose holder died is taken over), and whether a process is gone.
#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "pipesgd/core/clock.h"

namespace pipesgd::shm_detail {

// Sleeps while `word` holds `expected`, at most `limit` (returns at once if limit <= 0). A shared
// (not process-private) futex: the word is in memory mapped by several processes. May return early.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, Clock::duration limit);
// Wakes up to `waiters` sleepers on `word`.
void futex_wake(std::atomic<std::uint32_t>& word, int waiters);

// Initialises `mutex` (in shared memory) as process-shared and robust.
void init_robust_mutex(pthread_mutex_t& mutex);

// A robust mutex held by this thread. A lock whose holder died is taken over (what it guards may
// hold a half-made change, but a run with a dead member is failing anyway).
class RobustLock {
 public:
  // Takes `mutex`, waiting at most `limit` (zero: a few quick tries, yielding). owns() says whether
  // it did. Throws CommError if the mutex is unrecoverable.
  RobustLock(pthread_mutex_t& mutex, Clock::duration limit);
  ~RobustLock() { unlock(); }
  RobustLock(const RobustLock&) = delete;
  RobustLock& operator=(const RobustLock&) = delete;
  bool owns() const { return owns_; }
  void unlock() {
    if (owns_) pthread_mutex_unlock(&mutex_);
    owns_ = false;
  }

 private:
  pthread_mutex_t& mutex_;
  bool owns_ = false;
};

// True if process `pid` has exited (reaped, or a zombie).
bool process_gone(pid_t pid);

}  // namespace pipesgd::shm_detail
