#include "pipesgd/optim/optimizer.h"

#include "pipesgd/core/error.h"
#include "pipesgd/optim/adam.h"
#include "pipesgd/optim/gradient_handoff.h"

namespace pipesgd {

std::vector<std::string> optimizer_names() { return {"sgd", "adam"}; }

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, const Layout& layout) {
  if (options.name == "sgd") return std::make_unique<Sgd>(layout.total(), options.sgd);
  if (options.name == "adam") return std::make_unique<Adam>(layout, options.adam);
  if (options.name == "external") {
    PIPESGD_ASSERT(options.handoff != nullptr);
    return std::make_unique<GradientHandoff>(layout, options.handoff);
  }
  throw UsageError(concat("unknown optimizer '", options.name, "' (expected ", join(optimizer_names()), ")"));
}

}  // namespace pipesgd
