#pragma once
// GradientHandoff: the optimizer of a method whose update the caller applies (the public API's
// "the user's optimizer applies the update": Horovod's contract). Where a method would update the
// parameters with `gradients * scale`, this optimizer leaves the parameters alone and writes the
// scaled gradient into a HandedOverGradients buffer instead, marking the segments it covered; the
// caller then hands that buffer to its own optimizer (torch.optim, torch::optim) and clears it.
//
// It has no update rule of its own, so it cannot predict (SAPipe's weight prediction needs the
// rule): predict() is an internal error; callers refuse such methods before building them. Not
// thread-safe: the compute thread owns it, as every optimizer.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "pipesgd/core/layout.h"
#include "pipesgd/optim/optimizer_interface.h"

namespace pipesgd {

// The gradients handed over since the caller last cleared them: `gradient` laid out as the model's
// flat buffer; `updated[s]` is 1 where segment s received one (a segment updated twice before a
// clear holds the later gradient). Shared between the caller and the method's optimizer.
//
// A segment handed a second gradient before the caller applied the first (a method that applies
// several updates in one call: Pipe-SGD's finish) first has `apply_pending` called, which must apply
// what is there and clear(); without it the later gradient replaces the earlier.
//
// `plain_sgd`: while set, the caller's optimizer is plain SGD (no momentum, so no state) and the
// update is applied here instead of handed over: w -= lr * (gradient + weight_decay * w), the rule
// the caller's optimizer would apply to the handed-over gradient, in the same pass (the fast path).
struct PlainSgd {
  bool on = false;
  float learning_rate = 0;
  float weight_decay = 0;
};

struct HandedOverGradients {
  std::vector<float> gradient;
  std::vector<std::uint8_t> updated;
  std::function<void()> apply_pending;
  PlainSgd plain_sgd;
  // Sized for `layout`, nothing handed over.
  void reset(const Layout& layout);
  // The caller applied (or dropped) what was handed over: `cleared` counts these.
  void clear() {
    std::fill(updated.begin(), updated.end(), std::uint8_t{0});
    ++cleared;
  }
  std::uint64_t cleared = 0;
  bool any() const;
};

class GradientHandoff final : public Optimizer {
 public:
  // `into` is sized for `layout` unless it is (what it holds then stays) and must outlive this
  // optimizer.
  GradientHandoff(const Layout& layout, std::shared_ptr<HandedOverGradients> into);

  void step(std::span<float> parameters, std::span<const float> gradients, float gradient_scale,
            std::size_t offset) override;
  void predict(std::span<const float> parameters, std::span<const float> gradients, float gradient_scale,
               std::size_t offset, std::span<float> predicted) const override;
  // The caller's optimizer owns the learning rate: ignored.
  void set_learning_rate_factor(double) override {}
  // No state of its own (the caller's optimizer has it).
  void save_state(CheckpointWriter&, const std::string&) const override {}
  void load_state(const CheckpointReader&, const std::string&) override {}

  // The per-element form for fused loops (optim/fused_update.h): step() records g as element i's
  // gradient and returns w unchanged (with plain_sgd on: returns w updated). Valid while this
  // optimizer lives.
  struct ElementKernel {
    float* gradient;
    PlainSgd plain_sgd;
    float step(std::size_t i, float w, float g) {
      if (plain_sgd.on) return w - plain_sgd.learning_rate * (g + plain_sgd.weight_decay * w);
      gradient[i] = g;
      return w;
    }
    float predict(std::size_t, float w, float) const;  // an internal error, as predict()
  };
  // The kernel for elements [offset, offset + count) (whole segments, which it marks updated).
  ElementKernel element_kernel(std::size_t offset, std::size_t count);
  // True while the update of what step() is given happens later, by the caller's optimizer (not
  // with plain_sgd on); the parameters change then, in hand-over round `round()`.
  bool defers() const { return !into_->plain_sgd.on; }
  std::uint64_t round() const { return into_->cleared; }

 private:
  // Applies what is pending in [offset, offset + count) if anything is, then marks it updated.
  void mark_updated(std::size_t offset, std::size_t count);

  Layout layout_;
  std::shared_ptr<HandedOverGradients> into_;
};

}  // namespace pipesgd
