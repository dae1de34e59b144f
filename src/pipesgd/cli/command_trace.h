#pragma once
// --trace FILE / --trace-iters of `train` and `compare`: one recorder for the command's runs (a
// comparison's methods are processes 10000 i + rank of one file), written after the last run, or
// after a failure up to it (a crashed run's trace is the one people most want).
#include <memory>
#include <string>

#include "pipesgd/cli/cli_common.h"
#include "pipesgd/core/trace.h"
#include "pipesgd/train/run_config.h"

namespace pipesgd {

class CommandTrace {
 public:
  // Checks the flags (UsageError naming them): --trace-iters needs --trace; FILE's directory must
  // exist and be writable. Records nothing without --trace.
  CommandTrace(const std::string& path, const std::string& iterations);

  // Where run `index` (0-based) of the command records, its processes named "<label>worker r".
  TraceTarget target(std::size_t index, const std::string& label);

  // After the runs: the file (under MPI every rank's events gathered at rank 0, which writes it;
  // collective). Says "wrote FILE" on stdout where results are printed.
  void write(MpiSession* session, Timeout timeout);
  // After a failure: this process's events up to it, with `failure` in the file (under MPI rank 0
  // writes FILE and rank r > 0 FILE.rank-r: the ranks can no longer meet). Never throws: a failure
  // to write is a warning on stderr.
  void write_after_failure(MpiSession* session, const std::string& failure) noexcept;

 private:
  std::string path_;
  std::unique_ptr<TraceRecorder> recorder_;
};

}  // namespace pipesgd
