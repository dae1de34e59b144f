// Oracle: our fused Adam and Sgd (optim/adam.h, optim/sgd.h) against torch::optim::Adam and
// torch::optim::SGD on a three-segment layout, one torch tensor per segment. Our gradient_scale is
// applied to the torch gradient before the torch step.
// Our loops mirror LibTorch's kernels operation by operation: with ATEN_CPU_CAPABILITY=default
// (no FMA) both oracles agree bit for bit; with AVX2/AVX-512 LibTorch fuses some multiply-adds and the
// difference is ~1 ulp (about 5e-7 relative here).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <span>
#include <vector>

#include "pipesgd/core/layout.h"
#include "pipesgd/optim/adam.h"
#include "pipesgd/optim/optimizer.h"
#include "pipesgd/optim/sgd.h"

namespace pipesgd {
namespace {

constexpr int kSteps = 5;
constexpr float kGradientScale = 0.25f;

Layout oracle_layout() {
  Layout layout;
  layout.add("fc1", 37);
  layout.add("fc2", 64);
  layout.add("fc3", 11);
  return layout;
}

std::vector<float> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& value : values) value = normal(engine);
  return values;
}

// One leaf tensor per segment, initialised from `flat`.
std::vector<torch::Tensor> torch_parameters(const Layout& layout, const std::vector<float>& flat) {
  std::vector<torch::Tensor> parameters;
  for (const Segment& segment : layout.segments()) {
    torch::Tensor tensor = torch::from_blob(const_cast<float*>(flat.data() + segment.offset),
                                            {static_cast<std::int64_t>(segment.count)})
                               .clone();
    parameters.push_back(tensor.set_requires_grad(true));
  }
  return parameters;
}

// Sets each torch parameter's gradient to `gradient_scale * flat gradient` of its segment.
void set_gradients(const Layout& layout, std::vector<torch::Tensor>& parameters, const std::vector<float>& flat,
                   float gradient_scale) {
  for (std::size_t index = 0; index < parameters.size(); ++index) {
    const Segment& segment = layout.segment(index);
    torch::Tensor gradient = torch::from_blob(const_cast<float*>(flat.data() + segment.offset),
                                              {static_cast<std::int64_t>(segment.count)})
                                 .clone();
    parameters[index].mutable_grad() = gradient * gradient_scale;
  }
}

// max over elements of |ours - torch| / max(|torch|, 1e-3): relative, with a floor so that a weight
// passing near zero does not turn a rounding difference into a large ratio.
double max_relative_difference(const Layout& layout, const std::vector<float>& ours,
                               const std::vector<torch::Tensor>& theirs) {
  double worst = 0;
  for (std::size_t index = 0; index < theirs.size(); ++index) {
    const Segment& segment = layout.segment(index);
    const torch::Tensor contiguous = theirs[index].detach().contiguous();
    const float* expected = contiguous.data_ptr<float>();
    for (std::size_t i = 0; i < segment.count; ++i) {
      const double difference = std::abs(static_cast<double>(ours[segment.offset + i]) - expected[i]);
      worst = std::max(worst, difference / std::max(std::abs(static_cast<double>(expected[i])), 1e-3));
    }
  }
  return worst;
}

// Runs kSteps of `ours` (over the whole buffer, or segment by segment) and of `theirs` on the same
// random gradients; returns the largest relative difference seen after any step.
double run_against_torch(Optimizer& ours, torch::optim::Optimizer& theirs, const Layout& layout,
                         std::vector<float>& weights, std::vector<torch::Tensor>& torch_weights,
                         bool segment_by_segment) {
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    const std::vector<float> gradients = random_values(layout.total(), 1000 + static_cast<std::uint32_t>(step));
    if (segment_by_segment) {
      for (const Segment& segment : layout.segments()) {
        ours.step(std::span<float>(weights).subspan(segment.offset, segment.count),
                  std::span<const float>(gradients).subspan(segment.offset, segment.count), kGradientScale,
                  segment.offset);
      }
    } else {
      ours.step(weights, gradients, kGradientScale, 0);
    }
    set_gradients(layout, torch_weights, gradients, kGradientScale);
    theirs.step();
    worst = std::max(worst, max_relative_difference(layout, weights, torch_weights));
  }
  return worst;
}

struct AdamCase {
  float weight_decay;
  bool segment_by_segment;
};

void PrintTo(const AdamCase& c, std::ostream* out) {
  *out << "weight decay " << c.weight_decay << (c.segment_by_segment ? ", segment by segment" : ", whole buffer");
}

class AdamOracle : public ::testing::TestWithParam<AdamCase> {};

TEST_P(AdamOracle, FiveStepsMatchTorchOptimAdam) {
  const Layout layout = oracle_layout();
  AdamOptions options;
  options.learning_rate = 0.01f;
  options.beta1 = 0.85f;
  options.beta2 = 0.995f;
  options.epsilon = 1e-6f;
  options.weight_decay = GetParam().weight_decay;
  std::vector<float> weights = random_values(layout.total(), 1);
  std::vector<torch::Tensor> torch_weights = torch_parameters(layout, weights);
  // LibTorch's options are doubles; pass exactly our floats.
  torch::optim::Adam torch_adam(
      torch_weights, torch::optim::AdamOptions(options.learning_rate)
                         .betas({static_cast<double>(options.beta1), static_cast<double>(options.beta2)})
                         .eps(options.epsilon)
                         .weight_decay(options.weight_decay));
  Adam adam(layout, options);
  const std::vector<float> initial = weights;
  const double worst =
      run_against_torch(adam, torch_adam, layout, weights, torch_weights, GetParam().segment_by_segment);
  EXPECT_LE(worst, 1e-5);
  EXPECT_NE(weights, initial);
  for (std::size_t index = 0; index < layout.segment_count(); ++index) {
    EXPECT_EQ(adam.step_count(index), kSteps);
  }
}

INSTANTIATE_TEST_SUITE_P(WeightDecayAndRanges, AdamOracle,
                         ::testing::Values(AdamCase{0.0f, false}, AdamCase{0.05f, false},
                                           AdamCase{0.05f, true}));

TEST(SgdOracle, FiveStepsWithMomentumAndWeightDecayMatchTorchOptimSgd) {
  const Layout layout = oracle_layout();
  const SgdOptions options{0.05f, 0.9f, 1e-2f};
  std::vector<float> weights = random_values(layout.total(), 2);
  std::vector<torch::Tensor> torch_weights = torch_parameters(layout, weights);
  torch::optim::SGD torch_sgd(torch_weights, torch::optim::SGDOptions(options.learning_rate)
                                                 .momentum(options.momentum)
                                                 .weight_decay(options.weight_decay));
  const std::unique_ptr<Optimizer> sgd = make_optimizer({"sgd", options, {}}, layout);
  // Bit-identical unless LibTorch's vectorised kernels fuse a multiply-add (AVX2 FMA): then 1 ulp.
  EXPECT_LE(run_against_torch(*sgd, torch_sgd, layout, weights, torch_weights, true), 1e-6);
}

}  // namespace
}  // namespace pipesgd
