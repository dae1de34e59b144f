#pragma once
// One allreduce, simulated message by message: the runtime's own algorithm (make_allreduce, the
// code the trainer runs) on every simulated host over SimTransport, with the codec's CPU work
// charged to the host as simulated time.
#include <cstddef>
#include <cstdint>
#include <string>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/sim/platform.h"
#include "pipesgd/timing/model_profile.h"

namespace pipesgd {

struct CollectiveScenario {
  std::string algorithm = "ring";  // an allreduce_algorithm_names() entry
  std::size_t count = 0;           // fp32 elements per rank
  std::string codec = "none";
  std::size_t segment_bytes = kDefaultSegmentBytes;
  SimPlatformSpec platform;        // platform.hosts = the world size
  CodecCost codec_cost;            // simulated CPU seconds per fp32 byte (timing/model_profile.h)
  int repetitions = 1;             // back-to-back allreduces (distinct tags); the result is their mean
};

struct CollectiveResult {
  // Simulated time (deterministic, not this machine's clock) of one allreduce: from the common start
  // to the last rank's end.
  double simulated_seconds = 0;
  std::uint64_t bytes_sent_per_rank = 0;  // the most any rank sent, per allreduce
  double max_abs_error = 0;             // of the sums against the exact ones (0 for codec none)
};

// Runs the scenario in an isolated simulation process (sim/isolated_run.h). Throws UsageError for
// an unknown algorithm or codec, fewer than 1 rank or no bandwidth.
CollectiveResult simulate_allreduce(const CollectiveScenario& scenario);

}  // namespace pipesgd
