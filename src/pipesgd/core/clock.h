#pragma once
#include <chrono>

namespace pipesgd {

using Clock = std::chrono::steady_clock;
using Seconds = std::chrono::duration<double>;

inline double seconds_since(Clock::time_point start) {
  return Seconds(Clock::now() - start).count();
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

}  // namespace pipesgd
