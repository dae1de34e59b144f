#include "pipesgd/algo/sapipe/stale_compensation.h"

#include <algorithm>
#include <cmath>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/optim/fused_update.h"
#include "pipesgd/optim/gradient_handoff.h"

namespace pipesgd {

StaleCompensation::StaleCompensation(Compensation kind, float lambda, bool bound, float gradient_scale,
                                     std::size_t elements)
    : kind_(kind), lambda_(lambda), bound_(bound), gradient_scale_(gradient_scale) {
  if (pipesgd::predicts(kind)) {
    for (auto& local : local_) local.assign(elements, 0.0f);
  }
  if (kind == Compensation::kDelay || kind == Compensation::kPredictCombined) last_step_.assign(elements, 0.0f);
}

void StaleCompensation::use_stale_range(std::span<const float> weights, std::size_t count) {
  if (predicts()) true_weights_.assign(weights.begin(), weights.begin() + static_cast<std::ptrdiff_t>(count));
}

void StaleCompensation::record_local_gradient(std::span<const float> slot, std::size_t offset, std::size_t count,
                                              std::int64_t t) {
  if (local_[0].empty() || count == 0) return;
  std::copy_n(slot.begin() + static_cast<std::ptrdiff_t>(offset), count,
              local_[t % 2].begin() + static_cast<std::ptrdiff_t>(offset));
}

void StaleCompensation::settle_deferred_steps(std::span<const float> weights) {
  if (!any_deferred_) return;
  for (std::size_t i = 0; i < deferred_.size(); ++i) {
    if (deferred_[i]) last_step_[i] = weights[i] - last_step_[i];
  }
  std::fill(deferred_.begin(), deferred_.end(), 0);
  any_deferred_ = false;
}

void StaleCompensation::settle_earlier_rounds(const Optimizer& optimizer, std::span<const float> weights) {
  const auto* handoff = dynamic_cast<const GradientHandoff*>(&optimizer);
  if (any_deferred_ && handoff != nullptr && handoff->round() != deferred_round_) settle_deferred_steps(weights);
}

void StaleCompensation::defer_step(const Optimizer& optimizer, std::span<const float> weights, std::size_t offset,
                                   std::size_t count) {
  const auto* handoff = dynamic_cast<const GradientHandoff*>(&optimizer);
  if (handoff == nullptr || !handoff->defers() || count == 0) return;
  if (deferred_.empty()) deferred_.assign(last_step_.size(), 0);
  std::copy_n(weights.begin() + static_cast<std::ptrdiff_t>(offset), count,
              last_step_.begin() + static_cast<std::ptrdiff_t>(offset));
  std::fill_n(deferred_.begin() + static_cast<std::ptrdiff_t>(offset), count, 1);
  any_deferred_ = true;
  deferred_round_ = handoff->round();
}

void StaleCompensation::step_synchronous(Optimizer& optimizer, std::span<float> weights, std::span<const float> slot,
                                         std::size_t offset, std::size_t count, bool record_step) {
  if (!last_step_.empty()) settle_earlier_rounds(optimizer, weights);
  if (last_step_.empty() || !record_step) {
    optimizer.step(weights.subspan(offset, count), slot.subspan(offset, count), gradient_scale_, offset);
    return;
  }
  // These layers may become stale: keep their last step for dc / wp3.
  float* const w = weights.data();
  float* const step = last_step_.data();
  const float* const g = slot.data();
  const float scale = gradient_scale_;
  fused_update(optimizer, offset, count, /*steps=*/true, [&](std::size_t i, auto& kernel) {
    const float old = w[i];
    w[i] = kernel.step(i, old, g[i] * scale);
    step[i] = w[i] - old;
  });
  defer_step(optimizer, weights, offset, count);
}

float StaleCompensation::dc_projection(double dot) {
  if (!bound_) return static_cast<float>(dot);
  const double bound = kDelayCompensationBound / std::max(static_cast<double>(lambda_), 1e-30);
  if (std::fabs(dot) <= bound) return static_cast<float>(dot);
  ++bounded_compensations_;
  return static_cast<float>(dot > 0 ? bound : -bound);
}

void StaleCompensation::step_stale(Optimizer& optimizer, std::span<float> model_weights, const float* gradient,
                                   std::size_t count, bool stale) {
  if (gradient == nullptr) return;
  const std::size_t n = count;
  float* const weights = true_weights_.empty() ? model_weights.data() : true_weights_.data();
  float* const step = last_step_.empty() ? nullptr : last_step_.data();
  const float scale = gradient_scale_, lambda = lambda_;
  if (step != nullptr) settle_earlier_rounds(optimizer, model_weights);  // deferred only without true_weights_
  // The true step. Synchronous gradients (warm-up, profiling) and every mode but dc step plainly.
  if (kind_ == Compensation::kDelay && stale) {
    // g . D over the whole stale range (Eq. 1's scalar).
    const double dot = sum_terms(n, [&](std::size_t i) { return static_cast<double>(gradient[i] * scale) * step[i]; });
    const float projection = dc_projection(dot);
    fused_update(optimizer, 0, n, /*steps=*/true, [&](std::size_t i, auto& kernel) {
      const float g = gradient[i] * scale;
      const float old = weights[i];
      weights[i] = kernel.step(i, old, g + lambda * g * projection);
      step[i] = weights[i] - old;
    });
  } else if (step != nullptr) {
    fused_update(optimizer, 0, n, /*steps=*/true, [&](std::size_t i, auto& kernel) {
      const float old = weights[i];
      weights[i] = kernel.step(i, old, gradient[i] * scale);
      step[i] = weights[i] - old;
    });
  } else {
    fused_update(optimizer, 0, n, /*steps=*/true, [&](std::size_t i, auto& kernel) {
      weights[i] = kernel.step(i, weights[i], gradient[i] * scale);
    });
  }
  if (step != nullptr) defer_step(optimizer, std::span<const float>(weights, n), 0, n);
}

void StaleCompensation::show_true_weights(std::span<float> model_weights, std::size_t count) const {
  std::copy_n(true_weights_.data(), count, model_weights.data());
}

void StaleCompensation::predict(Optimizer& optimizer, std::span<float> model_weights, std::size_t count, std::int64_t t,
                                const float* synchronized) {
  const std::size_t n = count;
  float* const model = model_weights.data();
  const float* const weights = true_weights_.data();
  const float* const step = last_step_.empty() ? nullptr : last_step_.data();
  const float scale = gradient_scale_, lambda = lambda_;
  const float* const local_previous = local_[(t - 1) % 2].data();              // L(t-1)
  const float* const local_before = t >= 2 ? local_[t % 2].data() : nullptr;  // L(t-2)
  switch (kind_) {
    case Compensation::kPredictLocal:
      fused_update(optimizer, 0, n, /*steps=*/false, [&](std::size_t i, auto& kernel) {
        model[i] = kernel.predict(i, weights[i], local_previous[i]);
      });
      break;
    case Compensation::kPredictSynchronized:
      fused_update(optimizer, 0, n, /*steps=*/false, [&](std::size_t i, auto& kernel) {
        model[i] = kernel.predict(i, weights[i], synchronized ? synchronized[i] * scale : 0.0f);
      });
      break;
    case Compensation::kPredictCombined: {
      // h = G(t-2)/n - L(t-2)/n: the other workers' part of the latest synchronized gradient.
      const double dot = synchronized == nullptr ? 0.0 : sum_terms(n, [&](std::size_t i) {
        return static_cast<double>(synchronized[i] * scale - local_before[i] * scale) * step[i];
      });
      const float projection = dc_projection(dot);
      fused_update(optimizer, 0, n, /*steps=*/false, [&](std::size_t i, auto& kernel) {
        const float h = synchronized ? synchronized[i] * scale - local_before[i] * scale : 0.0f;
        model[i] = kernel.predict(i, weights[i], h + lambda * h * projection + local_previous[i] * scale);
      });
      break;
    }
    default:
      PIPESGD_ASSERT(false);
  }
}

void StaleCompensation::forget(std::size_t offset, std::size_t count) {
  for (auto& local : local_) {
    if (!local.empty()) std::fill_n(local.begin() + static_cast<std::ptrdiff_t>(offset), count, 0.0f);
  }
  if (!last_step_.empty()) std::fill_n(last_step_.begin() + static_cast<std::ptrdiff_t>(offset), count, 0.0f);
  if (!deferred_.empty()) std::fill_n(deferred_.begin() + static_cast<std::ptrdiff_t>(offset), count, 0);
}

void StaleCompensation::save(CheckpointWriter& out, const std::string& prefix) const {
  PIPESGD_ASSERT(!any_deferred_);  // settle_deferred_steps first
  out.add(prefix + "local0", std::span<const float>(local_[0]));
  out.add(prefix + "local1", std::span<const float>(local_[1]));
  out.add(prefix + "true_weights", std::span<const float>(true_weights_));
  out.add(prefix + "last_step", std::span<const float>(last_step_));
  out.add_int(prefix + "bounded_compensations", bounded_compensations_);
}

void StaleCompensation::load(const CheckpointReader& in, const std::string& prefix) {
  auto load_buffer = [&](const char* name, std::vector<float>& buffer) {
    const std::span<const float> values = in.floats(prefix + name, buffer.size());
    std::copy(values.begin(), values.end(), buffer.begin());
  };
  const std::int64_t bounded = in.integer(prefix + "bounded_compensations");
  if (bounded < 0 || (bounded > 0 && !bound_)) {
    throw DataError(concat("checkpoint '", in.origin(), "': ", bounded, " bounded compensations",
                           bound_ ? "" : " with --dc-bound off"));
  }
  load_buffer("local0", local_[0]);
  load_buffer("local1", local_[1]);
  load_buffer("last_step", last_step_);
  load_buffer("true_weights", true_weights_);  // sized by use_stale_range before
  bounded_compensations_ = bounded;
}

double measure_stale_update_seconds(Compensation kind, std::size_t elements, const SgdOptions& sgd, int repetitions) {
  PIPESGD_ASSERT(elements >= 1 && repetitions >= 1);
  std::vector<float> weights(elements), gradient(elements);
  for (std::size_t i = 0; i < elements; ++i) {
    weights[i] = 0.01f * static_cast<float>(static_cast<int>(i % 201) - 100);
    gradient[i] = 1e-4f * static_cast<float>(static_cast<int>(i % 97) - 48);
  }
  Sgd optimizer(elements, sgd);
  StaleCompensation compensation(kind, static_cast<float>(kSapipeDefaultLambda), false, 0.5f, elements);
  compensation.use_stale_range(weights, elements);
  for (std::int64_t t = 0; t < 2; ++t) compensation.record_local_gradient(gradient, 0, elements, t);
  const double seconds = median_seconds(repetitions, [&] {
    compensation.step_stale(optimizer, weights, gradient.data(), elements, true);
    if (compensation.predicts()) compensation.predict(optimizer, weights, elements, 2, gradient.data());
  });
  return seconds / static_cast<double>(elements);
}

}  // namespace pipesgd
