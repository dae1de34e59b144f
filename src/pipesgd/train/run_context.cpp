#include "pipesgd/train/run_context.h"

#include "pipesgd/train/elastic.h"

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <utility>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/checkpointing.h"
#include "pipesgd/report/short_run.h"

namespace pipesgd {
namespace {

// The first iteration of the means for a steady state that starts at `start` of `total`: 10
// iterations (10% of a short run) later, as every run's start-up pays one-off costs.
std::int64_t measured_from(std::int64_t start, std::int64_t total) {
  const std::int64_t begin = std::min(start, total);
  const std::int64_t start_up = std::min<std::int64_t>(10, std::max<std::int64_t>(0, total - begin) / 10);
  return std::max<std::int64_t>(0, std::min(total - 1, begin + start_up));
}

// The plan's means, deferred phase and fault checks for its length (plan_run, and again when a
// resumed run continues another world's plan).
void finish_plan(RunPlan& plan, const TrainConfig& config) {
  // The warm-up's epochs are the plan's (a continued world's map to where the committed world's
  // were); its iterations count from the run's start.
  const WarmUp warmup = config.method.options->warmup();
  const std::int64_t warmup_epochs_end =
      warmup.epochs > 0 ? std::max<std::int64_t>(0, plan.epoch_start(warmup.epochs)) : 0;
  plan.warmup_iterations = warmup_epochs_end + warmup.iterations;
  // The means start after the warm-up and whatever else the method does first (profiling, ...).
  plan.first_measured = measured_from(config.method.options->steady_state_start(plan.warmup_iterations),
                                      plan.total_iterations);
  plan.unreached_phase = unreached_phase(*config.method.options, plan.warmup_iterations, plan.total_iterations);
  plan.loss_from = plan.first_measured;
  std::vector<FaultInjection> faults = config.reliability.restart_faults;
  faults.push_back(config.reliability.fault);
  for (const FaultInjection& fault : faults) {
    if (fault.active() && fault.iteration >= plan.total_iterations) {
      throw UsageError(concat("--inject-fault: iteration ", fault.iteration, " is past the run's last (",
                              plan.total_iterations - 1, ")"));
    }
  }
}

RunPlan plan_run(const TrainConfig& config, const Dataset& train) {
  const std::size_t global_batch = static_cast<std::size_t>(config.workers) * config.batch;
  if (train.size < global_batch) {
    throw UsageError(concat("the training set has ", train.size, " examples, fewer than one global batch (",
                            config.workers, " workers x batch ", config.batch, ")"));
  }
  RunPlan plan;
  plan.iterations_per_epoch = static_cast<std::int64_t>(train.size / global_batch);
  plan.total_iterations = config.iterations > 0 ? config.iterations : config.epochs * plan.iterations_per_epoch;
  if (plan.total_iterations > kMaxIterations) {
    throw UsageError(concat("--epochs ", config.epochs, " x ", plan.iterations_per_epoch,
                            " iterations per epoch exceeds the ", kMaxIterations, " iterations a run may have"));
  }
  plan.epochs = (plan.total_iterations + plan.iterations_per_epoch - 1) / plan.iterations_per_epoch;
  plan.base_workers = config.workers;
  finish_plan(plan, config);
  return plan;
}

// Continues the plan of `world`'s commit with this run's workers (docs/user-guide.md, "Continuing
// with another number of workers"): the epoch and its order of examples carry over, this world
// takes up the epoch at the first of its global batches that reaches past the examples the commit
// had trained on (fewer than one global batch of them is seen again), --epochs keeps its count
// (--iters too: it counts iterations, whatever their size), and the learning rate follows the
// global batch.
void continue_world_plan(RunPlan& plan, const TrainConfig& config, const Dataset& train, const CommittedWorld& world) {
  const std::int64_t batch = static_cast<std::int64_t>(config.batch);
  const std::int64_t committed_per_epoch = static_cast<std::int64_t>(train.size) / (world.workers * batch);
  if (committed_per_epoch == 0) {
    throw DataError(concat("the commit in '", config.reliability.checkpoint_dir, "' is of ", world.workers,
                           " workers, whose global batch exceeds this training set of ", train.size, " examples"));
  }
  const std::int64_t position = world.set.iteration - world.shift;  // in the committed world's epochs
  const std::int64_t epoch = position / committed_per_epoch;
  const std::int64_t examples_done = (position % committed_per_epoch) * world.workers * batch;
  const std::int64_t resumed_position = epoch * plan.iterations_per_epoch + examples_done / (config.workers * batch);
  plan.shift = world.set.iteration - resumed_position;
  plan.base_workers = world.base_workers;
  plan.world_scale = static_cast<double>(config.workers) / static_cast<double>(world.base_workers);
  if (config.iterations == 0) plan.total_iterations = plan.shift + config.epochs * plan.iterations_per_epoch;
  if (plan.total_iterations > kMaxIterations) {
    throw UsageError(concat("--epochs ", config.epochs, " continued with ", config.workers, " workers exceeds the ",
                            kMaxIterations, " iterations a run may have"));
  }
  plan.epochs = (std::max<std::int64_t>(0, plan.total_iterations - plan.shift) + plan.iterations_per_epoch - 1) /
                plan.iterations_per_epoch;
  finish_plan(plan, config);
}

// The line a run that continues another world's commit prints.
std::string describe_world_change(const RunContext& run) {
  const CommittedWorld& world = *run.resumed_world;
  const RunPlan& plan = run.plan;
  const std::int64_t iteration = world.set.iteration;
  const std::int64_t batch = static_cast<std::int64_t>(run.config.batch);
  return concat("pipesgd: continuing the commit of ", world.workers, " workers after iteration ", iteration, " with ",
                run.config.workers, " workers: global batch ", run.config.workers * batch, " (was ",
                world.workers * batch, "), learning rate x", std::defaultfloat, std::setprecision(4), plan.world_scale,
                " of the configured (it follows the global batch; the run started with ", world.base_workers,
                " workers), epoch ", plan.epoch_of(iteration) + 1, " continues at its iteration ",
                (iteration - plan.shift) % plan.iterations_per_epoch + 1, " of ", plan.iterations_per_epoch, "\n");
}

}  // namespace

std::string worker_part(int rank) { return concat("rank", rank); }

std::string server_part(int shard) { return concat("server", shard); }

std::vector<std::string> checkpoint_part_names(const TrainConfig& config) {
  std::vector<std::string> parts{"shared"};
  for (int r = 0; r < config.workers; ++r) parts.push_back(worker_part(r));
  for (int s = 0; s < server_ranks(config); ++s) parts.push_back(server_part(s));
  return parts;
}

RunContext prepare_run(const TrainConfig& config, const Dataset& train, bool leader) {
  validate_train_config(config);
  RunContext run{config};
  run.plan = plan_run(config, train);
  run.servers = server_ranks(config);
  run.checkpoint_parts = checkpoint_part_names(config);
  // Fail before training, not after.
  if (leader && !config.out_dir.empty()) ensure_writable_directory(config.out_dir, "--out");
  const ReliabilityOptions& reliability = config.reliability;
  if (config.recovery != nullptr) run.memory_commits = config.recovery->memory_commits.get();
  if (reliability.checkpoint_every > 0 && run.memory_commits == nullptr) {
    ensure_writable_directory(reliability.checkpoint_dir, "--checkpoint-dir");
  }
  if (reliability.resume && run.memory_commits == nullptr) {
    if (config.recovery != nullptr && std::exchange(config.recovery->relaunch_world_found, false)) {
      run.resumed_world = std::move(config.recovery->relaunch_world);  // restart_from_launcher found it
      config.recovery->relaunch_world.reset();
    } else {
      run.resumed_world = find_committed_world(config, [leader](const std::string& line) {
        if (leader) std::cerr << "pipesgd: warning: " << line << "\n";
      });
    }
    if (run.resumed_world) {
      continue_world_plan(run.plan, config, train, *run.resumed_world);
      if (leader && run.resumed_world->workers != config.workers) std::cerr << describe_world_change(run) << std::flush;
    }
  }
  run.fingerprint = run_fingerprint(config, run.plan);
  if (reliability.resume) {
    find_resume_point(run, leader);
    // A resumed run measures its means from 10 iterations after where it resumed.
    run.plan.first_measured =
        std::max(run.plan.first_measured, measured_from(run.resume_from->iteration, run.plan.total_iterations));
  }
  return run;
}

LrSchedule run_learning_rate_schedule(const RunContext& run) {
  return LrSchedule(run.config.method.common.lr_schedule, schedule_length(run.plan));
}

}  // namespace pipesgd
