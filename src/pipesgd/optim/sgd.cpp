#include "pipesgd/optim/sgd.h"

#include <algorithm>
#include <cmath>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/optim/lr_schedule.h"

namespace pipesgd {

void check_sgd_options(const SgdOptions& options, const SgdOptionNames& names) {
  if (!(options.learning_rate > 0) || !std::isfinite(options.learning_rate)) {
    throw UsageError(concat(names.learning_rate, " must be > 0, got ", options.learning_rate));
  }
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    throw UsageError(concat(names.momentum, " must be in [0, 1), got ", options.momentum));
  }
  if (!(options.weight_decay >= 0) || !std::isfinite(options.weight_decay)) {
    throw UsageError(concat(names.weight_decay, " must be >= 0, got ", options.weight_decay));
  }
}

Sgd::Sgd(std::size_t count, SgdOptions options)
    : options_(options), learning_rate_(options.learning_rate), velocity_(count, 0.0f) {
  check_sgd_options(options);
}

void Sgd::set_learning_rate_factor(double factor) {
  learning_rate_ = scaled_learning_rate(options_.learning_rate, factor);
}

void Sgd::step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
               std::size_t offset) {
  PIPESGD_ASSERT(parameters.size() == gradients.size());
  PIPESGD_ASSERT(offset + parameters.size() <= velocity_.size());
  const std::size_t n = parameters.size();
  float* w = parameters.data();
  const float* g = gradients.data();
  float* v = velocity_.data() + offset;
  const float lr = learning_rate_, momentum = options_.momentum,
              decay = options_.weight_decay;
  if (momentum == 0) {
    for (std::size_t i = 0; i < n; ++i) {
      const float d = g[i] * gradient_scale + decay * w[i];
      w[i] -= lr * d;
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float d = g[i] * gradient_scale + decay * w[i];
    v[i] = momentum * v[i] + d;
    w[i] -= lr * v[i];
  }
}

// Without momentum the velocity is never used (step and predict leave it at zero): the section is
// then empty, which keeps every commit of a plain-SGD run a parameter vector smaller.
void Sgd::save_state(CheckpointWriter& out, const std::string& prefix) const {
  out.add(prefix + "sgd.velocity",
          options_.momentum == 0 ? std::span<const float>() : std::span<const float>(velocity_));
}

void Sgd::load_state(const CheckpointReader& in, const std::string& prefix) {
  const std::span<const float> velocity = in.floats(prefix + "sgd.velocity");
  if (velocity.empty() && options_.momentum == 0) {
    std::fill(velocity_.begin(), velocity_.end(), 0.0f);
    return;
  }
  if (velocity.size() != velocity_.size()) {
    throw DataError(concat("checkpoint '", in.origin(), "': ", velocity.size(), " SGD momentum values for ",
                           velocity_.size(), " parameters (a checkpoint of another model?)"));
  }
  std::copy(velocity.begin(), velocity.end(), velocity_.begin());
}

// The same float operations, in the same order, as step().
void Sgd::predict(std::span<const float> parameters, std::span<const float> gradients,
                  float gradient_scale, std::size_t offset, std::span<float> predicted) const {
  PIPESGD_ASSERT(parameters.size() == gradients.size());
  PIPESGD_ASSERT(predicted.size() == parameters.size());
  PIPESGD_ASSERT(offset + parameters.size() <= velocity_.size());
  const std::size_t n = parameters.size();
  const float* w = parameters.data();
  const float* g = gradients.data();
  const float* v = velocity_.data() + offset;
  float* out = predicted.data();
  const float lr = learning_rate_, momentum = options_.momentum,
              decay = options_.weight_decay;
  if (momentum == 0) {
    for (std::size_t i = 0; i < n; ++i) {
      const float d = g[i] * gradient_scale + decay * w[i];
      out[i] = w[i] - lr * d;
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    const float d = g[i] * gradient_scale + decay * w[i];
    const float next_velocity = momentum * v[i] + d;
    out[i] = w[i] - lr * next_velocity;
  }
}

}  // namespace pipesgd
