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
#include "pipesgd/core/trace.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/train/early_stop.h"
#include "pipesgd/train/fault_injection.h"
#include "pipesgd/report/metrics_file.h"
#include "pipesgd/train/run_context.h"

namespace pipesgd {

// What one worker records; written by that worker's compute thread only, read after the run (and,
// of the iterations it published as completed, by the metrics stream: train/early_stop.h). The
// counts include what a resumed run's checkpoint carried (checkpointing.h, WorkerHistory).
struct WorkerRecord {
  std::vector<IterationTimes> times;  // per iteration of the run (those this process ran)
  std::int64_t completed = 0;         // the iterations [0, completed) are done
  int stop_signal = 0;                // the signal that stopped it early (0: it was not)
  std::uint64_t bytes_sent = 0;
  std::int64_t nonfinite_skipped = 0;   // --on-nonfinite skip: layers zeroed
  double loss_sum = 0;                  // losses of the iterations [RunPlan::loss_from, completed), in order
  std::vector<float> final_parameters;  // TrainConfig::keep_parameters
};

// What rank 0 records besides its WorkerRecord.
struct LeaderRecord {
  std::vector<EpochRecord> epochs;
  double train_seconds = 0;
  std::int64_t consistency_checks = 0;          // --check-consistency: passed
  std::shared_ptr<MethodReport> method_report;  // its method's
};

// What the run gives each worker of this process: shared by them, outliving them.
struct WorkerRun {
  const RunContext& run;
  const DataSplits& data;
  const FaultControl& faults;
  // Its slots: the workers of this process (slot = the rank among threads, 0 where each rank is a
  // process).
  EarlyStop& stop;
};

// Where a worker's results go; written by its compute thread only.
struct WorkerSinks {
  WorkerRecord& record;
  LeaderRecord* leader = nullptr;    // rank 0's
  MetricsStream* metrics = nullptr;  // rank 0's in a run with --out
};

// --trace: the events each thread of a run of `total_iterations` iterations over `layers` layers
// records in `window` (a bound: a full buffer drops the rest and the file says how many).
std::size_t trace_events_per_thread(const TraceWindow& window, std::int64_t total_iterations, std::size_t layers);

// Runs worker `rank` of `shared.run` with its replica `model` to the end, or until `shared.stop`
// stops it early. `transport` is the run's whole transport (servers included, if any). A failure
// is reported to the other ranks before the method unwinds, and rethrown; a CommTimeoutError then
// names this worker's iteration.
// Stopping early: among threads every worker stops at the agreed iteration and applies what is in
// flight (as at the run's end). Where each rank is a process, a rank stops at its own boundary and
// tells the others through the failure notice (interruption_notice); a rank that learns of it in a
// wait stops there, having completed the iterations before.
void run_worker(const WorkerRun& shared, int rank, Model& model, Transport& transport, const WorkerSinks& sinks);

}  // namespace pipesgd
