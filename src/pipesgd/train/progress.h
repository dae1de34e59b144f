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
  // `iterations` of the epoch's `epoch_iterations` run (fewer when --iters ends the run inside it).
  void start_epoch(std::int64_t epoch, std::int64_t epochs, std::int64_t iterations, std::int64_t epoch_iterations);
  // After iteration `done` (1-based within the epoch) with the mean loss so far.
  void update(std::int64_t done, double loss, double samples_per_second);
  // "epoch 2/3 done: RESULT", or, for an epoch the run ended inside (--iters), "stopped after 200
  // iterations (--iters), 17% of epoch 1: RESULT": never an epoch that did not complete.
  void end_epoch(const std::string& result);
  // The run stopped inside the epoch: ends the bar's line (on a terminal).
  void interrupt();

 private:
  // "2/3", or "1 (the run ends after 200 of its 1200 iterations, --iters)".
  std::string epoch_name() const;
  bool enabled_;
  bool terminal_;
  std::string label_;
  std::int64_t epoch_ = 0, epochs_ = 0, iterations_ = 0, epoch_iterations_ = 0, next_line_at_ = 0;
  Stopwatch last_draw_;
};

}  // namespace pipesgd
