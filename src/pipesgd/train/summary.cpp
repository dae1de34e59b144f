#include "pipesgd/train/summary.h"

#include <algorithm>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/core/checksum.h"
#include "pipesgd/timing/allreduce_cost_model.h"
#include "pipesgd/timing/pipe_timing_model.h"
#include "pipesgd/train/run_description.h"

namespace pipesgd {
namespace {

RunSetup describe_setup(const RunContext& run, const FlatParameters& model) {
  const TrainConfig& config = run.config;
  const MethodSelection& method = config.method;
  RunSetup setup;
  setup.method_spec = method.spec;
  setup.model = config.model;
  setup.workers = config.workers;
  setup.servers = run.servers;
  setup.batch = config.batch;
  setup.network = config.network.name;
  setup.codec = method.common.codec;
  const bool servers = run.servers > 0;
  setup.segmenting = servers ? std::string("none (parameter server)")
                             : describe_segment_bytes(
                                   method_allreduce_options(method.common, method.options->default_segment_bytes())
                                       .segment_bytes);
  setup.allreduce = servers ? std::string("none (parameter server)")
                            : resolve_allreduce_algorithm(method.common, config.workers,
                                                          static_cast<double>(model.layout().total()) * sizeof(float));
  setup.staleness = method.options->staleness();
  setup.lr_schedule = method.common.lr_schedule.describe();
  return setup;
}

}  // namespace

RunSummary summarize(const RunContext& run, std::span<WorkerRecord> workers, const LeaderRecord& leader,
                     FlatParameters& model) {
  const TrainConfig& config = run.config;
  const RunPlan& plan = run.plan;
  RunSummary summary;
  summary.setup = describe_setup(run, model);
  summary.configuration = describe_configuration(run, model);

  // The iterations every worker completed (all of them, unless the run stopped early), of which
  // this process measured those from where it started.
  std::int64_t end = plan.total_iterations;
  for (const WorkerRecord& worker : workers) end = std::min(end, worker.completed);
  std::vector<std::vector<IterationTimes>> times;
  for (const WorkerRecord& worker : workers) times.push_back(worker.times);
  const RunTimings timings(times, run.start_iteration(), end);
  IterationTimes mean = timings.mean(plan.first_measured, end);
  // The mean loss covers the same iterations in a resumed run as in the run not interrupted: each
  // worker's sum (in iteration order, continued from its checkpoint) over [loss_from, end).
  mean.loss = 0;
  if (end > plan.loss_from) {
    for (const WorkerRecord& worker : workers) mean.loss += worker.loss_sum;
    mean.loss /= static_cast<double>(workers.size()) * static_cast<double>(end - plan.loss_from);
  }

  RunTiming& timing = summary.timing;
  timing.iterations = end;
  timing.first_timed = std::min(plan.first_measured, end);
  timing.measured_iterations = end - timing.first_timed;
  timing.train_seconds = leader.train_seconds;
  // The compute thread is busy for the whole iteration except its exposed waits. Compensation (a
  // method's delay compensation or weight prediction) is update work for the timing model; `other`
  // is what no stage accounts for.
  const double busy = mean.iteration - mean.wait;
  const double update = mean.update + mean.compensation;
  timing.stages = StageTimes{update, mean.data, mean.forward, mean.backward,
                             std::max(0.0, busy - (update + mean.data + mean.forward + mean.backward)), mean.comm};
  timing.predicted_sync_iteration = predict_dsync_iteration(timing.stages);
  timing.predicted_pipe_iteration = predict_pipe_iteration(timing.stages);
  timing.scaling_efficiency = pipe_scaling_efficiency(timing.stages.compute(), timing.stages.comm);
  const Calibration* calibration = config.method.common.calibration.get();
  if ((config.network.emulated() || calibration) && run.servers == 0) {  // Eq. 5 is the ring's, not the server's
    RingCostParameters& link = timing.link_model;
    if (config.network.emulated()) {
      link.alpha = config.network.latency_seconds;
      link.beta = config.network.bits_per_second > 0 ? 1.0 / config.network.bytes_per_second() : 0;
    } else {
      link.alpha = calibration->link.alpha;
      link.beta = calibration->link.beta;
    }
    if (calibration) link.gamma = calibration->link.gamma;
    timing.link_model_source = !config.network.emulated() ? "alpha, beta and gamma of the calibration"
                               : calibration             ? "alpha and beta of the emulated link, gamma of the calibration"
                                                         : "alpha and beta of the emulated link, gamma 0 without a calibration";
    const double bytes = static_cast<double>(model.layout().total()) *
                         bytes_per_element(*make_codec(config.method.common.codec));
    timing.link_model_comm = ring_allreduce_time(config.workers, bytes, link);
    timing.predicted_pipe_sequential_iteration =
        predict_pipe_sequential_iteration(timing.stages.compute(), timing.link_model_comm);
  }
  std::uint64_t bytes = 0;
  for (const WorkerRecord& worker : workers) bytes += worker.bytes_sent;
  timing.bytes_sent_per_iteration =
      end > 0 ? bytes / static_cast<std::uint64_t>(workers.size()) / static_cast<std::uint64_t>(end) : 0;

  // The method's report measures itself; its own model, if any, predicts the iteration. (A worker
  // other than rank 0 summarizes its own view only: no report, no epochs.)
  const std::shared_ptr<MethodReport> report =
      leader.method_report ? leader.method_report : std::make_shared<MethodReport>();
  report->measure(timings, plan.first_measured);
  RunFigures& figures = summary.figures;
  figures.method_spec = config.method.spec;
  figures.model = config.model;
  figures.mean = mean;
  figures.compute = busy;
  figures.throughput = mean.iteration > 0 ? static_cast<double>(config.workers * config.batch) / mean.iteration : 0;
  // A pipelined method's deferred phase is its pipeline: a run that ends before it never pipelined.
  const bool pipelined = config.method.options->pipelined() && !plan.unreached_phase &&
                         plan.warmup_iterations < end;
  figures.predicted_iteration = pipelined ? timing.predicted_pipe_iteration : timing.predicted_sync_iteration;
  if (report->predicted_iteration() > 0) figures.predicted_iteration = report->predicted_iteration();
  figures.report = report;

  summary.epochs = leader.epochs;
  if (!summary.epochs.empty()) {
    figures.final_test_accuracy = summary.epochs.back().test_accuracy;
    figures.final_train_accuracy = summary.epochs.back().train_accuracy;
  }
  for (const WorkerRecord& worker : workers) summary.reliability.nonfinite_skipped += worker.nonfinite_skipped;
  summary.reliability.consistency_checks = leader.consistency_checks;
  summary.reliability.resumed_from = run.resume_from ? run.resume_from->iteration : -1;
  if (run.resumed_world && run.resumed_world->workers != run.config.workers) {
    summary.reliability.resumed_from_workers = run.resumed_world->workers;
  }
  summary.reliability.learning_rate_scale = run.plan.world_scale;
  summary.unreached_phase = plan.unreached_phase;
  if (config.keep_parameters) {
    for (WorkerRecord& worker : workers) summary.final_parameters.push_back(std::move(worker.final_parameters));
  }
  summary.weights_checksum = checksum_of(model.parameters());
  return summary;
}

}  // namespace pipesgd
