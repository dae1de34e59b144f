#include "pipesgd/algo/dsync/dsync.h"

#include "pipesgd/algo/synchronous_step.h"

namespace pipesgd {

DSync::DSync(const MethodContext& context)
    : model_(context.model),
      gradient_scale_(1.0f / static_cast<float>(context.transport.size())),
      codec_(make_codec(context.common.codec)),
      allreduce_(make_method_allreduce(context.common, context.transport, context.model.layout().total(), *codec_,
                                       context.options.default_segment_bytes())),
      optimizer_(make_optimizer(context.common.optimizer, context.model.layout())),
      schedule_(context.learning_rate_schedule),
      gradients_(context.model.layout().total()) {}

std::span<float> DSync::begin_iteration(std::int64_t, IterationTimes&) { return gradients_; }

void DSync::end_iteration(std::int64_t t, IterationTimes& times) {
  allreduce_then_step(*allreduce_, *optimizer_, schedule_, model_.parameters(), gradients_, gradient_scale_, t, times);
}

std::shared_ptr<MethodReport> DSync::report() const { return std::make_shared<AllreduceCallsReport>(1); }

}  // namespace pipesgd
