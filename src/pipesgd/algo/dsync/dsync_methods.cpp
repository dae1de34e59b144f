// The registry entries of the D-Sync family (algo/dsync/dsync_methods.h).
#include "pipesgd/algo/dsync/dsync_methods.h"

#include <algorithm>

#include "pipesgd/algo/dsync/bucketed_dsync.h"
#include "pipesgd/algo/dsync/dsync.h"
#include "pipesgd/algo/dsync/dsync_options.h"
#include "pipesgd/algo/dsync/dsync_simulation.h"
#include "pipesgd/algo/dsync/layer_wise_report.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

constexpr const char* kLayerWiseHint =
    "applies only to layer-wise communication: add --buckets PLAN (or use wfbp, synceasgd, mgwfbp, dsync+PLAN)";

bool buckets_given(const OptionValues& given) { return given.has("--buckets"); }

// --profile-iters and --replan-every; for dsync only with a bucket plan.
std::vector<OptionDeclaration> planning_declarations(bool always) {
  OptionDeclaration profile = profile_iterations_declaration(
      "Iterations profiled before each plan is computed (the first half with one bucket: per-layer backward "
      "times; the rest with one bucket per layer: the slowdown each allreduce causes)");
  OptionDeclaration replan("--replan-every", "Start a new profiling cycle (and plan) N iterations after each plan (0: never)", "0");
  if (!always) {
    for (OptionDeclaration* option : {&profile, &replan}) {
      option->applies = buckets_given;
      option->condition = "with --buckets PLAN or +PLAN";
      option->rejection = [flag = option->flag](const OptionValues&, std::string_view) {
        return concat(flag, " ", kLayerWiseHint);
      };
    }
  }
  return {profile, replan};
}

std::shared_ptr<const MethodOptions> parse_dsync_options(const OptionValues& given, const std::string& implied_plan) {
  auto options = std::make_shared<DsyncOptions>();
  options->buckets = given.text("--buckets", implied_plan);
  if (options->layer_wise()) check_bucket_plan_name(options->buckets);
  options->profile_iterations = checked_profile_iterations(given.integer("--profile-iters", options->profile_iterations));
  options->replan_every = given.integer("--replan-every", options->replan_every);
  if (options->replan_every < 0 || options->replan_every > kMaxProfileIterations) {
    throw UsageError(concat("--replan-every must be in [0, ", kMaxProfileIterations, "] (0: never), got ",
                            options->replan_every));
  }
  return options;
}

// D-Sync: the compute thread's work, then the allreduce of the whole gradient (Pipe-SGD Eq. 2).
// Layer-wise: the MG-WFBP timeline of the plan the method would make from the same profile, its
// last bucket ending no earlier than backward's tail, then the update.
IterationPrediction predict_dsync(const MethodOptions& options, const CommonOptions& common,
                                  const PlanningInputs& measured, int) {
  const DsyncOptions& dsync = options_as<DsyncOptions>(options);
  IterationPrediction prediction;
  prediction.compute_seconds = measured_compute_seconds(measured);
  if (!dsync.layer_wise()) {
    prediction.exposed_seconds = whole_gradient_allreduce_seconds(measured, common.codec);
    prediction.seconds = prediction.compute_seconds + prediction.exposed_seconds;
    prediction.model = "Pipe-SGD Eq. 2: compute + allreduce";
    return prediction;
  }
  const LayerProfile profile = profile_for_codec(measured.profile, common.codec);
  const BucketPlan plan = make_bucket_plan(dsync.buckets, profile, measured.cost);
  const PlanTimeline timeline = simulate_plan(profile, measured.cost, plan);
  prediction.seconds =
      std::max(timeline.iteration, timeline.backward_end + measured.backward_tail_seconds) + measured.update_seconds;
  prediction.exposed_seconds = std::max(0.0, prediction.seconds - prediction.compute_seconds);
  prediction.model = concat("the MG-WFBP timeline of ", describe_plan(plan));
  return prediction;
}

std::unique_ptr<TrainingMethod> make_dsync(const MethodContext& context) {
  if (options_as<DsyncOptions>(context.options).layer_wise()) return std::make_unique<BucketedDSync>(context);
  return std::make_unique<DSync>(context);
}

// wfbp, synceasgd, mgwfbp: layer-wise D-Sync with a fixed plan.
MethodDescriptor fixed_plan_method(std::string name, std::string plan, std::string summary) {
  MethodDescriptor method;
  method.name = name;
  method.summary = std::move(summary);
  method.commit = "the optimizer's state (momentum, or Adam's moments and step), and with a bucket plan the plan chosen, the profile it was chosen from and the re-planning cycle; nothing is in flight at a commit (the buckets are waited for)";
  method.traits.replicas_identical = true;
  method.options = allreduce_method_declarations(CalibrationUse::kAlways);
  for (OptionDeclaration& option : planning_declarations(true)) method.options.push_back(std::move(option));
  method.parse = [plan](const OptionValues& given) { return parse_dsync_options(given, plan); };
  method.make = [](const MethodContext& context) { return std::make_unique<BucketedDSync>(context); };
  method.simulate = simulate_dsync;
  method.predict = predict_dsync;
  method.advise = [name](int) { return std::vector<AdvisedVariant>{{name, {}, ""}}; };
  method.spec_hint = [name, plan](std::string_view part) -> std::string {
    if (!is_bucket_plan_name(part)) return "";
    return concat("method '", name, "' is dsync with the ", plan, " plan; for the ", part, " plan use dsync+", part);
  };
  method.tables = {layer_wise_table()};
  return method;
}

}  // namespace

MethodDescriptor dsync_method() {
  MethodDescriptor method;
  method.name = "dsync";
  method.summary = "D-Sync: compute, allreduce, update (the Pipe-SGD paper's baseline); with a bucket plan (+PLAN or "
                   "--buckets) layer-wise, each bucket allreduced as backward makes it ready";
  method.commit = "the optimizer's state (momentum, or Adam's moments and step), and with a bucket plan the plan chosen, the profile it was chosen from and the re-planning cycle; nothing is in flight at a commit (the buckets are waited for)";
  method.traits.replicas_identical = true;
  method.options = allreduce_method_declarations(CalibrationUse::kWithAutoOrBuckets);
  OptionDeclaration buckets = buckets_declaration(
      "Layer-wise allreduce of buckets of consecutive layers, launched as backward makes them ready: wfbp (one per "
      "layer), single (one after backward, SyncEASGD), mgwfbp (MG-WFBP Alg. 1), optimal (exact DP), fixed:<MiB> "
      "(DDP-like). Without a plan: one allreduce after backward, on the compute thread");
  method.options.push_back(buckets);
  for (OptionDeclaration& option : planning_declarations(false)) method.options.push_back(std::move(option));
  method.parse = [](const OptionValues& given) { return parse_dsync_options(given, ""); };
  method.make = make_dsync;
  method.simulate = simulate_dsync;
  method.predict = predict_dsync;
  method.advise = [](int) {
    return std::vector<AdvisedVariant>{{"dsync", {}, ""}, {"dsync+optimal", {}, ""}, {"dsync+fixed:25", {}, ""}};
  };
  method.tables = {layer_wise_table()};
  return method;
}

MethodDescriptor wfbp_method() {
  return fixed_plan_method("wfbp", "wfbp", "layer-wise D-Sync, one bucket per layer (the MG-WFBP paper's WFBP)");
}

MethodDescriptor synceasgd_method() {
  return fixed_plan_method("synceasgd", "single",
                           "layer-wise D-Sync, one bucket allreduced after backward on the comm thread (SyncEASGD)");
}

MethodDescriptor mgwfbp_method() {
  return fixed_plan_method("mgwfbp", "mgwfbp", "layer-wise D-Sync with MG-WFBP's merged buckets (MG-WFBP paper Alg. 1)");
}

}  // namespace pipesgd
