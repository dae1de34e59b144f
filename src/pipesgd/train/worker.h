#pragma once
// One worker's part of a run: its method built for it, the iteration loop (the method's
// begin/end around the model's forward and backward), the checks around it (non-finite
// gradients, replica consistency, injected faults), its checkpoints, and the epoch ends (the loss
// reduction, rank 0's evaluation).
#include <cstdint>
#include <memory>
#include <vector>

#include "pipesgd/algo/method_report.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/train/fault_injection.h"
#include "pipesgd/train/run_context.h"

namespace pipesgd {

// What one worker records; written by that worker's compute thread only, read after the run.
struct WorkerRecord {
  std::vector<IterationTimes> times;  // per iteration of the run
  std::uint64_t bytes_sent = 0;
  std::int64_t nonfinite_skipped = 0;   // --on-nonfinite skip: layers zeroed
  std::vector<float> final_parameters;  // TrainConfig::keep_parameters
};

// What rank 0 records besides its WorkerRecord.
struct LeaderRecord {
  std::vector<EpochRecord> epochs;
  double train_seconds = 0;
  std::int64_t consistency_checks = 0;          // --check-consistency: passed
  std::shared_ptr<MethodReport> method_report;  // its method's
};

// Runs worker `rank` of `run` to the end. `transport` is the run's whole transport (servers
// included, if any); `leader` is non-null on rank 0. A failure is reported to the other ranks
// before the method unwinds, and rethrown; a CommTimeoutError then names this worker's iteration.
void run_worker(const RunContext& run, int rank, Model& model, Transport& transport, const DataSplits& data,
                const FaultControl& faults, WorkerRecord& record, LeaderRecord* leader);

}  // namespace pipesgd
