#pragma once
// The Optimizer base class alone, so that optimizers (sgd.h, adam.h) can derive from it while
// optimizer.h (which includes them) stays the one header callers include. Range rules and the
// meaning of predict() are documented in optimizer.h.
#include <cstddef>
#include <span>
#include <string>

namespace pipesgd {

class CheckpointWriter;
class CheckpointReader;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of `parameters` (elements [offset, offset + n) of the flat buffer) with
  // `gradients * gradient_scale`.
  virtual void step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
                    std::size_t offset) = 0;
  // Writes into `predicted` what step() would leave in `parameters`, changing no state. `predicted`
  // may alias `parameters`. Same range rules as step().
  virtual void predict(std::span<const float> parameters, std::span<const float> gradients,
                       float gradient_scale, std::size_t offset, std::span<float> predicted) const = 0;
  // The learning-rate schedule's factor (optim/lr_schedule.h) for every step() and predict() from
  // now on: they use scaled_learning_rate(base learning rate, factor). 1 until set; not saved in
  // checkpoints (a method sets it before each update, from the iteration whose gradient it applies).
  // Cheap: no allocation.
  virtual void set_learning_rate_factor(double factor) = 0;
  // Checkpoints: the optimizer's state (momentum, moments, step counts) as sections named
  // `prefix` + ...; load_state throws DataError if a section is missing or has the wrong size.
  virtual void save_state(CheckpointWriter& out, const std::string& prefix) const = 0;
  virtual void load_state(const CheckpointReader& in, const std::string& prefix) = 0;
};

}  // namespace pipesgd
