#pragma once
// The D-Sync family's options (algo/dsync/): D-Sync itself and layer-wise D-Sync with a bucket plan
// (`dsync --buckets PLAN` or `dsync+PLAN`, and the fixed-plan methods wfbp, synceasgd, mgwfbp).
#include <cstdint>
#include <string>

#include "pipesgd/algo/method_options.h"

namespace pipesgd {

class DsyncOptions final : public MethodOptions {
 public:
  // The bucket plan (timing/bucket_plan.h: wfbp, single, mgwfbp, optimal, fixed:<MiB>), or "" for
  // the classic D-Sync: one allreduce after backward, on the compute thread.
  std::string buckets;
  // Layer-wise: iterations profiled before each plan, and how often to plan again (0: never).
  std::int64_t profile_iterations = 10;
  std::int64_t replan_every = 0;

  bool layer_wise() const { return !buckets.empty(); }
  // Layer-wise runs profile first (with other plans): their steady state starts with the plan.
  std::optional<DeferredPhase> deferred_phase(std::int64_t warmup_iterations) const override;
  std::string fingerprint() const override;
};

}  // namespace pipesgd
