#pragma once
// ParameterBinding: binds any LibTorch module's parameters to one flat fp32 buffer and its backward
// to a caller's flat gradient buffer (what PyTorch DDP calls gradient-as-bucket-view). Used by the
// built-in models (torch_models.cpp), the TorchScript model and the public C++ API. Includes LibTorch;
// only code under src/pipesgd/torch/ and the public API may include it.
//
// Contract
// - Segments: given in forward order (segment 0 = the first layer), each a name and its parameter
//   tensors in layout order. The flat layout is segment 0's tensors, then segment 1's, ... without
//   gaps (layout()). Every tensor must be a distinct CPU float32 leaf that requires grad; else the
//   constructor throws UsageError naming the segment (the callers' models are user input).
// - Parameter buffer: owned by the binding (parameters(), layout().total() floats, never moves). The
//   constructor copies each tensor's value into it and rebinds the tensor as a view of it (set_data),
//   so the module computes with exactly the buffer's values and writing the buffer changes the
//   module. The destructor rebinds every tensor to a private copy of its current value (so a module
//   that outlives the binding stays valid) and detaches the hooks.
// - Hooks: the constructor registers one post-hook on each tensor's AccumulateGrad node and keeps
//   the node alive (a tensor refers to it only weakly). Hooks live until the binding is destroyed;
//   after that, a node that still exists runs a hook that does nothing. LibTorch offers no way to
//   remove a hook, so binding the same tensors again adds another hook; only the live binding's acts.
// - Threads: the binding is used by one thread at a time. LibTorch runs a CPU backward on the thread
//   that calls backward(), so the hooks, and on_ready, run on that thread.
// - Armed backward: arm(gradients, on_ready) zero-fills `gradients` (layout().total() floats, owned
//   by the caller, valid until disarm/finish) and points every tensor's grad at its view of it; any
//   backward that then runs through these tensors (loss.backward() called by anyone, including the
//   user of the public API) accumulates straight into `gradients`. Each hook reports its tensor; when
//   all tensors of a segment have accumulated, the segment is complete, and complete segments are
//   passed to on_ready strictly in backward order (last segment first): a segment that completes
//   before a later one is held back until the later one has been reported. on_ready(segment,
//   seconds) gets the time since the previous report (or since arm()). finish() ends the armed
//   state normally: it copies any gradient LibTorch left outside the buffer, reports the segments
//   not reported yet (a tensor that got no gradient keeps zeros), and resets every grad to
//   undefined. disarm() ends it without reporting (e.g. when backward threw). Backward passes per
//   arm (arm's `backward_passes`, default 1): every pass accumulates into `gradients`; a tensor is
//   ready when its accumulator fired that many times (gradient accumulation over several
//   micro-batches reports each segment once, after its last pass); further passes add into
//   `gradients` but report nothing new.
// - If LibTorch replaces a grad instead of accumulating into the view (out-of-place accumulation,
//   e.g. create_graph, or the user reset the grads after arm()), the hook copies the value into
//   `gradients` and points the grad back at the view; gradient_copy_count() counts these copies.
// - A backward while not armed: the hooks do nothing; gradients go to the tensors' grad fields as
//   LibTorch normally does (fresh tensors, not in any flat buffer).
// - Readiness order: each armed backward records the order in which tensors' accumulators fired
//   (parameter_readiness_order()) and segments completed (segment_readiness_order()); a caller can
//   run one backward and then order its segments by it (as DDP rebuilds its buckets after the first
//   iteration): build a new binding with the segments in reverse completion order.
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/layout.h"
#include "pipesgd/core/model.h"

namespace pipesgd {

struct ParameterSegment {
  std::string name;
  std::vector<torch::Tensor> parameters;  // in layout order
};

class ParameterBinding {
 public:
  explicit ParameterBinding(std::vector<ParameterSegment> segments);
  ~ParameterBinding();
  ParameterBinding(const ParameterBinding&) = delete;
  ParameterBinding& operator=(const ParameterBinding&) = delete;

  const Layout& layout() const { return layout_; }
  std::span<float> parameters() { return flat_parameters_; }
  // The bound tensors in layout order, and where each starts in the flat buffer / which segment.
  const std::vector<torch::Tensor>& tensors() const { return parameters_; }
  std::size_t tensor_offset(std::size_t tensor) const { return parameter_offsets_.at(tensor); }
  std::size_t tensor_segment(std::size_t tensor) const { return parameter_segments_.at(tensor); }

  // See the contract above. `on_ready` may be empty; it must stay alive until finish()/disarm().
  // Views of the last few distinct gradient buffers are cached (a method rotating K buffers passes
  // the same K pointers), so arming with a known buffer does not allocate.
  void arm(std::span<float> gradients, const SegmentReadyFn& on_ready, std::uint32_t backward_passes = 1);
  void finish();
  void disarm() noexcept;
  bool armed() const { return armed_; }

  // arm(), loss.backward(create_graph), finish(); disarm() if backward throws.
  void backward(const torch::Tensor& loss, std::span<float> gradients, const SegmentReadyFn& on_ready,
                bool create_graph = false);

  // Tensor indices (layout order) in the order their accumulators fired in the last armed backward;
  // tensors that got no gradient are missing.
  const std::vector<std::size_t>& parameter_readiness_order() const { return readiness_order_; }
  // Segment indices in the order they completed in the last armed backward (before finish());
  // segments that never completed are missing.
  const std::vector<std::size_t>& segment_readiness_order() const { return completion_order_; }

  std::size_t gradient_copy_count() const { return gradient_copy_count_; }

 private:
  struct HookTarget;
  class AccumulatedHook;
  struct GradientViews {
    const float* data = nullptr;
    std::uint64_t last_used = 0;
    std::vector<torch::Tensor> views;
  };
  static constexpr std::size_t gradient_view_cache_capacity = 8;

  std::vector<torch::Tensor>& gradient_views_for(std::span<float> gradients);
  void on_parameter_accumulated(std::size_t tensor);
  void ensure_gradient_in_buffer(std::size_t tensor);
  void report_completed_segments();

  std::vector<float> flat_parameters_;
  Layout layout_;
  std::vector<torch::Tensor> parameters_;
  std::vector<std::size_t> parameter_offsets_;
  std::vector<std::size_t> parameter_segments_;
  std::vector<std::size_t> parameters_per_segment_;
  std::vector<std::shared_ptr<torch::autograd::Node>> gradient_accumulators_;
  std::shared_ptr<HookTarget> hook_target_;
  std::array<GradientViews, gradient_view_cache_capacity> gradient_view_cache_;
  std::uint64_t gradient_view_clock_ = 0;

  // State of the armed backward; only touched by the thread using the binding.
  bool armed_ = false;
  std::vector<torch::Tensor>* active_views_ = nullptr;
  const SegmentReadyFn* active_on_ready_ = nullptr;
  std::vector<std::size_t> accumulated_per_segment_;
  std::uint32_t backward_passes_ = 1;
  std::vector<std::uint32_t> parameter_fired_;  // times each tensor's accumulator fired
  std::vector<char> segment_complete_;
  std::size_t segments_reported_ = 0;
  Clock::time_point last_report_time_;
  std::vector<std::size_t> readiness_order_;
  std::vector<std::size_t> completion_order_;
  std::size_t gradient_copy_count_ = 0;
};

}  // namespace pipesgd
