#include "pipesgd/algo/training_method.h"

#include "pipesgd/algo/dsync.h"
#include "pipesgd/algo/pipe_sgd.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

std::vector<std::string> method_names() { return {"dsync", "pipe"}; }

std::unique_ptr<TrainingMethod> make_training_method(const MethodConfig& config, Model& model,
                                                     Transport& transport) {
  if (config.name == "dsync") return std::make_unique<DSync>(config, model, transport);
  if (config.name == "pipe") return std::make_unique<PipeSgd>(config, model, transport);
  throw UsageError(concat("unknown algorithm '", config.name, "' (expected dsync, pipe)"));
}

}  // namespace pipesgd
