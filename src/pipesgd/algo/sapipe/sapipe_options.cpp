#include "pipesgd/algo/sapipe/sapipe_options.h"

#include <algorithm>
#include <charconv>

#include "pipesgd/algo/planning.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

std::vector<std::string> compensation_names() { return {"none", "dc", "wp1", "wp2", "wp3"}; }

bool predicts(Compensation compensation) {
  return compensation == Compensation::kPredictLocal || compensation == Compensation::kPredictSynchronized ||
         compensation == Compensation::kPredictCombined;
}

bool has_dc_term(Compensation compensation) {
  return compensation == Compensation::kDelay || compensation == Compensation::kPredictCombined;
}

std::string compensation_name(Compensation compensation) {
  return compensation_names()[static_cast<std::size_t>(compensation)];
}

double compensation_update_passes(Compensation compensation) {
  switch (compensation) {
    case Compensation::kNone: return 0;
    case Compensation::kDelay:
    case Compensation::kPredictLocal:
    case Compensation::kPredictSynchronized: return 1;
    case Compensation::kPredictCombined: return 2;
  }
  return 0;
}

long parse_stale_layers(const std::string& text, std::size_t layers) {
  if (text == "auto") return -1;
  long value = -1;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const bool parsed = error == std::errc() && end == text.data() + text.size() && value >= 0;
  if (layers == kLayersUnknown) {
    if (!parsed) throw UsageError(concat("--stale-layers must be auto or a layer count >= 0, got '", text, "'"));
  } else if (!parsed || static_cast<std::size_t>(value) > layers) {
    throw UsageError(concat("--stale-layers must be auto or a layer count in [0, ", layers,
                            "] (the model has ", layers, " layers), got '", text, "'"));
  }
  return value;
}

bool SapipeOptions::needs_profile() const {
  // Plans that need measured times (the others follow from the layer sizes alone).
  return automatic() || sync_plan == "optimal" || sync_plan == "mgwfbp";
}

std::int64_t SapipeOptions::pipeline_start(std::int64_t warmup_iterations) const {
  if (!needs_profile()) return warmup_iterations;
  return std::max(warmup_iterations, kProfileWarmupIterations + profile_iterations);
}

std::optional<DeferredPhase> SapipeOptions::deferred_phase(std::int64_t warmup_iterations) const {
  const std::int64_t start = pipeline_start(warmup_iterations);
  const std::string event = "SAPipe starts pipelining";
  const std::string before =
      "until then every iteration runs synchronously: the whole gradient in one allreduce after backward, no layer "
      "stale";
  if (start == warmup_iterations) return warmup_phase(warmup_iterations, event, before);
  return DeferredPhase{start, event,
                       concat("after ", kProfileWarmupIterations, " start-up and ", profile_iterations,
                              profile_iterations == 1 ? " profiling iteration, which chooses "
                                                      : " profiling iterations, which choose ",
                              automatic() ? "k and " : "",
                              "the synchronous layers' ", sync_plan, " plan"),
                       before};
}

std::string SapipeOptions::fingerprint() const {
  return concat("stale layers ", automatic() ? std::string("auto") : concat(stale_layers), ", compensation ",
                compensation_name(compensation), ", lambda ", lambda,
                has_dc_term(compensation) ? concat(", dc bound ", dc_bound ? "on" : "off") : std::string(), ", plan ",
                sync_plan, ", profile ", profile_iterations);
}

std::string SapipeOptions::needs_update_rule() const {
  if (!predicts(compensation)) return "";
  return concat("SAPipe's weight prediction (+", compensation_name(compensation),
                ") computes the next update with the optimizer's own rule: use sapipe+dc or sapipe+none");
}

}  // namespace pipesgd
