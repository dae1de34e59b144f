// DC-ASGD's delay compensation (optim/delay_compensation.h, OD-SGD paper Eq. 4-6) against values
// worked by hand, and its usage errors.
#include "pipesgd/optim/delay_compensation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// The worked example used throughout (also by the server test in parameter_server_test.cpp):
//   w_then = {1, -2, 0.5}, w_now = {0.5, -2.25, 1.5}, so w_now - w_then = {-0.5, -0.25, 1};
//   g = {1, -3, 2}, lambda = 0.25.
const std::vector<float> kThen = {1.0f, -2.0f, 0.5f};
const std::vector<float> kNow = {0.5f, -2.25f, 1.5f};
const std::vector<float> kGradient = {1.0f, -3.0f, 2.0f};

DelayCompensationOptions constant(float lambda) {
  DelayCompensationOptions options;
  options.variant = DelayCompensationVariant::kConstant;
  options.lambda = lambda;
  return options;
}

TEST(DelayCompensation, ConstantMatchesEquation4ByHand) {
  // Eq. 4: g + lambda g^2 (w_now - w_then):
  //   1 + 0.25 * 1 * (-0.5) = 0.875;  -3 + 0.25 * 9 * (-0.25) = -3.5625;  2 + 0.25 * 4 * 1 = 3.
  DelayCompensation compensation(3, constant(0.25f));
  std::vector<float> out(3);
  compensation.compensate(kGradient, kNow, kThen, out);
  EXPECT_EQ(out, (std::vector<float>{0.875f, -3.5625f, 3.0f}));  // exact: dyadic values
  EXPECT_TRUE(compensation.mean_square().empty());
}

TEST(DelayCompensation, NoDelayOrZeroLambdaLeavesTheGradient) {
  DelayCompensation compensation(3, constant(0.25f));
  std::vector<float> out(3);
  compensation.compensate(kGradient, kThen, kThen, out);  // w_now == w_then
  EXPECT_EQ(out, kGradient);
  DelayCompensation off(3, constant(0.0f));
  off.compensate(kGradient, kNow, kThen, out);
  EXPECT_EQ(out, kGradient);
}

TEST(DelayCompensation, AdaptiveMatchesEquations5And6ByHand) {
  // m = 0.5. A first gradient {2, 1, -4} (no delay) only advances MeanSquare (Eq. 6):
  //   MeanSquare = 0.5 * 0 + 0.5 * {4, 1, 16} = {2, 0.5, 8}.
  // The delayed gradient g = {1, -3, 2} then gives
  //   MeanSquare = 0.5 * {2, 0.5, 8} + 0.5 * {1, 9, 4} = {1.5, 4.75, 6}
  //   lambda / sqrt(MeanSquare) = 0.25 / {1.2247449, 2.1794495, 2.4494897} = {0.2041241, 0.1147079, 0.1020621}
  //   g~ = g + that * g^2 * (w_now - w_then)                                   (Eq. 5)
  //      = {1 - 0.2041241 * 0.5, -3 - 0.1147079 * 9 * 0.25, 2 + 0.1020621 * 4}
  //      = {0.8979379, -3.2580927, 2.4082483}
  DelayCompensationOptions options;
  options.variant = DelayCompensationVariant::kAdaptive;
  options.lambda = 0.25f;
  options.mean_square_decay = 0.5f;
  DelayCompensation compensation(3, options);
  std::vector<float> out(3);
  const std::vector<float> first = {2.0f, 1.0f, -4.0f};
  compensation.compensate(first, kThen, kThen, out);
  EXPECT_EQ(out, first);
  EXPECT_EQ(std::vector<float>(compensation.mean_square().begin(), compensation.mean_square().end()),
            (std::vector<float>{2.0f, 0.5f, 8.0f}));
  compensation.compensate(kGradient, kNow, kThen, out);
  EXPECT_EQ(std::vector<float>(compensation.mean_square().begin(), compensation.mean_square().end()),
            (std::vector<float>{1.5f, 4.75f, 6.0f}));
  const std::vector<float> expected = {0.8979379f, -3.2580927f, 2.4082483f};
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(out[i], expected[i], 1e-6) << i;
}

TEST(DelayCompensation, OffsetSelectsTheMeanSquareElementsAndOutputMayAliasTheGradient) {
  DelayCompensationOptions options;
  options.variant = DelayCompensationVariant::kAdaptive;
  options.lambda = 0.25f;
  options.mean_square_decay = 0.5f;
  DelayCompensation compensation(5, options);
  std::vector<float> gradient = {2.0f, -4.0f};
  const std::vector<float> now = {1.0f, 1.0f}, then = {0.0f, 0.0f};
  compensation.compensate(gradient, now, then, gradient, /*offset=*/3);  // in place
  // MeanSquare[3..4] = 0.5 * {4, 16} = {2, 8}; g~ = g + 0.25 / sqrt(MS) * g^2 * 1
  //   = {2 + 0.25 / 1.4142136 * 4, -4 + 0.25 / 2.8284271 * 16} = {2.7071068, -2.5857864}.
  const auto mean_square = compensation.mean_square();
  EXPECT_EQ(mean_square[0], 0.0f);
  EXPECT_EQ(mean_square[2], 0.0f);
  EXPECT_EQ(mean_square[3], 2.0f);
  EXPECT_EQ(mean_square[4], 8.0f);
  EXPECT_NEAR(gradient[0], 2.7071068f, 1e-6);
  EXPECT_NEAR(gradient[1], -2.5857864f, 1e-6);
}

TEST(DelayCompensation, UsageErrors) {
  auto message = [](DelayCompensationOptions options) {
    try {
      DelayCompensation(1, options);
    } catch (const UsageError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  DelayCompensationOptions options;
  options.lambda = -1;
  EXPECT_EQ(message(options), "delay compensation lambda must be >= 0, got -1");
  options.lambda = NAN;
  EXPECT_EQ(message(options), "delay compensation lambda must be >= 0, got nan");
  options = {};
  options.mean_square_decay = 1;
  EXPECT_EQ(message(options), "delay compensation m (the mean square's decay) must be in [0, 1), got 1");
  options = {};
  options.epsilon = 0;
  EXPECT_EQ(message(options), "delay compensation epsilon must be > 0, got 0");
  EXPECT_EQ(parse_delay_compensation_variant("a"), DelayCompensationVariant::kAdaptive);
  EXPECT_EQ(parse_delay_compensation_variant("c"), DelayCompensationVariant::kConstant);
  EXPECT_STREQ(variant_name(DelayCompensationVariant::kAdaptive), "a");
  EXPECT_THROW(parse_delay_compensation_variant("C"), UsageError);
}

}  // namespace
}  // namespace pipesgd
