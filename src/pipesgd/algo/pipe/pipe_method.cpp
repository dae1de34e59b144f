#include "pipesgd/algo/pipe/pipe_method.h"

#include <algorithm>

#include "pipesgd/algo/planning.h"

#include "pipesgd/algo/pipe/pipe_sgd.h"
#include "pipesgd/algo/pipe/pipe_simulation.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

MethodDescriptor pipe_method() {
  MethodDescriptor method;
  method.name = "pipe";
  method.commit = "the optimizer's state and the K-1 aggregated gradients in flight, not applied (the continuation "
                  "applies them at t+1..t+K-1 as the uninterrupted run does); a commit in memory takes each when its "
                  "allreduce ends on its own, so it completes K-1 iterations after its boundary (a checkpoint file "
                  "waits for them); the in-ring codecs (bf16, fp16, int8) keep no residual, so none is saved";
  method.summary = "Pipe-SGD (the paper's Alg. 1): the update at t uses the aggregated gradient of t-K while the "
                   "allreduce of t runs on the comm thread";
  method.traits.replicas_identical = true;
  method.traits.stale_without_compensation = true;
  method.options = allreduce_method_declarations(CalibrationUse::kWithAllreduceAuto);
  OptionDeclaration staleness("--staleness-k", "Pipe-SGD iteration dependency K: the update at t uses the gradient of t-K (K = 1 is D-Sync)", "2");
  method.options.push_back(staleness);
  for (OptionDeclaration& option : warmup_declarations("run as D-Sync", "0")) method.options.push_back(std::move(option));
  method.options.emplace_back(
      "--final-gradients",
      "The aggregated gradients of the last K iterations at the end of training: apply (every computed gradient is "
      "applied; K = 1 is D-Sync bit for bit) or drop (Pipe-SGD paper Alg. 1 as printed: its comm thread reduces "
      "iterations 1..T-K, so T-K gradients are applied)",
      final_gradients_name(FinalGradients::kApply));
  method.parse = [](const OptionValues& given) -> std::shared_ptr<const MethodOptions> {
    auto options = std::make_shared<PipeOptions>();
    const std::int64_t k = given.integer("--staleness-k", options->k);
    if (k < 1 || k > kMaxStaleness) {
      throw UsageError(concat("--staleness-k must be in [1, ", kMaxStaleness, "], got ", k));
    }
    options->k = static_cast<int>(k);
    options->warmup_given = parse_warmup(given, 0);
    options->final_gradients =
        parse_final_gradients(given.text("--final-gradients", final_gradients_name(FinalGradients::kApply)));
    return options;
  };
  method.make = [](const MethodContext& context) { return std::make_unique<PipeSgd>(context); };
  method.simulate = simulate_pipe;
  // Pipe-SGD Eq. 4: with K >= 2 the allreduce of t runs beside the computation of t+1 (Eq. 2 for K = 1).
  method.predict = [](const MethodOptions& options, const CommonOptions& common, const PlanningInputs& measured,
                      int) {
    const int k = options_as<PipeOptions>(options).k;
    const double allreduce = whole_gradient_allreduce_seconds(measured, common.codec);
    IterationPrediction prediction;
    prediction.compute_seconds = measured_compute_seconds(measured);
    prediction.seconds = k >= 2 ? std::max(prediction.compute_seconds, allreduce) : prediction.compute_seconds + allreduce;
    prediction.exposed_seconds = prediction.seconds - prediction.compute_seconds;
    prediction.model = k >= 2 ? "Pipe-SGD Eq. 4: max(compute, allreduce)" : "Pipe-SGD Eq. 2: compute + allreduce";
    return prediction;
  };
  method.advise = [](int) {
    std::vector<AdvisedVariant> variants;
    for (int k : {2, 3, 4}) {
      variants.push_back({"pipe", {{"--staleness-k", std::to_string(k)}},
                          k == 2 ? "staleness: each update applies a gradient 1 iteration stale (Pipe-SGD Sec. 4: "
                                   "with K = 2 only AlexNet lost top-1 accuracy, 0.005, against D-Sync, after a D-Sync "
                                   "warm-up of 4 epochs for AlexNet and ResNet; ours, docs/results.md: within half a point "
                                   "of dsync after 3 epochs of plain SGD, 4 to 10 points below at momentum 0.9)"
                                 : concat("staleness: each update applies a gradient ", k - 1,
                                          " iterations stale (the papers evaluate K = 2 only: expect more accuracy loss, "
                                          "more so with momentum)")});
    }
    return variants;
  };
  return method;
}

}  // namespace pipesgd
