#include "pipesgd/comm/shm/sync.h"

#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "pipesgd/core/error.h"

namespace pipesgd::shm_detail {
namespace {

std::uint32_t* futex_word(std::atomic<std::uint32_t>& word) { return reinterpret_cast<std::uint32_t*>(&word); }

timespec monotonic_deadline(Clock::duration from_now) {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const auto nanoseconds =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(from_now, Clock::duration::zero())).count();
  long long total = static_cast<long long>(now.tv_nsec) + nanoseconds % 1000000000;
  timespec deadline{now.tv_sec + static_cast<time_t>(nanoseconds / 1000000000 + total / 1000000000),
                    static_cast<long>(total % 1000000000)};
  return deadline;
}

}  // namespace

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, Clock::duration limit) {
  if (limit <= Clock::duration::zero()) return;
  const auto nanoseconds = std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count();
  timespec relative{static_cast<time_t>(nanoseconds / 1000000000), static_cast<long>(nanoseconds % 1000000000)};
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &relative, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>& word, int waiters) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE, waiters, nullptr, nullptr, 0);
}

void init_robust_mutex(pthread_mutex_t& mutex) {
  pthread_mutexattr_t attributes;
  pthread_mutexattr_init(&attributes);
  pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&mutex, &attributes);
  pthread_mutexattr_destroy(&attributes);
}

RobustLock::RobustLock(pthread_mutex_t& mutex, Clock::duration limit) : mutex_(mutex) {
  int code = pthread_mutex_trylock(&mutex_);
  for (int tries = 0; code == EBUSY && tries < 64; ++tries) {
    if (tries % 8 == 7) sched_yield();
    code = pthread_mutex_trylock(&mutex_);
  }
  if (code == EBUSY && limit > Clock::duration::zero()) {
    const timespec deadline = monotonic_deadline(limit);
    code = pthread_mutex_clocklock(&mutex_, CLOCK_MONOTONIC, &deadline);
  }
  if (code == EOWNERDEAD) {
    pthread_mutex_consistent(&mutex_);
    code = 0;
  }
  if (code == ENOTRECOVERABLE) throw CommError("shared-memory transport: a mailbox lock is unrecoverable");
  owns_ = code == 0;
}

bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* file = std::fopen(path, "r");
  if (file == nullptr) return true;
  char line[256] = {};
  const bool read = std::fgets(line, sizeof line, file) != nullptr;
  std::fclose(file);
  const char* state = read ? std::strrchr(line, ')') : nullptr;  // "pid (comm) S ..."
  return state != nullptr && (state[2] == 'Z' || state[2] == 'X');
}

}  // namespace pipesgd::shm_detail
