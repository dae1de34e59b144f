// ParameterBinding on a small user module: the armed mode with the user's own backward, the hold-back
// of early segments, the readiness order, the copy fallback, unarmed backward and destruction.
#include "pipesgd/torch/parameter_binding.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

struct TwoLayers : torch::nn::Module {
  torch::nn::Linear first{nullptr}, second{nullptr};
  TwoLayers() {
    torch::manual_seed(7);
    first = register_module("first", torch::nn::Linear(3, 4));
    second = register_module("second", torch::nn::Linear(4, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) { return second->forward(torch::tanh(first->forward(x))); }
};

std::vector<ParameterSegment> forward_order(TwoLayers& m) {
  return {{"first", {m.first->weight, m.first->bias}}, {"second", {m.second->weight, m.second->bias}}};
}

torch::Tensor input() { return torch::arange(6, torch::kFloat32).reshape({2, 3}) / 5.0; }

// The gradient an unbound copy of the module gets, flattened in `order` (layer names).
std::vector<float> reference_gradient(const std::vector<std::string>& order) {
  TwoLayers reference;
  reference.forward(input()).pow(2).sum().backward();
  std::vector<float> flat;
  for (const std::string& name : order) {
    const auto& layer = name == "first" ? reference.first : reference.second;
    for (const torch::Tensor& t : {layer->weight, layer->bias}) {
      const torch::Tensor g = t.grad().contiguous();
      flat.insert(flat.end(), g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
    }
  }
  return flat;
}

struct Report {
  std::vector<std::size_t> segments;
  SegmentReadyFn fn() {
    return [this](std::size_t segment, double seconds) {
      EXPECT_GE(seconds, 0.0);
      segments.push_back(segment);
    };
  }
};

TEST(ParameterBindingTest, ParametersBecomeViewsOfTheFlatBuffer) {
  TwoLayers module;
  const torch::Tensor before = module.first->weight.detach().clone();
  ParameterBinding binding(forward_order(module));
  EXPECT_EQ(binding.layout().segment_count(), 2u);
  EXPECT_EQ(binding.layout().total(), 3u * 4 + 4 + 4 * 2 + 2);
  EXPECT_EQ(module.first->weight.data_ptr<float>(), binding.parameters().data());
  EXPECT_TRUE(torch::equal(module.first->weight.detach(), before));
  binding.parameters()[0] = 42.0f;  // writing the buffer changes the module
  EXPECT_EQ(module.first->weight.detach().flatten()[0].item<float>(), 42.0f);
}

TEST(ParameterBindingTest, UsersOwnBackwardWhileArmedLandsInTheBufferInBackwardOrder) {
  TwoLayers module;
  ParameterBinding binding(forward_order(module));
  std::vector<float> gradients(binding.layout().total(), -1.0f);  // arm() zero-fills
  Report report;
  const SegmentReadyFn on_ready = report.fn();
  binding.arm(gradients, on_ready);
  module.forward(input()).pow(2).sum().backward();  // the user's own backward
  EXPECT_EQ(report.segments, (std::vector<std::size_t>{1, 0})) << "reported during the backward";
  binding.finish();
  EXPECT_EQ(report.segments, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(gradients, reference_gradient({"first", "second"}));
  EXPECT_EQ(binding.gradient_copy_count(), 0u);
  EXPECT_FALSE(module.first->weight.grad().defined()) << "finish() resets the grads";
  EXPECT_EQ(binding.segment_readiness_order(), (std::vector<std::size_t>{1, 0}));
  ASSERT_EQ(binding.parameter_readiness_order().size(), 4u);
  EXPECT_GE(binding.parameter_readiness_order()[0], 2u) << "the second layer's tensors fire first";
  EXPECT_GE(binding.parameter_readiness_order()[1], 2u);
}

TEST(ParameterBindingTest, SegmentsInTheWrongOrderAreHeldBackAndTheOrderTellsTheRightOne) {
  TwoLayers module;
  // Given backwards: segment 0 = "second" completes first but is reported only after segment 1.
  ParameterBinding binding({{"second", {module.second->weight, module.second->bias}},
                            {"first", {module.first->weight, module.first->bias}}});
  std::vector<float> gradients(binding.layout().total());
  Report report;
  const SegmentReadyFn on_ready = report.fn();
  binding.backward(module.forward(input()).pow(2).sum(), gradients, on_ready);
  EXPECT_EQ(report.segments, (std::vector<std::size_t>{1, 0}));
  EXPECT_EQ(binding.segment_readiness_order(), (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(gradients, reference_gradient({"second", "first"}));
}

TEST(ParameterBindingTest, GradsResetAfterArmingTakeTheCopyPath) {
  TwoLayers module;
  ParameterBinding binding(forward_order(module));
  std::vector<float> gradients(binding.layout().total());
  const SegmentReadyFn none;
  binding.arm(gradients, none);
  module.zero_grad(/*set_to_none=*/true);  // a user's optimizer.zero_grad() after arm()
  module.forward(input()).pow(2).sum().backward();
  binding.finish();
  EXPECT_EQ(binding.gradient_copy_count(), 4u);
  EXPECT_EQ(gradients, reference_gradient({"first", "second"}));
}

TEST(ParameterBindingTest, UnarmedBackwardLeavesTheBufferAloneAndTheGradsToLibTorch) {
  TwoLayers module;
  ParameterBinding binding(forward_order(module));
  std::vector<float> gradients(binding.layout().total(), 3.0f);
  Report report;
  const SegmentReadyFn on_ready = report.fn();
  binding.arm(gradients, on_ready);
  binding.disarm();
  module.forward(input()).pow(2).sum().backward();
  EXPECT_TRUE(report.segments.empty());
  EXPECT_EQ(gradients, std::vector<float>(gradients.size(), 0.0f)) << "only arm()'s zero-fill";
  ASSERT_TRUE(module.first->weight.grad().defined());
  EXPECT_NE(module.first->weight.grad().data_ptr<float>(), gradients.data());
  EXPECT_TRUE(binding.parameter_readiness_order().empty());
}

TEST(ParameterBindingTest, ModuleOutlivesTheBindingWithItsValues) {
  TwoLayers module;
  torch::Tensor value;
  {
    ParameterBinding binding(forward_order(module));
    binding.parameters()[0] = 5.0f;
    value = module.first->weight.detach().clone();
  }
  EXPECT_TRUE(torch::equal(module.first->weight.detach(), value));
  module.forward(input()).sum().backward();  // the old hooks are inert
  EXPECT_TRUE(module.first->weight.grad().defined());
  // A new binding over the same tensors works (and only its hooks act).
  ParameterBinding again(forward_order(module));
  std::vector<float> gradients(again.layout().total());
  Report report;
  const SegmentReadyFn on_ready = report.fn();
  module.zero_grad();
  again.backward(module.forward(input()).sum(), gradients, on_ready);
  EXPECT_EQ(report.segments, (std::vector<std::size_t>{1, 0}));
}

TEST(ParameterBindingTest, RejectsWhatItCannotBind) {
  TwoLayers module;
  EXPECT_THROW(ParameterBinding({{"a", {module.first->weight}}, {"b", {module.first->weight}}}), UsageError);
  torch::Tensor doubles = torch::zeros({2}, torch::kFloat64).requires_grad_();
  EXPECT_THROW(ParameterBinding({{"d", {doubles}}}), UsageError);
  torch::Tensor frozen = torch::zeros({2});
  EXPECT_THROW(ParameterBinding({{"f", {frozen}}}), UsageError);
}

}  // namespace
}  // namespace pipesgd
