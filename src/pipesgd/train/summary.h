#pragma once
// A finished run's summary (run_summary.h) from what its workers recorded, on rank 0.
#include <span>

#include "pipesgd/core/model.h"
#include "pipesgd/train/run_context.h"
#include "pipesgd/report/run_summary.h"
#include "pipesgd/train/worker.h"

namespace pipesgd {

// `workers`: the records the summary averages: every worker's (under MPI, the others' times and
// counts gathered at rank 0), or one rank's own (another MPI rank's view; rank 0's of an MPI run
// stopped early). The summary covers the iterations every one of them completed. `model`: this
// rank's model (its final parameters give the checksum). The method's report (in `leader`, rank
// 0's) measures itself on the workers' times first; another rank's view has no report or epochs.
RunSummary summarize(const RunContext& run, std::span<WorkerRecord> workers, const LeaderRecord& leader,
                     FlatParameters& model);

}  // namespace pipesgd
