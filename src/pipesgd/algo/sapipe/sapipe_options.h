#pragma once
// SAPipe's options (algo/sapipe/sapipe.h): how many first layers are stale, their compensation,
// the plan of the synchronous layers, the profiling and the warm-up.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pipesgd/algo/method_options.h"

namespace pipesgd {

// --dc-lambda's default for sapipe (SAPipe paper Sec. 5.1: "lambda empirically set as 0.2").
inline constexpr double kSapipeDefaultLambda = 0.2;

// The stale range's compensation, in the order of compensation_names().
enum class Compensation { kNone, kDelay, kPredictLocal, kPredictSynchronized, kPredictCombined };
// --compensation values: none, dc, wp1, wp2, wp3.
std::vector<std::string> compensation_names();
bool predicts(Compensation compensation);      // wp1, wp2, wp3
bool has_dc_term(Compensation compensation);   // dc, wp3: lambda and --dc-bound apply
// --compensation's default: wp3 (SAPipe paper Sec. 5.1: "SAPipe uses Option 3 in Algorithm 3 as the
// default staleness compensation method").
inline constexpr Compensation kSapipeDefaultCompensation = Compensation::kPredictCombined;
std::string compensation_name(Compensation compensation);
// An estimate of the compensation's compute, in optimizer updates of the stale range beyond its own
// update (none 0, dc 1, wp1 1, wp2 1, wp3 2): the simulator's without a measured cost, and auto's
// prediction.
double compensation_update_passes(Compensation compensation);

// "auto" or a layer count in [0, layers] (kLayersUnknown: any count >= 0); throws UsageError
// otherwise (naming --stale-layers). Returns -1 for auto.
inline constexpr std::size_t kLayersUnknown = static_cast<std::size_t>(-1);
long parse_stale_layers(const std::string& text, std::size_t layers);

class SapipeOptions final : public MethodOptions {
 public:
  long stale_layers = -1;  // k as given; -1: auto
  Compensation compensation = kSapipeDefaultCompensation;
  double lambda = kSapipeDefaultLambda;  // dc and wp3 (applied in fp32)
  // dc and wp3: the DC term's scalar is bounded per step (--dc-bound on, stale_compensation.h);
  // off (the default) is Alg. 2 / Alg. 3 as printed.
  bool dc_bound = false;
  std::string sync_plan = "optimal";    // the synchronous layers' bucket plan (timing/bucket_plan.h)
  std::int64_t profile_iterations = 10;
  WarmUp warmup_given;

  bool automatic() const { return stale_layers < 0; }
  // True if k or the synchronous plan (optimal, mgwfbp) needs measured times: the partition is
  // decided after the profiling.
  bool needs_profile() const;
  // The first pipelined iteration: the warm-up, or after the profiling when k is auto or the
  // synchronous plan (optimal, mgwfbp) needs measured times.
  std::int64_t pipeline_start(std::int64_t warmup_iterations) const;

  WarmUp warmup() const override { return warmup_given; }
  // Pipelining, from pipeline_start(warmup_iterations).
  std::optional<DeferredPhase> deferred_phase(std::int64_t warmup_iterations) const override;
  int staleness() const override { return 2; }
  bool pipelined() const override { return true; }
  std::string fingerprint() const override;
  // Weight prediction (wp1-3) computes the next update with the optimizer's rule.
  std::string needs_update_rule() const override;
};

}  // namespace pipesgd
