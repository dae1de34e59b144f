#include "pipesgd/optim/delay_compensation.h"

#include <algorithm>
#include <cmath>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

DelayCompensationVariant parse_delay_compensation_variant(const std::string& text, const char* name) {
  if (text == "c") return DelayCompensationVariant::kConstant;
  if (text == "a") return DelayCompensationVariant::kAdaptive;
  throw UsageError(concat(name, " must be c (DC-ASGD-c, constant lambda) or a (DC-ASGD-a, adaptive), got '", text, "'"));
}

void check_delay_compensation(const DelayCompensationOptions& options, const DelayCompensationNames& names) {
  if (!(options.lambda >= 0) || !std::isfinite(options.lambda)) {
    throw UsageError(concat(names.lambda, " must be >= 0, got ", options.lambda));
  }
  if (!(options.mean_square_decay >= 0 && options.mean_square_decay < 1)) {
    throw UsageError(concat(names.mean_square_decay, " must be in [0, 1), got ", options.mean_square_decay));
  }
  if (!(options.epsilon > 0) || !std::isfinite(options.epsilon)) {
    throw UsageError(concat("delay compensation epsilon must be > 0, got ", options.epsilon));
  }
}

const char* variant_name(DelayCompensationVariant variant) {
  return variant == DelayCompensationVariant::kConstant ? "c" : "a";
}

DelayCompensation::DelayCompensation(std::size_t count, DelayCompensationOptions options)
    : options_(options) {
  check_delay_compensation(options);
  if (options.variant == DelayCompensationVariant::kAdaptive) mean_square_.assign(count, 0.0f);
}

void DelayCompensation::compensate(std::span<const float> gradient, std::span<const float> current,
                                   std::span<const float> stale, std::span<float> compensated,
                                   std::size_t offset) {
  const std::size_t n = gradient.size();
  PIPESGD_ASSERT(current.size() == n && stale.size() == n && compensated.size() == n);
  const float* g = gradient.data();
  const float* now = current.data();
  const float* then = stale.data();
  float* out = compensated.data();
  const float lambda = options_.lambda;
  if (options_.variant == DelayCompensationVariant::kConstant) {
    for (std::size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      out[i] = gi + lambda * gi * gi * (now[i] - then[i]);
    }
    return;
  }
  PIPESGD_ASSERT(offset + n <= mean_square_.size());
  float* mean_square = mean_square_.data() + offset;
  const float m = options_.mean_square_decay, epsilon = options_.epsilon;
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i];
    mean_square[i] = m * mean_square[i] + (1.0f - m) * gi * gi;
    out[i] = gi + lambda / std::sqrt(mean_square[i] + epsilon) * gi * gi * (now[i] - then[i]);
  }
}

void DelayCompensation::save_state(CheckpointWriter& out, const std::string& prefix) const {
  if (!mean_square_.empty()) out.add(prefix + "dc.mean_square", std::span<const float>(mean_square_));
}

void DelayCompensation::load_state(const CheckpointReader& in, const std::string& prefix) {
  if (mean_square_.empty()) return;
  const std::span<const float> values = in.floats(prefix + "dc.mean_square");
  if (values.size() != mean_square_.size()) {
    throw DataError(concat("checkpoint '", in.origin(), "': ", values.size(), " DC-ASGD-a MeanSquare values for ",
                           mean_square_.size(), " parameters"));
  }
  std::copy(values.begin(), values.end(), mean_square_.begin());
}

}  // namespace pipesgd
