#include "pipesgd/core/thread_priority.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace pipesgd {
namespace {

constexpr int kComputeThreadNice = 10;
thread_local bool communication_thread = false;
constexpr std::uint64_t kShortSliceNanoseconds = 100'000;

// The kernel's struct sched_attr (linux/sched/types.h clashes with glibc's sched_param).
struct SchedulingAttributes {
  std::uint32_t size;
  std::uint32_t policy;
  std::uint64_t flags;
  std::int32_t nice;
  std::uint32_t priority;
  std::uint64_t runtime;
  std::uint64_t deadline;
  std::uint64_t period;
  std::uint32_t utilization_min;
  std::uint32_t utilization_max;
};

}  // namespace

std::string raise_communication_thread_priority() {
  sched_param fifo{};
  fifo.sched_priority = sched_get_priority_min(SCHED_FIFO);
  if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &fifo) == 0) return "fifo";
#ifdef SYS_sched_setattr
  SchedulingAttributes attributes;
  std::memset(&attributes, 0, sizeof attributes);
  attributes.size = sizeof attributes;
  attributes.policy = SCHED_OTHER;
  attributes.runtime = kShortSliceNanoseconds;  // EEVDF: the requested slice of a fair task
  if (syscall(SYS_sched_setattr, 0, &attributes, 0) == 0) return "short-slice";
#endif
  return "default";
}

bool realtime_priority_permitted() {
  int policy = 0;
  sched_param original{};
  if (pthread_getschedparam(pthread_self(), &policy, &original) != 0) return false;
  sched_param fifo{};
  fifo.sched_priority = sched_get_priority_min(SCHED_FIFO);
  if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &fifo) != 0) return false;
  pthread_setschedparam(pthread_self(), policy, &original);
  return true;
}

void mark_communication_thread() { communication_thread = true; }
bool is_communication_thread() { return communication_thread; }

void lower_compute_thread_priority() {
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kComputeThreadNice);
}

}  // namespace pipesgd
