#include "pipesgd/algo/training_method.h"

#include "pipesgd/algo/bucketed_dsync.h"
#include "pipesgd/algo/dsync.h"
#include "pipesgd/algo/od_sgd.h"
#include "pipesgd/algo/pipe_sgd.h"
#include "pipesgd/algo/ps_methods.h"
#include "pipesgd/algo/sapipe.h"
#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

std::vector<std::string> method_names() {
  return {"dsync", "pipe", "wfbp", "synceasgd", "mgwfbp", "sapipe", "pssync", "asgd", "dcasgd", "odsgd"};
}

bool replicas_identical(const std::string& method) {
  return method == "dsync" || method == "pipe" || method == "sapipe" || method == "pssync" ||
         !implied_bucket_plan(method).empty();
}

OptimizerOptions optimizer_options(const MethodConfig& config) {
  OptimizerOptions options;
  options.name = config.optimizer;
  options.sgd = config.sgd;
  options.adam = config.adam;
  options.adam.learning_rate = config.sgd.learning_rate;
  options.adam.weight_decay = config.sgd.weight_decay;
  return options;
}

std::string implied_bucket_plan(const std::string& method) {
  if (method == "wfbp") return "wfbp";
  if (method == "synceasgd") return "single";
  if (method == "mgwfbp") return "mgwfbp";
  return "";
}

std::string resolve_allreduce_algorithm(const MethodConfig& config, int world_size, double bytes) {
  if (config.allreduce_algorithm != "auto") return config.allreduce_algorithm;
  const std::vector<std::string> candidates = allreduce_algorithm_names();
  if (config.calibration) {
    return choose_allreduce_algorithm(*config.calibration, world_size, bytes, candidates);
  }
  return choose_allreduce_algorithm(default_link_parameters(), world_size, bytes, candidates);
}

std::unique_ptr<Allreduce> make_method_allreduce(const MethodConfig& config, Transport& transport,
                                                 std::size_t count, const Codec& codec) {
  const double bytes = static_cast<double>(count) * sizeof(float);
  return make_allreduce(resolve_allreduce_algorithm(config, transport.size(), bytes), transport, count,
                        codec, resolve_allreduce_options(config));
}

std::unique_ptr<TrainingMethod> make_training_method(const MethodConfig& config, Model& model,
                                                     Transport& transport) {
  if (config.name == "dsync" || !implied_bucket_plan(config.name).empty()) {
    if (config.buckets.empty() && config.name == "dsync") {
      return std::make_unique<DSync>(config, model, transport);
    }
    MethodConfig bucketed = config;
    if (bucketed.buckets.empty()) bucketed.buckets = implied_bucket_plan(config.name);
    return std::make_unique<BucketedDSync>(bucketed, model, transport);
  }
  if (config.name == "pipe") return std::make_unique<PipeSgd>(config, model, transport);
  if (config.name == "sapipe") return std::make_unique<SaPipe>(config, model, transport);
  if (config.name == "odsgd") return std::make_unique<OneStepDelaySgd>(config, model, transport);
  if (method_uses_servers(config.name)) {
    return std::make_unique<ParameterServerMethod>(config, model, transport);
  }
  throw UsageError(concat("unknown algorithm '", config.name, "' (expected ", join(method_names()), ")"));
}

}  // namespace pipesgd
