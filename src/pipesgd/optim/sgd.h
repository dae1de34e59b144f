#pragma once
// SGD with momentum and weight decay, fused over flat buffers, with LibTorch's torch::optim::SGD
// semantics (dampening 0, no Nesterov):
//   d = scale * g + weight_decay * w;  v = momentum * v + d;  w -= learning_rate * v
// (the first step's v equals d, as in LibTorch, because v starts at zero).
// One object per replica; not thread-safe (the compute thread owns it).
#include <cstddef>
#include <span>
#include <vector>

#include "pipesgd/optim/optimizer_interface.h"

namespace pipesgd {

struct SgdOptions {
  float learning_rate = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

// The names check_sgd_options gives the hyper-parameters in its messages: the option layer passes
// its flags (algo/common_options.h), everything else gets these.
struct SgdOptionNames {
  const char* learning_rate = "SGD learning rate";
  const char* momentum = "SGD momentum";
  const char* weight_decay = "SGD weight decay";
};

// Throws UsageError ("<name> must be > 0, got x") for a learning rate <= 0, momentum outside
// [0, 1) or a negative weight decay.
void check_sgd_options(const SgdOptions& options, const SgdOptionNames& names = {});

class Sgd final : public Optimizer {
 public:
  // Throws as check_sgd_options.
  Sgd(std::size_t count, SgdOptions options);

  // One update of `parameters` with `gradients * gradient_scale` over elements
  // [offset, offset + parameters.size()) of the flat buffers (momentum is kept per element).
  void step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
            std::size_t offset = 0) override;

  // Writes into `predicted` exactly (bit for bit) what step() would leave in `parameters`, without
  // touching the momentum. `predicted` may alias `parameters`.
  void predict(std::span<const float> parameters, std::span<const float> gradients, float gradient_scale,
               std::size_t offset, std::span<float> predicted) const override;

  // The update of one element, for loops that fuse other work into it (optim/fused_update.h):
  // step(i, w, g) returns the new w[i] and updates the momentum exactly as step() would for
  // element i with gradient * scale == g (the caller scales); predict(i, w, g) returns what step
  // would give without changing anything. Valid while this Sgd lives.
  struct ElementKernel {
    float learning_rate, momentum, weight_decay;
    float* velocity;  // indexed by the flat element index
    float step(std::size_t i, float w, float g) {
      const float d = g + weight_decay * w;
      if (momentum == 0) return w - learning_rate * d;
      velocity[i] = momentum * velocity[i] + d;
      return w - learning_rate * velocity[i];
    }
    float predict(std::size_t i, float w, float g) const {
      const float d = g + weight_decay * w;
      if (momentum == 0) return w - learning_rate * d;
      const float next_velocity = momentum * velocity[i] + d;
      return w - learning_rate * next_velocity;
    }
  };
  void save_state(CheckpointWriter& out, const std::string& prefix) const override;
  void load_state(const CheckpointReader& in, const std::string& prefix) override;
  void set_learning_rate_factor(double factor) override;
  // The learning rate step() uses now (options.learning_rate scaled by the factor last set).
  float learning_rate() const { return learning_rate_; }

  ElementKernel element_kernel() {
    return {learning_rate_, options_.momentum, options_.weight_decay, velocity_.data()};
  }

 private:
  SgdOptions options_;
  float learning_rate_;  // scaled_learning_rate(options_.learning_rate, factor)
  std::vector<float> velocity_;
};

}  // namespace pipesgd
