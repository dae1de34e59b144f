#include "pipesgd/optim/adam.h"

#include <algorithm>
#include <cmath>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// The update of one element; mirrors LibTorch 1.13's Adam::step on CPU float tensors:
//   grad = grad.add(p, weight_decay)                    (only if weight_decay != 0)
//   exp_avg.mul_(beta1).add_(grad, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
//   denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
//   p.addcdiv_(exp_avg, denom, -step_size)
// Returns the new weight and updates `m`, `v` (locals in predict()).
template <bool kHasDecay>
inline float adam_update(float w, float g, float gradient_scale, float decay, float beta1,
                         float one_minus_beta1, float beta2, float one_minus_beta2, float epsilon,
                         float negative_step_size, float sqrt_bias_correction2, float& m, float& v) {
  float d = g * gradient_scale;
  if constexpr (kHasDecay) d = d + decay * w;
  m = m * beta1 + one_minus_beta1 * d;
  v = v * beta2 + one_minus_beta2 * d * d;
  const float denom = std::sqrt(v) / sqrt_bias_correction2 + epsilon;
  return w + negative_step_size * m / denom;
}

}  // namespace

float Adam::ElementKernel::update(float w, float g, float negative_step_size, float sqrt_bias_correction2,
                                  float& m, float& v) const {
  if (weight_decay != 0) {
    return adam_update<true>(w, g, 1.0f, weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
                             epsilon, negative_step_size, sqrt_bias_correction2, m, v);
  }
  return adam_update<false>(w, g, 1.0f, weight_decay, beta1, one_minus_beta1, beta2, one_minus_beta2,
                            epsilon, negative_step_size, sqrt_bias_correction2, m, v);
}

Adam::Adam(const Layout& layout, AdamOptions options)
    : options_(options),
      one_minus_beta1_(static_cast<float>(1.0 - static_cast<double>(options.beta1))),
      one_minus_beta2_(static_cast<float>(1.0 - static_cast<double>(options.beta2))),
      layout_(layout) {
  if (!(options.learning_rate > 0) || !std::isfinite(options.learning_rate)) {
    throw UsageError(concat("--lr must be > 0, got ", options.learning_rate));
  }
  if (!(options.beta1 >= 0 && options.beta1 < 1)) {
    throw UsageError(concat("--adam-beta1 must be in [0, 1), got ", options.beta1));
  }
  if (!(options.beta2 >= 0 && options.beta2 < 1)) {
    throw UsageError(concat("--adam-beta2 must be in [0, 1), got ", options.beta2));
  }
  if (!(options.epsilon > 0) || !std::isfinite(options.epsilon)) {
    throw UsageError(concat("--adam-eps must be > 0, got ", options.epsilon));
  }
  if (!(options.weight_decay >= 0) || !std::isfinite(options.weight_decay)) {
    throw UsageError(concat("--weight-decay must be >= 0, got ", options.weight_decay));
  }
  exp_avg_.assign(layout_.total(), 0.0f);
  exp_avg_sq_.assign(layout_.total(), 0.0f);
  step_counts_.assign(layout_.segment_count(), 0);
}

// As LibTorch: bias corrections and the step size in double, then used as float scalars.
Adam::StepConstants Adam::constants_for(std::int64_t step) const {
  const double bias_correction1 = 1 - std::pow(static_cast<double>(options_.beta1), step);
  const double bias_correction2 = 1 - std::pow(static_cast<double>(options_.beta2), step);
  const double step_size = static_cast<double>(options_.learning_rate) / bias_correction1;
  return {static_cast<float>(-step_size), static_cast<float>(std::sqrt(bias_correction2))};
}

std::size_t Adam::segment_starting_at(std::size_t offset) const {
  const std::vector<Segment>& segments = layout_.segments();
  const auto found = std::lower_bound(segments.begin(), segments.end(), offset,
                                      [](const Segment& s, std::size_t o) { return s.offset < o; });
  PIPESGD_ASSERT(found != segments.end() && found->offset == offset);
  return static_cast<std::size_t>(found - segments.begin());
}

void Adam::step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
                std::size_t offset) {
  PIPESGD_ASSERT(parameters.size() == gradients.size());
  PIPESGD_ASSERT(offset + parameters.size() <= layout_.total());
  if (parameters.empty()) return;
  const float beta1 = options_.beta1, beta2 = options_.beta2, epsilon = options_.epsilon,
              decay = options_.weight_decay, one_minus_beta1 = one_minus_beta1_,
              one_minus_beta2 = one_minus_beta2_;
  const std::size_t end = offset + parameters.size();
  for (std::size_t index = segment_starting_at(offset); index < layout_.segment_count(); ++index) {
    const Segment& segment = layout_.segment(index);
    if (segment.offset >= end) break;
    PIPESGD_ASSERT(segment.offset + segment.count <= end);  // the range ends on a segment boundary
    const StepConstants constants = constants_for(++step_counts_[index]);
    const std::size_t first = segment.offset - offset, n = segment.count;
    float* w = parameters.data() + first;
    const float* g = gradients.data() + first;
    float* m = exp_avg_.data() + segment.offset;
    float* v = exp_avg_sq_.data() + segment.offset;
    auto run = [&]<bool kHasDecay>() {
      for (std::size_t i = 0; i < n; ++i) {
        w[i] = adam_update<kHasDecay>(w[i], g[i], gradient_scale, decay, beta1, one_minus_beta1, beta2,
                                      one_minus_beta2, epsilon, constants.negative_step_size,
                                      constants.sqrt_bias_correction2, m[i], v[i]);
      }
    };
    if (decay != 0) {
      run.template operator()<true>();
    } else {
      run.template operator()<false>();
    }
  }
}

void Adam::predict(std::span<const float> parameters, std::span<const float> gradients,
                   float gradient_scale, std::size_t offset, std::span<float> predicted) const {
  PIPESGD_ASSERT(parameters.size() == gradients.size());
  PIPESGD_ASSERT(predicted.size() == parameters.size());
  PIPESGD_ASSERT(offset + parameters.size() <= layout_.total());
  if (parameters.empty()) return;
  const float beta1 = options_.beta1, beta2 = options_.beta2, epsilon = options_.epsilon,
              decay = options_.weight_decay, one_minus_beta1 = one_minus_beta1_,
              one_minus_beta2 = one_minus_beta2_;
  const std::size_t end = offset + parameters.size();
  for (std::size_t index = segment_starting_at(offset); index < layout_.segment_count(); ++index) {
    const Segment& segment = layout_.segment(index);
    if (segment.offset >= end) break;
    PIPESGD_ASSERT(segment.offset + segment.count <= end);  // the range ends on a segment boundary
    const StepConstants constants = constants_for(step_counts_[index] + 1);
    const std::size_t first = segment.offset - offset, n = segment.count;
    const float* w = parameters.data() + first;
    const float* g = gradients.data() + first;
    float* out = predicted.data() + first;
    const float* m = exp_avg_.data() + segment.offset;
    const float* v = exp_avg_sq_.data() + segment.offset;
    auto run = [&]<bool kHasDecay>() {
      for (std::size_t i = 0; i < n; ++i) {
        float next_m = m[i], next_v = v[i];
        out[i] = adam_update<kHasDecay>(w[i], g[i], gradient_scale, decay, beta1, one_minus_beta1, beta2,
                                        one_minus_beta2, epsilon, constants.negative_step_size,
                                        constants.sqrt_bias_correction2, next_m, next_v);
      }
    };
    if (decay != 0) {
      run.template operator()<true>();
    } else {
      run.template operator()<false>();
    }
  }
}

}  // namespace pipesgd
