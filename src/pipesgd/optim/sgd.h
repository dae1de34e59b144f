#pragma once
// SGD with momentum and weight decay, fused over flat buffers, with LibTorch's torch::optim::SGD
// semantics (dampening 0, no Nesterov):
//   d = scale * g + weight_decay * w;  v = momentum * v + d;  w -= learning_rate * v
// (the first step's v equals d, as in LibTorch, because v starts at zero).
// One object per replica; not thread-safe (the compute thread owns it).
#include <span>
#include <vector>

namespace pipesgd {

struct SgdOptions {
  float learning_rate = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

class Sgd {
 public:
  // Throws UsageError for a learning rate <= 0, momentum outside [0, 1) or negative weight decay.
  Sgd(std::size_t count, SgdOptions options);

  // One update of `parameters` with `gradients * gradient_scale` over elements
  // [offset, offset + parameters.size()) of the flat buffers (momentum is kept per element).
  void step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
            std::size_t offset = 0);

 private:
  SgdOptions options_;
  std::vector<float> velocity_;
};

}  // namespace pipesgd
