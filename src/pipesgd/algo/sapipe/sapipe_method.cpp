#include "pipesgd/algo/sapipe/sapipe_method.h"

#include <algorithm>
#include <cmath>

#include "pipesgd/algo/planning.h"
#include "pipesgd/algo/sapipe/sapipe.h"
#include "pipesgd/algo/sapipe/sapipe_partition.h"
#include "pipesgd/algo/sapipe/sapipe_report.h"
#include "pipesgd/algo/sapipe/sapipe_simulation.h"
#include "pipesgd/algo/sapipe/stale_compensation.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

bool is_compensation(std::string_view name) {
  const std::vector<std::string> names = compensation_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// --compensation as given, or the default; throws UsageError for an unknown name.
Compensation given_compensation(const OptionValues& given) {
  const std::string compensation = given.text("--compensation", compensation_name(kSapipeDefaultCompensation));
  const std::vector<std::string> names = compensation_names();
  const auto found = std::find(names.begin(), names.end(), compensation);
  if (found == names.end()) {
    throw UsageError(concat("unknown --compensation '", compensation, "' (expected ", join(names), ")"));
  }
  return static_cast<Compensation>(found - names.begin());
}

std::shared_ptr<const MethodOptions> parse_sapipe_options(const OptionValues& given) {
  auto options = std::make_shared<SapipeOptions>();
  options->stale_layers = parse_stale_layers(given.text("--stale-layers", "auto"), kLayersUnknown);
  options->compensation = given_compensation(given);
  const double lambda = given.real("--dc-lambda", kSapipeDefaultLambda);
  if (!(lambda >= 0) || !std::isfinite(lambda)) {
    throw UsageError(concat("--dc-lambda must be >= 0 and finite, got ", given.text("--dc-lambda", "")));
  }
  options->lambda = lambda;
  const std::string bound = given.text("--dc-bound", "off");
  if (bound != "off" && bound != "on") throw UsageError(concat("--dc-bound must be off or on, got '", bound, "'"));
  options->dc_bound = bound == "on";
  options->sync_plan = given.text("--buckets", "optimal");
  check_bucket_plan_name(options->sync_plan);
  options->profile_iterations = checked_profile_iterations(given.integer("--profile-iters", options->profile_iterations));
  options->warmup_given = parse_warmup(given, 0);
  return options;
}

// SAPipe's steady state from a layer-wise D-Sync profile (`auto`): k and the plan as the method
// makes them from the same numbers (SaPipe with MethodContext::planned_from), the forward spread
// over the layers like their backward; the timeline of compute and communication
// (simulate_bucketed_staleness), then backward's tail, the update and the compensation's estimated
// compute (compensation_update_passes updates of the stale range), which the timeline leaves out.
IterationPrediction predict_sapipe(const MethodOptions& options, const CommonOptions& common,
                                   const PlanningInputs& measured, int) {
  const SapipeOptions& sapipe = options_as<SapipeOptions>(options);
  const StalenessProfile profile = staleness_profile_from(measured, common.codec);
  const StalenessPlan plan = sapipe_staleness_plan(profile, measured.cost, sapipe.sync_plan, sapipe.stale_layers);
  double total = 0, stale = 0;
  for (std::size_t s = 0; s < profile.bytes.size(); ++s) {
    total += profile.bytes[s];
    if (s < plan.stale_layers) stale += profile.bytes[s];
  }
  const double compensation =
      measured.update_seconds * (total > 0 ? stale / total : 0) * compensation_update_passes(sapipe.compensation);
  IterationPrediction prediction;
  prediction.compute_seconds = measured_compute_seconds(measured) + compensation;
  prediction.seconds = plan.timeline.iteration + measured.backward_tail_seconds + measured.update_seconds + compensation;
  prediction.exposed_seconds = std::max(0.0, prediction.seconds - prediction.compute_seconds);
  prediction.model = concat("SAPipe's timeline: k = ", plan.stale_layers, " of ", profile.bytes.size(), " layers stale",
                            plan.stalls ? " (every k stalls)" : "", ", ", compensation_name(sapipe.compensation),
                            plan.sync_plan.buckets.empty() ? std::string() : concat(", ", describe_plan(plan.sync_plan)));
  return prediction;
}

}  // namespace

MethodDescriptor sapipe_method(const std::string& baseline) {
  MethodDescriptor method;
  method.name = "sapipe";
  method.commit = "the optimizer's state, the stale layers' gradients of the step in flight (its allreduces "
                  "waited for), where the pipeline is, the profile and partition (k) chosen so far, the stall "
                  "monitor, and the compensation's state (DC's backups, weight prediction's deferred steps)";
  method.summary = "SAPipe (the SAPipe paper): the first k layers 1-step stale with compensation (by default the paper's "
                   "wp3, weight prediction option 3; +none, +dc, +wp1, +wp2), the rest synchronous in buckets applied "
                   "before each layer's forward";
  method.traits.replicas_identical = true;
  method.traits.needs_forward_hooks = true;
  method.options = allreduce_method_declarations(CalibrationUse::kAlways);
  // "+none" names the compensation (sapipe+none: vanilla SAPipe), not the codec (none by default).
  for (OptionDeclaration& option : method.options) {
    if (option.flag != "--codec") continue;
    option.spec_value = [is_codec = option.spec_value](std::string_view value) {
      return value != "none" && is_codec(value);
    };
    std::vector<std::string> codecs = codec_names();
    codecs.erase(std::remove(codecs.begin(), codecs.end(), "none"), codecs.end());
    option.spec_values = join(codecs);
  }
  OptionDeclaration buckets = buckets_declaration("The synchronous layers' bucket plan");
  buckets.default_text = "optimal";
  method.options.push_back(buckets);
  method.options.push_back(profile_iterations_declaration(
      "Iterations profiled (per-layer forward and backward times) before k and the plan are chosen"));
  OptionDeclaration stale_layers("--stale-layers", "How many first layers train on 1-step-stale gradients: auto (the least k whose pipeline never "
                      "stalls, from the profiled layer times and the allreduce cost) or a count", "auto");
  method.options.push_back(stale_layers);
  OptionDeclaration compensation("--compensation", "Staleness compensation of the stale layers: none (vanilla SAPipe, Alg. 1), "
                      "dc (delay compensation, Alg. 2), wp1|wp2|wp3 (weight prediction with the local, the synchronized, "
                      "or the combined gradient with DC, Alg. 3 options 1-3; wp3 is the paper's default, Sec. 5.1)",
                      compensation_name(kSapipeDefaultCompensation));
  compensation.spec_value = is_compensation;
  compensation.spec_kind = "compensation";
  compensation.spec_values = join(compensation_names());
  method.options.push_back(compensation);
  OptionDeclaration lambda("--dc-lambda", "Delay compensation lambda of dc and wp3 (SAPipe paper Sec. 5.1's 0.2)", concat(kSapipeDefaultLambda));
  method.options.push_back(lambda);
  OptionDeclaration bound("--dc-bound", "off: the DC term g + lambda g g^T D as printed (Eq. 1, Alg. 2, Alg. 3 option 3); "
                          "on: |lambda g^T D| clamped to 1 - 1/sqrt(2) each step, Theorem 3's condition on lambda "
                          "enforced per step (a safeguard against a factor 1 + lambda g^T D <= 0 turning the step uphill, "
                          "not in the paper; the summary counts the clamped updates)", "off");
  bound.applies = [](const OptionValues& given) { return has_dc_term(given_compensation(given)); };
  bound.condition = "with --compensation dc or wp3";
  bound.rejection = [](const OptionValues& given, std::string_view method) {
    return concat("--dc-bound applies only to ", method, " with --compensation dc or wp3 (the DC term's bound), not ",
                  compensation_name(given_compensation(given)));
  };
  method.options.push_back(bound);
  for (OptionDeclaration& option : warmup_declarations("run synchronously", "0")) method.options.push_back(std::move(option));
  method.parse = parse_sapipe_options;
  method.make = [](const MethodContext& context) { return std::make_unique<SaPipe>(context); };
  method.simulate = simulate_sapipe;
  method.predict = predict_sapipe;
  method.measure_costs = [](std::size_t elements, const SgdOptions& sgd, int repetitions) {
    std::map<std::string, double> costs;
    for (std::size_t k = 0; k < compensation_names().size(); ++k) {
      const auto kind = static_cast<Compensation>(k);
      costs[sapipe_compensation_cost_name(kind)] = measure_stale_update_seconds(kind, elements, sgd, repetitions);
    }
    return costs;
  };
  method.advise = [](int) {
    return std::vector<AdvisedVariant>{
        {"sapipe", {},
         "partial staleness: the first k layers update with 1-step-stale gradients, compensated by weight prediction "
         "(wp3); SAPipe Sec. 5 reports accuracy within noise of synchronous training"}};
  };
  method.tables = {sapipe_table(baseline)};
  return method;
}

}  // namespace pipesgd
