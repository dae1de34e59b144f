#pragma once
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace pipesgd {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

inline double seconds_since(Clock::time_point start) {
  return Seconds(Clock::now() - start).count();
}

// Wall-clock nanoseconds since the Unix epoch: comparable across processes and hosts (a relaunched
// world's records, pipesgdrun's), unlike Clock.
inline std::int64_t unix_time_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// CPU time the calling thread has used so far (its CLOCK_THREAD_CPUTIME_ID), in seconds: the
// processor time a piece of work costs that thread, whatever else runs beside it.
inline double thread_cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// Measures one span of wall time: `Stopwatch w; ...; double s = w.seconds();`.
class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  double seconds() const { return seconds_since(start_); }
  void restart() { start_ = Clock::now(); }

 private:
  Clock::time_point start_;
};

// The median wall time of `repetitions` (>= 1) runs of `operation`, after one untimed run (first
// touch of its buffers).
template <typename Operation>
double median_seconds(int repetitions, Operation&& operation) {
  operation();
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    Stopwatch watch;
    operation();
    times.push_back(watch.seconds());
  }
  const std::size_t middle = times.size() / 2;
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(middle), times.end());
  if (times.size() % 2 == 1) return times[middle];
  return (*std::max_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(middle)) + times[middle]) / 2;
}

}  // namespace pipesgd
