#include "pipesgd/torch/parameter_binding.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// A non-owning float tensor over `data`; the memory must outlive every use of the tensor.
torch::Tensor view_of(float* data, c10::IntArrayRef sizes) {
  return torch::from_blob(data, sizes, torch::TensorOptions().dtype(torch::kFloat32));
}

}  // namespace

// The binding the hooks report to; null once the binding is destroyed (hooks cannot be removed).
struct ParameterBinding::HookTarget {
  ParameterBinding* binding = nullptr;
};

// Runs after LibTorch's AccumulateGrad node of one tensor.
class ParameterBinding::AccumulatedHook final : public torch::autograd::FunctionPostHook {
 public:
  AccumulatedHook(std::shared_ptr<HookTarget> target, std::size_t tensor)
      : target_(std::move(target)), tensor_(tensor) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (target_->binding != nullptr) target_->binding->on_parameter_accumulated(tensor_);
    return outputs;
  }

 private:
  std::shared_ptr<HookTarget> target_;
  std::size_t tensor_;
};

ParameterBinding::ParameterBinding(std::vector<ParameterSegment> segments)
    : hook_target_(std::make_shared<HookTarget>()) {
  std::unordered_set<const void*> seen;
  for (std::size_t segment = 0; segment < segments.size(); ++segment) {
    const ParameterSegment& source = segments[segment];
    std::size_t segment_count = 0;
    for (std::size_t k = 0; k < source.parameters.size(); ++k) {
      const torch::Tensor& parameter = source.parameters[k];
      const auto where = [&] { return concat("parameter ", k, " of layer '", source.name, "'"); };
      if (!parameter.defined()) throw UsageError(concat(where(), " is undefined"));
      if (parameter.scalar_type() != torch::kFloat32) {
        throw UsageError(concat(where(), " has dtype ", c10::toString(parameter.scalar_type()),
                                "; only float32 parameters are supported"));
      }
      if (!parameter.device().is_cpu()) {
        throw UsageError(concat(where(), " is on ", parameter.device().str(), "; only CPU is supported"));
      }
      if (!parameter.requires_grad() || !parameter.is_leaf()) {
        throw UsageError(concat(where(), " is not a leaf tensor that requires grad"));
      }
      if (!seen.insert(parameter.unsafeGetTensorImpl()).second) {
        throw UsageError(concat(where(), " is shared with another layer; shared parameters are not supported"));
      }
      parameter_offsets_.push_back(layout_.total() + segment_count);
      parameter_segments_.push_back(segment);
      parameters_.push_back(parameter);
      segment_count += static_cast<std::size_t>(parameter.numel());
    }
    layout_.add(source.name, segment_count);
    parameters_per_segment_.push_back(source.parameters.size());
  }

  // Copy the initial values into the flat buffer and make every tensor a view of it.
  flat_parameters_.resize(layout_.total());
  {
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      torch::Tensor& parameter = parameters_[i];
      float* destination = flat_parameters_.data() + parameter_offsets_[i];
      torch::Tensor view = view_of(destination, parameter.sizes());
      view.copy_(parameter.detach());
      parameter.set_data(view);
      PIPESGD_ASSERT(parameter.data_ptr<float>() == destination && parameter.requires_grad());
    }
  }

  hook_target_->binding = this;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(parameters_[i]);
    PIPESGD_ASSERT(accumulator != nullptr);
    accumulator->add_post_hook(std::make_unique<AccumulatedHook>(hook_target_, i));
    gradient_accumulators_.push_back(std::move(accumulator));
  }

  for (GradientViews& entry : gradient_view_cache_) entry.views.reserve(parameters_.size());
  accumulated_per_segment_.assign(layout_.segment_count(), 0);
  segment_complete_.assign(layout_.segment_count(), 0);
  parameter_fired_.assign(parameters_.size(), 0);
  readiness_order_.reserve(parameters_.size());
  completion_order_.reserve(layout_.segment_count());
}

ParameterBinding::~ParameterBinding() {
  disarm();
  hook_target_->binding = nullptr;
  torch::NoGradGuard no_grad;
  for (torch::Tensor& parameter : parameters_) parameter.set_data(parameter.detach().clone());
}

std::vector<torch::Tensor>& ParameterBinding::gradient_views_for(std::span<float> gradients) {
  ++gradient_view_clock_;
  GradientViews* least_recent = &gradient_view_cache_[0];
  for (GradientViews& entry : gradient_view_cache_) {
    if (entry.data == gradients.data()) {
      entry.last_used = gradient_view_clock_;
      return entry.views;
    }
    if (entry.last_used < least_recent->last_used) least_recent = &entry;
  }
  least_recent->data = gradients.data();
  least_recent->last_used = gradient_view_clock_;
  least_recent->views.clear();  // capacity was reserved at construction
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    least_recent->views.push_back(
        view_of(gradients.data() + parameter_offsets_[i], parameters_[i].sizes()));
  }
  return least_recent->views;
}

void ParameterBinding::arm(std::span<float> gradients, const SegmentReadyFn& on_ready, std::uint32_t backward_passes) {
  PIPESGD_ASSERT(!armed_ && gradients.size() == layout_.total() && backward_passes >= 1);
  backward_passes_ = backward_passes;
  std::fill(gradients.begin(), gradients.end(), 0.0f);
  std::vector<torch::Tensor>& views = gradient_views_for(gradients);
  for (std::size_t i = 0; i < parameters_.size(); ++i) parameters_[i].mutable_grad() = views[i];
  std::fill(accumulated_per_segment_.begin(), accumulated_per_segment_.end(), 0);
  std::fill(segment_complete_.begin(), segment_complete_.end(), 0);
  std::fill(parameter_fired_.begin(), parameter_fired_.end(), 0);
  readiness_order_.clear();
  completion_order_.clear();
  segments_reported_ = 0;
  active_views_ = &views;
  active_on_ready_ = &on_ready;
  last_report_time_ = Clock::now();
  armed_ = true;
}

void ParameterBinding::finish() {
  PIPESGD_ASSERT(armed_);
  // Tensors whose hook did not run keep a zero gradient.
  for (std::size_t i = 0; i < parameters_.size(); ++i) ensure_gradient_in_buffer(i);
  std::fill(segment_complete_.begin(), segment_complete_.end(), 1);
  report_completed_segments();
  disarm();
}

void ParameterBinding::disarm() noexcept {
  armed_ = false;
  active_views_ = nullptr;
  active_on_ready_ = nullptr;
  for (torch::Tensor& parameter : parameters_) parameter.mutable_grad().reset();
}

void ParameterBinding::backward(const torch::Tensor& loss, std::span<float> gradients,
                                const SegmentReadyFn& on_ready, bool create_graph) {
  arm(gradients, on_ready);
  try {
    loss.backward(/*gradient=*/{}, /*retain_graph=*/c10::nullopt, create_graph);
  } catch (...) {
    disarm();
    throw;
  }
  finish();
}

// If LibTorch replaced the tensor's grad instead of accumulating into our view, copies the value
// into the armed gradient buffer and points the grad back at the view.
void ParameterBinding::ensure_gradient_in_buffer(std::size_t tensor) {
  torch::Tensor& grad = parameters_[tensor].mutable_grad();
  torch::Tensor& view = (*active_views_)[tensor];
  if (!grad.defined() || grad.data_ptr() == view.data_ptr()) return;
  torch::NoGradGuard no_grad;
  view.copy_(grad);
  grad = view;
  ++gradient_copy_count_;
}

void ParameterBinding::on_parameter_accumulated(std::size_t tensor) {
  if (!armed_) return;  // a backward while not armed
  ensure_gradient_in_buffer(tensor);
  if (parameter_fired_[tensor] >= backward_passes_) return;  // a further backward in the same armed state
  if (++parameter_fired_[tensor] < backward_passes_) return;
  readiness_order_.push_back(tensor);
  const std::size_t segment = parameter_segments_[tensor];
  if (++accumulated_per_segment_[segment] == parameters_per_segment_[segment]) {
    segment_complete_[segment] = 1;
    completion_order_.push_back(segment);
    report_completed_segments();
  }
}

// Reports completed segments strictly from the last to the first: a segment that completes before a
// later one is held back until the later one has been reported.
void ParameterBinding::report_completed_segments() {
  const std::size_t segment_count = layout_.segment_count();
  while (segments_reported_ < segment_count &&
         segment_complete_[segment_count - 1 - segments_reported_]) {
    const std::size_t segment = segment_count - 1 - segments_reported_;
    const Clock::time_point now = Clock::now();
    const double seconds = Seconds(now - last_report_time_).count();
    last_report_time_ = now;
    ++segments_reported_;
    if (*active_on_ready_) (*active_on_ready_)(segment, seconds);
  }
}

}  // namespace pipesgd
