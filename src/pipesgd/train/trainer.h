#pragma once
// The training run: N workers (threads over a LocalFabric, or MPI ranks) train one model with one
// method on one data set, and the run reports per-iteration timings, per-epoch accuracy and a
// summary. The parts: run_config.h (what is asked), run_context.h (what every rank knows before it
// starts), worker.h (a worker's loop), checkpointing.h (save and load), fault_injection.h,
// summary.h (the figures), report.h (tables and files), metrics_file.h (metrics.jsonl, streamed
// while the run goes), early_stop.h (stopping at an iteration boundary on SIGINT / SIGTERM); this
// header launches the ranks.
//
// With --out, the leader writes metrics.jsonl as the run goes and summary.json at its end. A run
// whose TrainConfig::interrupt flag is set stops early and returns normally: its summary has
// `interrupted` set and covers the iterations completed (summary.json says so too).
#include "pipesgd/comm/transport.h"
#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/train/run_config.h"
#include "pipesgd/report/run_summary.h"

namespace pipesgd {

// Runs the training with config.workers workers as threads of this process over a LocalFabric
// (config.network emulates their links). A parameter-server method adds its server ranks as threads
// after the workers (their links are emulated like the workers'). Throws UsageError / DataError /
// CommError with a one-line message.
RunSummary run_training(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data);

// Runs this process's rank of a run whose ranks are those of `transport`, one per process
// (MpiTransport); config.workers + the method's servers must equal transport.size(). With a
// parameter-server method, ranks config.workers.. are the servers: they serve their shard until
// every worker closed and return a summary with only the set-up's method spec, workers and servers
// (a server notices a failed worker only by --comm-timeout, see ps/parameter_server.h). Collective:
// every rank calls it with the same config and data. Ranks 1..M-1 send their timings to rank 0, so
// the returned summary is complete on rank 0 only; only rank 0 prints progress and writes
// config.out_dir. Training is the same computation as run_training with the same config: same
// weights, bit for bit. Stopped early (the interrupt flag), each rank stops on its own and tells
// the others through the failure notice (run_worker); each returns its own view, rank 0's written
// to config.out_dir, marked interrupted. The process must then end without MPI_Finalize.
RunSummary run_training_rank(const TrainConfig& config, const ModelFactory& factory, const DataSplits& data,
                             Transport& transport);

}  // namespace pipesgd
