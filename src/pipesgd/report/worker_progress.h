#pragma once
// What the metrics stream (metrics_file.h) reads of a running training: how many iterations each
// worker of this process completed. The trainer's EarlyStop (train/early_stop.h) publishes these
// counts; report/ sees them through this interface only, so that it includes nothing of train/.
#include <cstdint>

namespace pipesgd {

class WorkerProgress {
 public:
  virtual ~WorkerProgress() = default;
  // The iterations [0, n) worker `worker` has completed; its records of them are visible to the
  // caller (any thread).
  virtual std::int64_t completed(int worker) const = 0;
};

}  // namespace pipesgd
