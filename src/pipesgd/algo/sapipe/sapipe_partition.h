#pragma once
// SAPipe's partition (algo/sapipe/sapipe.h): the first k layers (forward order) are the stale
// range, a prefix of the flat buffers; the other layers are synchronous, allreduced in the buckets
// of a plan over them. And what k came from: the profile averaged over the workers, the cost
// a + b·M, the timeline's k (plan_partial_staleness), the paper's program's k for comparison.
// Compute thread only.
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "pipesgd/algo/planning.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/layout.h"
#include "pipesgd/timing/partial_staleness.h"

namespace pipesgd {

// SAPipe's profile from what a layer-wise D-Sync profiling measured (`auto`'s PlanningInputs, which
// hold the forward as a whole and each layer's backward): the forward spread over the layers like
// their backward (equally if backward took no time), each layer's bytes as `codec` puts them on the
// wire (profile_for_codec).
StalenessProfile staleness_profile_from(const PlanningInputs& measured, const std::string& codec);

// k and the synchronous layers' plan `plan_name` for `requested` stale layers (-1: auto, the least k
// whose timeline does not stall, plan_partial_staleness) with its simulated timeline.
StalenessPlan sapipe_staleness_plan(const StalenessProfile& profile, const LinearCost& cost,
                                    const std::string& plan_name, long requested);

class SapipePartition {
 public:
  // An absolute range of segments [begin, end) and of elements [offset, offset + count).
  struct Range {
    std::size_t begin = 0, end = 0;
    std::size_t offset = 0, count = 0;
  };

  // `bytes_per_element`: the codec's encoded size (the profile's layer bytes); `plan_name` the
  // synchronous layers' plan; `cost` the cost model to start from (planning_cost).
  SapipePartition(const Layout& layout, double bytes_per_element, std::string plan_name, LinearCost cost);

  // Uses k stale layers (the plan computed from the profile so far); between iterations.
  void use_fixed(std::size_t stale_layers);
  // After profiling: the averaged profile and cost decide k (auto: `requested` < 0, the least k
  // whose timeline does not stall) and the synchronous plan.
  void plan(const StalenessProfile& profile, const LinearCost& cost, long requested);
  // A stall check found the pipeline stalling at the cost scaled by `scale`: plans again with that
  // cost, at least one more stale layer than now.
  void raise(double scale);

  Range range(std::size_t begin, std::size_t end) const;
  bool planned() const { return planned_; }
  std::size_t layers() const { return layers_; }
  std::size_t stale_layers() const { return stale_layers_; }
  const Range& stale() const { return stale_; }
  const std::vector<Range>& sync_buckets() const { return sync_buckets_; }  // backward order
  const BucketPlan& sync_plan() const { return sync_plan_; }
  const std::string& plan_name() const { return plan_name_; }
  const LinearCost& cost() const { return cost_; }
  const StalenessProfile& profile() const { return profile_; }
  const StalenessPlan& staleness_plan() const { return staleness_plan_; }
  std::optional<std::size_t> paper_stale_layers() const { return paper_stale_layers_; }
  std::size_t timeline_stale_layers() const { return timeline_stale_layers_; }
  // The communication per iteration the cost model predicts for the partition.
  double predicted_communication() const;

  // Checkpoint sections `prefix` + ...; load checks them against this run's layers and `requested`.
  void save(CheckpointWriter& out, const std::string& prefix) const;
  void load(const CheckpointReader& in, const std::string& prefix, long requested);

 private:
  void use(std::size_t stale_layers, const BucketPlan& sync_plan);
  BucketPlan plan_for(std::size_t stale_layers, const LinearCost& cost) const;

  const Layout& layout_;
  const std::size_t layers_;
  const double bytes_per_element_;
  const std::string plan_name_;
  bool planned_ = false;
  std::size_t stale_layers_ = 0;
  Range stale_;
  std::vector<Range> sync_buckets_;
  BucketPlan sync_plan_;
  LinearCost cost_;
  StalenessProfile profile_;  // zeros until measured
  StalenessPlan staleness_plan_;
  std::optional<std::size_t> paper_stale_layers_;
  std::size_t timeline_stale_layers_ = 0;  // k from the timeline before any stall check raised it
};

}  // namespace pipesgd
