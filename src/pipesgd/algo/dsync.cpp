#include "pipesgd/algo/dsync.h"

#include "pipesgd/core/clock.h"

namespace pipesgd {

DSync::DSync(const MethodConfig& config, Model& model, Transport& transport)
    : model_(model),
      transport_(transport),
      codec_(make_codec(config.codec)),
      allreduce_(make_method_allreduce(config, transport, model.layout().total(), *codec_)),
      optimizer_(make_optimizer(optimizer_options(config), model.layout())),
      gradients_(model.layout().total()) {}

std::span<float> DSync::begin_iteration(std::int64_t, IterationTimes&) { return gradients_; }

void DSync::end_iteration(std::int64_t t, IterationTimes& times) {
  Stopwatch communication;
  allreduce_->run(gradients_, collective_tag(Channel::kGradients, static_cast<std::uint64_t>(t)));
  times.wait = times.comm = communication.seconds();
  Stopwatch update;
  optimizer_->step(model_.parameters(), gradients_, 1.0f / static_cast<float>(transport_.size()), 0);
  times.update = update.seconds();
}

}  // namespace pipesgd
