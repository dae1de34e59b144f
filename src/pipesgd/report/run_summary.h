#pragma once
// What a training run reports: its set-up, its per-iteration figures and the timing models beside
// them, the method's own report, accuracy per epoch, and reliability counts.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/algo/method_options.h"
#include "pipesgd/algo/method_report.h"
#include "pipesgd/timing/pipe_timing_model.h"

namespace pipesgd {

struct EpochRecord {
  std::int64_t epoch = 0;
  std::int64_t iterations = 0;   // iterations run so far
  double train_loss = 0;         // mean over this epoch's iterations and workers
  // Fraction of this epoch's training examples (all workers) whose prediction, made on the
  // weights the worker trained on, was right: the running training accuracy.
  double train_accuracy = 0;
  double test_accuracy = -1;     // fraction in [0, 1]; -1 if not evaluated
  double test_loss = -1;
  double elapsed_seconds = 0;    // training wall time so far (evaluation excluded)
};

// How the run was set up, as the reports name it.
struct RunSetup {
  std::string method_spec;
  std::string model;
  int workers = 0;
  int servers = 0;  // parameter-server ranks (0 for the allreduce methods)
  std::size_t batch = 0;
  std::string network;
  std::string codec;
  std::string segmenting;  // allreduce message segmenting in effect ("256 KiB", "unsegmented")
  std::string allreduce;   // the gradient allreduce's algorithm ("auto" resolved)
  int staleness = 0;       // the method's iteration dependency K
  std::string lr_schedule = "constant";  // LrScheduleSpec::describe(): "step:1:0.5, warm-up 10 iterations"
};

// The timing of the measured iterations and what the models predict from them.
struct RunTiming {
  std::int64_t iterations = 0;           // completed (all of the plan's, unless interrupted)
  // The iterations [first_timed, iterations) the timing means cover: warm-up and start-up
  // excluded, and in a resumed run everything before 10 iterations past where it resumed.
  std::int64_t first_timed = 0;
  std::int64_t measured_iterations = 0;  // iterations - first_timed
  // Wall time of all iterations (evaluation excluded), a resumed run's included up to its
  // checkpoint.
  double train_seconds = 0;
  StageTimes stages;                     // the measured stage times the models use
  double predicted_sync_iteration = 0;   // Eq. 2
  double predicted_pipe_iteration = 0;   // Eq. 4
  double scaling_efficiency = 0;         // Eq. 7 from the stage times
  // Eq. 5 from the link (none: all 0): the emulated network's α and β, else the calibration's; γ
  // the calibration's (0 without one). An allreduce method's runs only (Eq. 5 is the ring's).
  RingCostParameters link_model;
  std::string link_model_source;         // where link_model came from ("" : none)
  double link_model_comm = 0;            // Eq. 5's comm term
  double predicted_pipe_sequential_iteration = 0;  // Eq. 5: max(compute, link_model_comm)
  std::uint64_t bytes_sent_per_iteration = 0;  // per worker
};

struct ReliabilityCounts {
  std::int64_t nonfinite_skipped = 0;   // --on-nonfinite skip: layers zeroed, all workers
  std::int64_t consistency_checks = 0;  // --check-consistency: checks passed
  std::int64_t resumed_from = -1;       // --resume: the iteration the run continued from
  // A run that continued the commit of another world (RunPlan::shift): that world's workers (0: none)
  // and the factor every learning rate carries (the workers now over the workers that started the run).
  int resumed_from_workers = 0;
  double learning_rate_scale = 1.0;
};

// A run stopped early by a signal (core/interrupt.h) after `at_iteration` of `of_iterations`.
struct Interruption {
  int signal = 0;
  std::int64_t at_iteration = 0;
  std::int64_t of_iterations = 0;
  // The workers whose times the summary and metrics.jsonl hold: all, except under MPI, where the
  // ranks stop separately and rank 0 reports its own.
  int workers_reported = 0;
};

// A failure the run recovered from by rolling back to a commit (--restarts, train/elastic.h).
struct Recovery {
  int attempt = 0;                  // the restart that followed it (1: the first)
  std::string failure;              // the failure's one line
  std::int64_t reached = 0;         // iterations the furthest worker had completed when it failed
  // The commit the run continued from (0: the start; -1: unknown, an MPI relaunch before the last).
  std::int64_t rolled_back_to = 0;
  std::int64_t iterations_redone() const {
    return rolled_back_to >= 0 && reached > rolled_back_to ? reached - rolled_back_to : 0;
  }
  // From the failure (an injected fault's firing, else its detection) to the attempt's end; -1
  // where the moment of the failure is unknown (a process killed from outside).
  double detection_seconds = -1;
  // From the failure (or its detection) to the first iteration completed after the rollback.
  double recovery_seconds = 0;
  // From the commit rolled back to being taken, to that first iteration: the work redone, the
  // detection and the restart.
  double seconds_lost = 0;
  // The moments (Unix seconds) of the failure as known (the fault's firing; under MPI, mpirun's
  // end) and of that first iteration's end (0: it never came).
  double failed_at_unix_s = 0;
  double resumed_at_unix_s = 0;
};

struct RunSummary {
  RunSetup setup;
  // The whole configuration as summary.json records it (train/run_description.h).
  nlohmann::json configuration;
  std::optional<Interruption> interrupted;
  // The figures compare and the method reports show: method spec, means per iteration,
  // throughput, the predicted iteration (the method's model, else Eq. 2 or Eq. 4), accuracies,
  // and the method's report.
  RunFigures figures;
  RunTiming timing;
  ReliabilityCounts reliability;
  // The method's deferred phase if the run ended before it (report/short_run.h).
  std::optional<DeferredPhase> unreached_phase;
  std::vector<EpochRecord> epochs;
  std::uint64_t weights_checksum = 0;                // FNV-1a of rank 0's final parameters
  std::vector<std::vector<float>> final_parameters;  // per rank, if TrainConfig::keep_parameters
  std::string model_file;  // the TorchScript model written to --out ("": none; train/checkpointing.h)
  std::vector<Recovery> recoveries;  // --restarts: the failures recovered from, in order
};

}  // namespace pipesgd
