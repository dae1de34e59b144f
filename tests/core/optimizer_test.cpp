// The Optimizer interface (optim/optimizer.h): Sgd's and Adam's predict() against step(), Adam
// against its formula evaluated in double, Adam's per-segment step counts, usage errors and
// make_optimizer. (The LibTorch oracle is tests/torch/adam_oracle_test.cpp.)
#include "pipesgd/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/core/layout.h"
#include "pipesgd/optim/adam.h"
#include "pipesgd/optim/sgd.h"

namespace pipesgd {
namespace {

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& value : values) value = normal(engine);
  return values;
}

// Bitwise equality (EXPECT_EQ on floats would accept -0 == 0 and reject NaN == NaN).
bool bit_identical(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Three segments of 4, 6 and 5 elements (15 in all).
Layout three_segments() {
  Layout layout;
  layout.add("a", 4);
  layout.add("b", 6);
  layout.add("c", 5);
  return layout;
}

// ---------------------------------------------------------------------------------------------- Sgd

struct SgdCase {
  float momentum;
  float weight_decay;
};

void PrintTo(const SgdCase& c, std::ostream* out) {
  *out << "momentum " << c.momentum << ", weight decay " << c.weight_decay;
}

class SgdOptimizerPredict : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdOptimizerPredict, PredictMatchesStepBitForBitAndLeavesMomentumUnchanged) {
  const SgdOptions options{0.05f, GetParam().momentum, GetParam().weight_decay};
  constexpr std::size_t kCount = 12, kOffset = 3, kLength = 7;
  Sgd predicting(kCount, options), reference(kCount, options);
  std::vector<float> weights = random_values(kCount, 1), reference_weights = weights;
  // Two whole-buffer steps first so the velocity is not zero.
  for (std::uint32_t warmup = 0; warmup < 2; ++warmup) {
    const std::vector<float> gradients = random_values(kCount, 10 + warmup);
    predicting.step(weights, gradients, 0.5f);
    reference.step(reference_weights, gradients, 0.5f);
  }
  ASSERT_TRUE(bit_identical(weights, reference_weights));

  // predict on the sub-range [3, 10) equals step on it, bit for bit.
  const std::vector<float> gradients = random_values(kLength, 20);
  std::vector<float> predicted(kLength, -1.0f);
  const std::vector<float> before = weights;
  predicting.predict(std::span<const float>(weights).subspan(kOffset, kLength), gradients, 0.25f, kOffset,
                     predicted);
  EXPECT_TRUE(bit_identical(weights, before));  // parameters untouched
  reference.step(std::span<float>(reference_weights).subspan(kOffset, kLength), gradients, 0.25f, kOffset);
  EXPECT_TRUE(bit_identical(predicted, std::span<const float>(reference_weights).subspan(kOffset, kLength)));
  EXPECT_FALSE(bit_identical(predicted, std::span<const float>(before).subspan(kOffset, kLength)));

  // The prediction changed no velocity: the same step now gives the same result as on the reference.
  predicting.step(std::span<float>(weights).subspan(kOffset, kLength), gradients, 0.25f, kOffset);
  EXPECT_TRUE(bit_identical(weights, reference_weights));
  const std::vector<float> next_gradients = random_values(kCount, 30);
  predicting.step(weights, next_gradients, 1.0f);
  reference.step(reference_weights, next_gradients, 1.0f);
  EXPECT_TRUE(bit_identical(weights, reference_weights));
}

INSTANTIATE_TEST_SUITE_P(MomentumAndWeightDecay, SgdOptimizerPredict,
                         ::testing::Values(SgdCase{0.0f, 0.0f}, SgdCase{0.9f, 0.0f}, SgdCase{0.0f, 1e-2f},
                                           SgdCase{0.9f, 1e-2f}));

TEST(SgdOptimizer, PredictMayAliasParameters) {
  const SgdOptions options{0.1f, 0.9f, 1e-3f};
  Sgd predicting(8, options), reference(8, options);
  std::vector<float> weights = random_values(8, 2), reference_weights = weights;
  const std::vector<float> gradients = random_values(8, 3);
  predicting.step(weights, gradients, 1.0f);
  reference.step(reference_weights, gradients, 1.0f);
  predicting.predict(weights, gradients, 1.0f, 0, weights);  // in place
  reference.step(reference_weights, gradients, 1.0f);
  EXPECT_TRUE(bit_identical(weights, reference_weights));
}

TEST(SgdOptimizer, StepThroughTheInterfaceEqualsTheDirectStep) {
  // The first step with momentum is w - lr * (scale * g + wd * w), as worked by hand:
  //   w = {1, -2}, g = {4, 8}, scale 0.5, wd 0.5, lr 0.25: d = {2.5, 3}, w' = {0.375, -2.75}.
  const SgdOptions options{0.25f, 0.5f, 0.5f};
  Sgd direct(2, options);
  const std::unique_ptr<Optimizer> through_interface = make_optimizer({"sgd", options, {}}, [] {
    Layout layout;
    layout.add("only", 2);
    return layout;
  }());
  std::vector<float> a = {1.0f, -2.0f}, b = a;
  const std::vector<float> gradients = {4.0f, 8.0f};
  direct.step(a, gradients, 0.5f);
  through_interface->step(b, gradients, 0.5f, 0);
  EXPECT_EQ(a, (std::vector<float>{0.375f, -2.75f}));
  EXPECT_TRUE(bit_identical(a, b));
}

// --------------------------------------------------------------------------------------------- Adam

// Adam evaluated in double, independently of adam.cpp: the textbook form with bias-corrected moments,
//   w -= lr * m_hat / (sqrt(v_hat) + eps),  m_hat = m / (1 - beta1^s),  v_hat = v / (1 - beta2^s),
// which equals the LibTorch form mathematically.
struct DoubleAdam {
  AdamOptions options;
  std::vector<double> m, v;
  int steps = 0;

  void step(std::vector<double>& w, const std::vector<float>& g, double scale) {
    if (m.empty()) m.assign(w.size(), 0.0), v.assign(w.size(), 0.0);
    ++steps;
    const double beta1 = options.beta1, beta2 = options.beta2;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double d = scale * g[i] + static_cast<double>(options.weight_decay) * w[i];
      m[i] = beta1 * m[i] + (1 - beta1) * d;
      v[i] = beta2 * v[i] + (1 - beta2) * d * d;
      const double m_hat = m[i] / (1 - std::pow(beta1, steps));
      const double v_hat = v[i] / (1 - std::pow(beta2, steps));
      w[i] -= options.learning_rate * m_hat / (std::sqrt(v_hat) + options.epsilon);
    }
  }
};

void expect_close(std::span<const float> actual, const std::vector<double>& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_LE(std::abs(actual[i] - expected[i]), tolerance * std::max(1.0, std::abs(expected[i])))
        << "element " << i << ": " << actual[i] << " vs " << expected[i];
  }
}

TEST(AdamOptimizer, FirstStepMovesEachWeightByLearningRateAgainstTheGradientSign) {
  // On the first step m_hat = g and v_hat = g^2, so w' = w - lr * g / (|g| + eps) ~= w - lr * sign(g).
  AdamOptions options;
  options.learning_rate = 0.1f;
  const Layout layout = three_segments();
  Adam adam(layout, options);
  std::vector<float> weights = random_values(layout.total(), 4);
  const std::vector<float> gradients = random_values(layout.total(), 5);
  std::vector<double> expected(weights.begin(), weights.end());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const double g = gradients[i];
    expected[i] -= 0.1f * g / (std::abs(g) + static_cast<double>(1e-8f));
  }
  const std::vector<float> before = weights;
  adam.step(weights, gradients, 1.0f, 0);
  expect_close(weights, expected, 1e-6);
  for (std::size_t i = 0; i < weights.size(); ++i) {
    EXPECT_NEAR(weights[i] - before[i], gradients[i] > 0 ? -0.1 : 0.1, 1e-6) << "element " << i;
  }
}

TEST(AdamOptimizer, SeveralStepsWithWeightDecayAndScaleMatchTheFormulaInDouble) {
  AdamOptions options;
  options.learning_rate = 0.01f;
  options.beta1 = 0.8f;
  options.beta2 = 0.99f;
  options.epsilon = 1e-6f;
  options.weight_decay = 0.05f;
  const Layout layout = three_segments();
  Adam adam(layout, options);
  DoubleAdam reference{options, {}, {}, 0};
  std::vector<float> weights = random_values(layout.total(), 6);
  std::vector<double> expected(weights.begin(), weights.end());
  for (std::uint32_t step = 0; step < 5; ++step) {
    const std::vector<float> gradients = random_values(layout.total(), 100 + step, 0.1f);
    adam.step(weights, gradients, 0.5f, 0);
    reference.step(expected, gradients, 0.5f);
  }
  expect_close(weights, expected, 1e-6);
  for (std::size_t index = 0; index < layout.segment_count(); ++index) {
    EXPECT_EQ(adam.step_count(index), 5);
  }
}

TEST(AdamOptimizer, StepCountsArePerSegment) {
  // Segment 1 steps twice, then segment 0 once: segment 0 must get the first-step bias correction,
  // i.e. end bit-identical to a fresh optimizer stepping segment 0 once.
  const Layout layout = three_segments();
  AdamOptions options;
  options.learning_rate = 0.05f;
  Adam adam(layout, options), fresh(layout, options);
  std::vector<float> weights = random_values(layout.total(), 7), fresh_weights = weights;
  const std::vector<float> gradients = random_values(layout.total(), 8);
  const Segment& a = layout.segment(0);
  const Segment& b = layout.segment(1);
  auto range = [](std::vector<float>& buffer, const Segment& s) {
    return std::span<float>(buffer).subspan(s.offset, s.count);
  };
  auto gradient_range = [&](const Segment& s) {
    return std::span<const float>(gradients).subspan(s.offset, s.count);
  };
  adam.step(range(weights, b), gradient_range(b), 1.0f, b.offset);
  adam.step(range(weights, b), gradient_range(b), 1.0f, b.offset);
  adam.step(range(weights, a), gradient_range(a), 1.0f, a.offset);
  fresh.step(range(fresh_weights, a), gradient_range(a), 1.0f, a.offset);
  EXPECT_TRUE(bit_identical(range(weights, a), range(fresh_weights, a)));
  EXPECT_EQ(adam.step_count(0), 1);
  EXPECT_EQ(adam.step_count(1), 2);
  EXPECT_EQ(adam.step_count(2), 0);

  // A range of several segments counts each of them once.
  adam.step(std::span<float>(weights).subspan(a.offset, a.count + b.count),
            std::span<const float>(gradients).subspan(a.offset, a.count + b.count), 1.0f, a.offset);
  EXPECT_EQ(adam.step_count(0), 2);
  EXPECT_EQ(adam.step_count(1), 3);
  EXPECT_EQ(adam.step_count(2), 0);
}

TEST(AdamOptimizer, PredictMatchesStepBitForBitWithoutChangingState) {
  for (const float weight_decay : {0.0f, 0.01f}) {
    SCOPED_TRACE(weight_decay);
    AdamOptions options;
    options.learning_rate = 0.02f;
    options.weight_decay = weight_decay;
    const Layout layout = three_segments();
    Adam predicting(layout, options), reference(layout, options);
    std::vector<float> weights = random_values(layout.total(), 9), reference_weights = weights;
    for (std::uint32_t warmup = 0; warmup < 3; ++warmup) {
      const std::vector<float> gradients = random_values(layout.total(), 200 + warmup);
      predicting.step(weights, gradients, 2.0f, 0);
      reference.step(reference_weights, gradients, 2.0f, 0);
    }
    // Segments 1 and 2: elements [4, 15).
    const std::size_t offset = layout.segment(1).offset, length = layout.total() - offset;
    const std::vector<float> gradients = random_values(length, 300);
    std::vector<float> predicted(length);
    const std::vector<float> before = weights;
    predicting.predict(std::span<const float>(weights).subspan(offset), gradients, 2.0f, offset, predicted);
    EXPECT_TRUE(bit_identical(weights, before));
    EXPECT_EQ(predicting.step_count(1), 3);
    reference.step(std::span<float>(reference_weights).subspan(offset), gradients, 2.0f, offset);
    EXPECT_TRUE(bit_identical(predicted, std::span<const float>(reference_weights).subspan(offset)));

    // No state changed: stepping now reproduces the reference, and so does a further whole step.
    predicting.step(std::span<float>(weights).subspan(offset), gradients, 2.0f, offset);
    EXPECT_TRUE(bit_identical(weights, reference_weights));
    const std::vector<float> next_gradients = random_values(layout.total(), 400);
    predicting.step(weights, next_gradients, 1.0f, 0);
    reference.step(reference_weights, next_gradients, 1.0f, 0);
    EXPECT_TRUE(bit_identical(weights, reference_weights));
  }
}

TEST(AdamOptimizer, PredictMayAliasParameters) {
  const Layout layout = three_segments();
  Adam predicting(layout, AdamOptions{}), reference(layout, AdamOptions{});
  std::vector<float> weights = random_values(layout.total(), 11), reference_weights = weights;
  const std::vector<float> gradients = random_values(layout.total(), 12);
  predicting.step(weights, gradients, 1.0f, 0);
  reference.step(reference_weights, gradients, 1.0f, 0);
  predicting.predict(weights, gradients, 1.0f, 0, weights);  // in place
  reference.step(reference_weights, gradients, 1.0f, 0);
  EXPECT_TRUE(bit_identical(weights, reference_weights));
  EXPECT_EQ(predicting.step_count(0), 1);
}

TEST(AdamOptimizerDeathTest, RangeMustBeWholeSegments) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Layout layout = three_segments();
  Adam adam(layout, AdamOptions{});
  std::vector<float> weights(layout.total()), gradients(layout.total());
  // Starts inside segment 0.
  EXPECT_DEATH(adam.step(std::span<float>(weights).subspan(1, 3), std::span<const float>(gradients).subspan(1, 3),
                         1.0f, 1),
               "offset");
  // Starts on segment 0 but ends inside segment 1.
  EXPECT_DEATH(adam.step(std::span<float>(weights).subspan(0, 6), std::span<const float>(gradients).subspan(0, 6),
                         1.0f, 0),
               "segment");
}

void expect_usage_error(const AdamOptions& options, const std::string& message) {
  const Layout layout = three_segments();
  try {
    Adam adam(layout, options);
    ADD_FAILURE() << "no UsageError; expected \"" << message << "\"";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
  }
}

TEST(AdamOptimizer, RejectsInvalidOptionsNamingTheHyperParameter) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  auto with = [](auto change) {
    AdamOptions options;
    change(options);
    return options;
  };
  expect_usage_error(with([](AdamOptions& o) { o.learning_rate = 0; }), "Adam learning rate must be > 0, got 0");
  expect_usage_error(with([](AdamOptions& o) { o.learning_rate = -0.5f; }), "Adam learning rate must be > 0, got -0.5");
  expect_usage_error(with([&](AdamOptions& o) { o.learning_rate = nan; }), "Adam learning rate must be > 0");
  expect_usage_error(with([&](AdamOptions& o) { o.learning_rate = inf; }), "Adam learning rate must be > 0, got inf");
  expect_usage_error(with([](AdamOptions& o) { o.beta1 = 1; }), "Adam beta1 must be in [0, 1), got 1");
  expect_usage_error(with([](AdamOptions& o) { o.beta1 = -0.1f; }), "Adam beta1 must be in [0, 1), got -0.1");
  expect_usage_error(with([&](AdamOptions& o) { o.beta1 = nan; }), "Adam beta1 must be in [0, 1)");
  expect_usage_error(with([](AdamOptions& o) { o.beta2 = 1; }), "Adam beta2 must be in [0, 1), got 1");
  expect_usage_error(with([](AdamOptions& o) { o.beta2 = -1; }), "Adam beta2 must be in [0, 1), got -1");
  expect_usage_error(with([&](AdamOptions& o) { o.beta2 = nan; }), "Adam beta2 must be in [0, 1)");
  expect_usage_error(with([](AdamOptions& o) { o.epsilon = 0; }), "Adam epsilon must be > 0, got 0");
  expect_usage_error(with([&](AdamOptions& o) { o.epsilon = inf; }), "Adam epsilon must be > 0, got inf");
  expect_usage_error(with([&](AdamOptions& o) { o.epsilon = nan; }), "Adam epsilon must be > 0");
  expect_usage_error(with([](AdamOptions& o) { o.weight_decay = -1; }), "Adam weight decay must be >= 0, got -1");
  expect_usage_error(with([&](AdamOptions& o) { o.weight_decay = inf; }), "Adam weight decay must be >= 0, got inf");
  expect_usage_error(with([&](AdamOptions& o) { o.weight_decay = nan; }), "Adam weight decay must be >= 0");
  // The boundaries that are allowed.
  EXPECT_NO_THROW(Adam(three_segments(), with([](AdamOptions& o) { o.beta1 = 0, o.beta2 = 0; })));
}

TEST(AdamOptimizer, CheckNamesTheGivenOptions) {
  AdamOptionNames flags{"--lr", "--adam-beta1", "--adam-beta2", "--adam-eps", "--weight-decay"};
  AdamOptions options;
  options.beta2 = 1;
  try {
    check_adam_options(options, flags);
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& error) {
    EXPECT_STREQ(error.what(), "--adam-beta2 must be in [0, 1), got 1");
  }
  options = {};
  options.epsilon = 0;
  EXPECT_THROW(check_adam_options(options, flags), UsageError);
  EXPECT_NO_THROW(check_adam_options(AdamOptions{}, flags));
}

// ---------------------------------------------------------------------------------- make_optimizer

TEST(MakeOptimizer, NamesAndConstruction) {
  EXPECT_EQ(optimizer_names(), (std::vector<std::string>{"sgd", "adam"}));
  const Layout layout = three_segments();
  OptimizerOptions options;
  EXPECT_NE(dynamic_cast<Sgd*>(make_optimizer(options, layout).get()), nullptr);
  options.name = "adam";
  EXPECT_NE(dynamic_cast<Adam*>(make_optimizer(options, layout).get()), nullptr);
}

TEST(MakeOptimizer, UnknownNameIsAUsageError) {
  OptimizerOptions options;
  options.name = "rmsprop";
  try {
    make_optimizer(options, three_segments());
    ADD_FAILURE() << "no UsageError";
  } catch (const UsageError& error) {
    EXPECT_STREQ(error.what(), "unknown optimizer 'rmsprop' (expected sgd, adam)");
  }
}

TEST(MakeOptimizer, InvalidOptionsOfTheChosenOptimizerAreUsageErrors) {
  OptimizerOptions options;
  options.sgd.learning_rate = 0;
  EXPECT_THROW(make_optimizer(options, three_segments()), UsageError);
  options.name = "adam";  // only the chosen optimizer's options are checked
  EXPECT_NO_THROW(make_optimizer(options, three_segments()));
  options.adam.epsilon = -1;
  EXPECT_THROW(make_optimizer(options, three_segments()), UsageError);
}

}  // namespace
}  // namespace pipesgd
