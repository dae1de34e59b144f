#pragma once
// Adam over flat buffers with torch::optim::Adam's semantics (PyTorch 1.13, amsgrad off; the formula
// is at AdamOptions in optimizer.h). The float arithmetic mirrors LibTorch's CPU kernels operation by
// operation (bias corrections in double, every other operation in float), so results agree with
// LibTorch to rounding (LibTorch's vectorised kernels may fuse some multiply-adds).
// The step count is kept per layout segment, so every range passed to step()/predict() must be whole
// segments. One object per replica; not thread-safe (the compute thread owns it).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/core/layout.h"
#include "pipesgd/optim/optimizer.h"

namespace pipesgd {

// The names check_adam_options gives the hyper-parameters in its messages (see SgdOptionNames).
struct AdamOptionNames {
  const char* learning_rate = "Adam learning rate";
  const char* beta1 = "Adam beta1";
  const char* beta2 = "Adam beta2";
  const char* epsilon = "Adam epsilon";
  const char* weight_decay = "Adam weight decay";
};

// Throws UsageError for a learning rate <= 0, betas outside [0, 1), epsilon <= 0 or a negative
// weight decay.
void check_adam_options(const AdamOptions& options, const AdamOptionNames& names = {});

class Adam final : public Optimizer {
 public:
  // Throws UsageError (naming the flag) for a learning rate <= 0, beta1 or beta2 outside [0, 1),
  // epsilon <= 0, negative weight decay, or any non-finite option.
  Adam(const Layout& layout, AdamOptions options);

  // One Adam update of the whole segments covering [offset, offset + parameters.size()); increments
  // each covered segment's step count.
  void step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
            std::size_t offset) override;

  // Writes into `predicted` what step() would leave in `parameters` (bit for bit), changing neither
  // the moments nor the step counts. `predicted` may alias `parameters`.
  void predict(std::span<const float> parameters, std::span<const float> gradients, float gradient_scale,
               std::size_t offset, std::span<float> predicted) const override;

  void save_state(CheckpointWriter& out, const std::string& prefix) const override;
  void load_state(const CheckpointReader& in, const std::string& prefix) override;
  void set_learning_rate_factor(double factor) override;

  // Steps taken so far by segment `index` of the layout (for tests and checkpoints).
  std::int64_t step_count(std::size_t index) const { return step_counts_.at(index); }

  // The update of one element of one segment, for loops that fuse other work into it
  // (optim/fused_update.h): step(i, w, g) returns the new w[i] and updates the moments exactly as
  // step() would with gradient * scale == g (the caller scales); predict(i, w, g) what the next
  // step would give, changing nothing. `i` is the flat element index.
  struct ElementKernel {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, epsilon, weight_decay;
    float step_negative_step_size, step_sqrt_bias_correction2;        // this step's constants
    float predict_negative_step_size, predict_sqrt_bias_correction2;  // the following step's
    float* exp_avg;
    float* exp_avg_sq;
    float step(std::size_t i, float w, float g) {
      return update(w, g, step_negative_step_size, step_sqrt_bias_correction2, exp_avg[i], exp_avg_sq[i]);
    }
    float predict(std::size_t i, float w, float g) const {
      float m = exp_avg[i], v = exp_avg_sq[i];
      return update(w, g, predict_negative_step_size, predict_sqrt_bias_correction2, m, v);
    }
    // Mirrors LibTorch 1.13's Adam::step on CPU float tensors, for one element:
    //   grad = grad.add(p, weight_decay)                    (only if weight_decay != 0)
    //   exp_avg.mul_(beta1).add_(grad, 1 - beta1)
    //   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
    //   denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)).add_(eps)
    //   p.addcdiv_(exp_avg, denom, -step_size)
    // Returns the new weight and updates `m`, `v`.
    float update(float w, float g, float negative_step_size, float sqrt_bias_correction2, float& m,
                 float& v) const {
      float d = g;
      if (weight_decay != 0) d = d + weight_decay * w;
      m = m * beta1 + one_minus_beta1 * d;
      v = v * beta2 + one_minus_beta2 * d * d;
      const float denom = std::sqrt(v) / sqrt_bias_correction2 + epsilon;
      return w + negative_step_size * m / denom;
    }
  };
  // Calls body(begin, end, kernel) for each segment covering [offset, offset + count) (whole
  // segments), with element range [begin, end). `steps`: the body steps every element (the
  // segment's count is incremented first; predict looks one step further); false: predict only.
  template <typename Body>
  void for_each_segment(std::size_t offset, std::size_t count, bool steps, Body&& body) {
    const std::size_t end = offset + count;
    for (std::size_t index = segment_starting_at(offset); index < layout_.segment_count(); ++index) {
      const Segment& segment = layout_.segment(index);
      if (segment.offset >= end) break;
      PIPESGD_ASSERT(segment.offset + segment.count <= end);
      if (steps) ++step_counts_[index];
      ElementKernel kernel = kernel_at(step_counts_[index]);
      body(segment.offset, segment.offset + segment.count, kernel);
    }
  }

 private:
  // The per-step constants of one segment at step number `step` (1 on the first step).
  struct StepConstants {
    float negative_step_size;       // -(lr / (1 - beta1^step))
    float sqrt_bias_correction2;    // sqrt(1 - beta2^step)
  };
  StepConstants constants_for(std::int64_t step) const;
  // The kernel of a segment that has taken `steps` steps (step() uses max(1, steps), predict()
  // steps + 1). It may write the moments only through step().
  ElementKernel kernel_at(std::int64_t steps) const;
  // Index of the segment starting at `offset`; asserts that one does.
  std::size_t segment_starting_at(std::size_t offset) const;

  AdamOptions options_;
  float learning_rate_;    // scaled_learning_rate(options_.learning_rate, factor)
  float one_minus_beta1_;  // float(1 - double(beta1)), as LibTorch's add_ alpha
  float one_minus_beta2_;  // float(1 - double(beta2)), as LibTorch's addcmul_ value
  Layout layout_;
  std::vector<float> exp_avg_;     // m, one per element
  std::vector<float> exp_avg_sq_;  // v, one per element
  std::vector<std::int64_t> step_counts_;  // one per segment
};

}  // namespace pipesgd
