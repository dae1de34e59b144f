#pragma once
// Progress output for long runs, on stderr: a redrawn bar on a terminal, a plain line every quarter
// epoch otherwise (logs, CI). One thread (rank 0's compute thread) calls it.
#include <cstdint>
#include <string>

#include "pipesgd/core/clock.h"

namespace pipesgd {

class ProgressReporter {
 public:
  ProgressReporter(bool enabled, std::string label);
  void start_epoch(std::int64_t epoch, std::int64_t epochs, std::int64_t iterations);
  // After iteration `done` (1-based within the epoch) with the mean loss so far.
  void update(std::int64_t done, double loss, double samples_per_second);
  void end_epoch(const std::string& result);
  // The run stopped inside the epoch: ends the bar's line (on a terminal).
  void interrupt();

 private:
  bool enabled_;
  bool terminal_;
  std::string label_;
  std::int64_t epoch_ = 0, epochs_ = 0, iterations_ = 0, next_line_at_ = 0;
  Stopwatch last_draw_;
};

}  // namespace pipesgd
