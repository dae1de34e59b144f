#include "pipesgd/optim/adam.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/optim/lr_schedule.h"

namespace pipesgd {
void check_adam_options(const AdamOptions& options, const AdamOptionNames& names) {
  if (!(options.learning_rate > 0) || !std::isfinite(options.learning_rate)) {
    throw UsageError(concat(names.learning_rate, " must be > 0, got ", options.learning_rate));
  }
  if (!(options.beta1 >= 0 && options.beta1 < 1)) {
    throw UsageError(concat(names.beta1, " must be in [0, 1), got ", options.beta1));
  }
  if (!(options.beta2 >= 0 && options.beta2 < 1)) {
    throw UsageError(concat(names.beta2, " must be in [0, 1), got ", options.beta2));
  }
  if (!(options.epsilon > 0) || !std::isfinite(options.epsilon)) {
    throw UsageError(concat(names.epsilon, " must be > 0, got ", options.epsilon));
  }
  if (!(options.weight_decay >= 0) || !std::isfinite(options.weight_decay)) {
    throw UsageError(concat(names.weight_decay, " must be >= 0, got ", options.weight_decay));
  }
}

Adam::Adam(const Layout& layout, AdamOptions options)
    : options_(options),
      learning_rate_(options.learning_rate),
      one_minus_beta1_(static_cast<float>(1.0 - static_cast<double>(options.beta1))),
      one_minus_beta2_(static_cast<float>(1.0 - static_cast<double>(options.beta2))),
      layout_(layout) {
  check_adam_options(options);
  exp_avg_.assign(layout_.total(), 0.0f);
  exp_avg_sq_.assign(layout_.total(), 0.0f);
  step_counts_.assign(layout_.segment_count(), 0);
}

// As LibTorch: bias corrections and the step size in double, then used as float scalars.
Adam::StepConstants Adam::constants_for(std::int64_t step) const {
  const double bias_correction1 = 1 - std::pow(static_cast<double>(options_.beta1), step);
  const double bias_correction2 = 1 - std::pow(static_cast<double>(options_.beta2), step);
  const double step_size = static_cast<double>(learning_rate_) / bias_correction1;
  return {static_cast<float>(-step_size), static_cast<float>(std::sqrt(bias_correction2))};
}

void Adam::set_learning_rate_factor(double factor) {
  learning_rate_ = scaled_learning_rate(options_.learning_rate, factor);
}

std::size_t Adam::segment_starting_at(std::size_t offset) const {
  const std::vector<Segment>& segments = layout_.segments();
  const auto found = std::lower_bound(segments.begin(), segments.end(), offset,
                                      [](const Segment& s, std::size_t o) { return s.offset < o; });
  PIPESGD_ASSERT(found != segments.end() && found->offset == offset);
  return static_cast<std::size_t>(found - segments.begin());
}

void Adam::save_state(CheckpointWriter& out, const std::string& prefix) const {
  out.add(prefix + "adam.exp_avg", std::span<const float>(exp_avg_));
  out.add(prefix + "adam.exp_avg_sq", std::span<const float>(exp_avg_sq_));
  out.add(prefix + "adam.steps", std::as_bytes(std::span<const std::int64_t>(step_counts_)));
}

void Adam::load_state(const CheckpointReader& in, const std::string& prefix) {
  const std::span<const float> m = in.floats(prefix + "adam.exp_avg");
  const std::span<const float> v = in.floats(prefix + "adam.exp_avg_sq");
  const std::span<const std::byte> steps = in.bytes(prefix + "adam.steps");
  if (m.size() != exp_avg_.size() || v.size() != exp_avg_sq_.size() ||
      steps.size() != step_counts_.size() * sizeof(std::int64_t)) {
    throw DataError(concat("checkpoint '", in.origin(), "': Adam state of another size (",
                           m.size(), " moments for ", exp_avg_.size(), " parameters)"));
  }
  std::copy(m.begin(), m.end(), exp_avg_.begin());
  std::copy(v.begin(), v.end(), exp_avg_sq_.begin());
  std::memcpy(step_counts_.data(), steps.data(), steps.size());
}

Adam::ElementKernel Adam::kernel_at(std::int64_t steps) const {
  const StepConstants now = constants_for(std::max<std::int64_t>(1, steps));
  const StepConstants next = constants_for(steps + 1);
  // The moments are written only by ElementKernel::step, which only the non-const paths call.
  auto* exp_avg = const_cast<float*>(exp_avg_.data());
  auto* exp_avg_sq = const_cast<float*>(exp_avg_sq_.data());
  return {options_.beta1,      one_minus_beta1_,           options_.beta2,
          one_minus_beta2_,    options_.epsilon,           options_.weight_decay,
          now.negative_step_size, now.sqrt_bias_correction2, next.negative_step_size,
          next.sqrt_bias_correction2, exp_avg,             exp_avg_sq};
}

void Adam::step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
                std::size_t offset) {
  PIPESGD_ASSERT(parameters.size() == gradients.size());
  PIPESGD_ASSERT(offset + parameters.size() <= layout_.total());
  if (parameters.empty()) return;
  float* w = parameters.data();
  const float* g = gradients.data();
  for_each_segment(offset, parameters.size(), /*steps=*/true,
                   [&](std::size_t begin, std::size_t end, ElementKernel& kernel) {
                     for (std::size_t i = begin; i < end; ++i) {
                       w[i - offset] = kernel.step(i, w[i - offset], g[i - offset] * gradient_scale);
                     }
                   });
}

void Adam::predict(std::span<const float> parameters, std::span<const float> gradients,
                   float gradient_scale, std::size_t offset, std::span<float> predicted) const {
  PIPESGD_ASSERT(parameters.size() == gradients.size());
  PIPESGD_ASSERT(predicted.size() == parameters.size());
  PIPESGD_ASSERT(offset + parameters.size() <= layout_.total());
  const std::size_t end = offset + parameters.size();
  for (std::size_t index = parameters.empty() ? layout_.segment_count() : segment_starting_at(offset);
       index < layout_.segment_count(); ++index) {
    const Segment& segment = layout_.segment(index);
    if (segment.offset >= end) break;
    PIPESGD_ASSERT(segment.offset + segment.count <= end);  // the range ends on a segment boundary
    const ElementKernel kernel = kernel_at(step_counts_[index]);
    for (std::size_t i = segment.offset; i < segment.offset + segment.count; ++i) {
      predicted[i - offset] = kernel.predict(i, parameters[i - offset], gradients[i - offset] * gradient_scale);
    }
  }
}

}  // namespace pipesgd
