#pragma once
// Test helpers: the scheduling state of a thread of this process, read from /proc.
#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

namespace pipesgd::testing_support {

// The state letter of thread `tid` ('R' running, 'S' sleeping, ...), from /proc/self/task/TID/stat:
// the field after the parenthesised command name.
inline char thread_state(pid_t tid) {
  std::ifstream file("/proc/self/task/" + std::to_string(tid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const std::size_t name_end = stat.rfind(')');
  return name_end == std::string::npos || name_end + 2 >= stat.size() ? '?' : stat[name_end + 2];
}

// Returns once thread `tid` sleeps (blocked in the kernel). No time limit: a thread that never
// blocks hangs the test until ctest's timeout, which fails it.
inline void wait_until_asleep(pid_t tid) {
  while (thread_state(tid) != 'S') std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace pipesgd::testing_support
