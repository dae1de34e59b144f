#pragma once
// What a method says about its run, beside the trainer's generic figures: its plan, its own timing
// model, its paragraph of `train`'s report, its fields of summary.json and compare.json, and the
// tables `compare` prints for its family. Each method derives its report (algo/<method>/); the
// trainer and the report printer use only this interface.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/algo/iteration_times.h"

namespace pipesgd {

class MethodReport;
struct PlanningInputs;  // algo/planning.h

// The figures of one finished run that a method's report may show beside its own (rank 0's view;
// means over the workers and the measured iterations), and the method's report.
struct RunFigures {
  std::string method_spec;           // as given, e.g. "pipe+int8"
  std::string model;                 // e.g. "mlp"
  IterationTimes mean;               // per iteration
  double compute = 0;                // the compute thread's busy time per iteration (iteration - wait)
  double throughput = 0;             // samples/s
  double predicted_iteration = 0;    // the iteration time the method's model predicts
  double final_train_accuracy = -1;  // the last epoch's running training accuracy; -1: none (no epoch ended)
  double final_test_accuracy = -1;   // -1: not evaluated
  std::shared_ptr<const MethodReport> report;  // never null once the run is summarized
};

// Every worker's per-iteration times of a finished run (rank 0 has them all, threads or MPI), indexed
// by iteration. Only the iterations [first_recorded, iterations) were measured: a run resumed from a
// checkpoint starts there, one stopped early ends there.
class RunTimings {
 public:
  RunTimings(std::span<const std::vector<IterationTimes>> per_worker, std::int64_t first_recorded,
             std::int64_t end_recorded)
      : per_worker_(per_worker), first_(first_recorded), end_(end_recorded) {}
  // The mean over every worker and the measured iterations of [first, end) (zeros if none).
  IterationTimes mean(std::int64_t first, std::int64_t end) const;
  // The measured iterations of [first, end).
  std::int64_t recorded(std::int64_t first, std::int64_t end) const {
    return std::max<std::int64_t>(0, std::min(end, end_) - std::max(first, first_));
  }
  std::int64_t first_recorded() const { return first_; }
  // The iterations the run completed.
  std::int64_t iterations() const { return end_; }

 private:
  std::span<const std::vector<IterationTimes>> per_worker_;
  std::int64_t first_;
  std::int64_t end_;
};

class MethodReport {
 public:
  virtual ~MethodReport() = default;
  // Called once on rank 0 after the run, with every worker's times and the measured range.
  virtual void measure(const RunTimings& timings, std::int64_t first_measured) {
    (void)timings;
    (void)first_measured;
  }
  // The bucket plan in use ("" for methods without buckets).
  virtual std::string bucket_plan() const { return ""; }
  // Gradient allreduces per iteration (0: not an allreduce method).
  virtual std::size_t allreduce_calls() const { return 0; }
  // The iteration time the method's own timing model predicts (0: none; Pipe-SGD's Eq. 2 or Eq. 4
  // apply then) and that model's name for "This method follows ..." ("" : Eq. 2 / Eq. 4).
  virtual double predicted_iteration() const { return 0; }
  virtual std::string timing_model() const { return ""; }
  // What the method planned its buckets from (layer profile, allreduce cost, update time), once it
  // has planned; null for a method that does not plan. `pipesgd plan` profiles through it.
  virtual const PlanningInputs* planning_inputs() const { return nullptr; }
  // The method's fields of summary.json (added to `summary`) and of its compare.json record.
  virtual void add_json(nlohmann::json& summary, const RunFigures& run) const {
    (void)summary;
    (void)run;
  }
  // The method's paragraph in `train`'s report (after the timing models), if any.
  virtual void print(std::ostream& out, const RunFigures& run) const {
    (void)out;
    (void)run;
  }
};

// The report of a method with nothing to add but its allreduces per iteration (dsync, pipe).
class AllreduceCallsReport final : public MethodReport {
 public:
  explicit AllreduceCallsReport(std::size_t calls) : calls_(calls) {}
  std::size_t allreduce_calls() const override { return calls_; }

 private:
  std::size_t calls_;
};

// A table `compare` prints after its main table when a method of its family was compared. Tables
// are printed once per id, in the registry's order; `print` sees every compared run, in order.
struct ComparisonTable {
  std::string id;
  std::function<void(std::ostream& out, std::span<const RunFigures> runs)> print;
};

}  // namespace pipesgd
