// SAPipe's compensation of the stale range (algo/sapipe/stale_compensation.h) against the SAPipe paper's
// formulas worked by hand: Alg. 2 (dc) and Alg. 3 option 3 (wp3) with the DC term of Eq. 1 as
// printed (the default) and with --dc-bound on (|lambda g^T D| clamped to 1 - 1/sqrt(2)), on cases
// where |lambda g^T D| exceeds 1 - 1/sqrt(2), so the two differ; the clamp count and its checkpoint.
#include "pipesgd/algo/sapipe/stale_compensation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <span>
#include <vector>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/layout.h"
#include "pipesgd/optim/optimizer.h"

namespace pipesgd {
namespace {

// Plain SGD with learning rate eta = 0.5 on one segment of 3 elements: optimizer(x, g) = x - 0.5 g.
std::unique_ptr<Optimizer> sgd() {
  Layout layout;
  layout.add("stale", 3);
  return make_optimizer({"sgd", SgdOptions{0.5f, 0.0f, 0.0f}, {}}, layout);
}

constexpr float kLambda = 0.125f;
constexpr int kWorkers = 2;  // the gradients handed over are sums G; the mean is G / 2
const float kClampedFactor = static_cast<float>(1.0 - kDelayCompensationBound);  // 1 / sqrt(2)

void expect_near(const std::vector<float>& got, const std::vector<float>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-6) << "element " << i;
}

// Alg. 2: x_t = x_{t-1} - eta * DC(g_t, D), DC(g, D) = g + lambda g (g^T D) (Eq. 1), D the last step.
//   x_0 = {1, 1, 1}; g_1 = {1, -2, 2} with D = 0: x_1 = {0.5, 2, 0}, D = {-0.5, 1, -1}.
//   g_2 = {2, -2, 1}: g^T D = -1 - 2 - 1 = -4, lambda g^T D = -0.5 (|.| > 1 - 1/sqrt(2) = 0.293):
//     as printed:  DC = 0.5 g = {1, -1, 0.5},  x_2 = x_1 - 0.5 DC = {0, 2.5, -0.25};
//     clamped:     DC = (1 - 0.293) g = g / sqrt(2),  x_2 = x_1 - 0.5 g / sqrt(2).
std::vector<float> dc_after_two_steps(bool bound, std::int64_t& clamped) {
  const std::unique_ptr<Optimizer> optimizer = sgd();
  StaleCompensation compensation(Compensation::kDelay, kLambda, bound, 1.0f / kWorkers, 3);
  std::vector<float> weights = {1.0f, 1.0f, 1.0f};
  compensation.use_stale_range(weights, 3);
  const std::vector<float> sum1 = {2.0f, -4.0f, 4.0f}, sum2 = {4.0f, -4.0f, 2.0f};  // n * g_1, n * g_2
  compensation.step_stale(*optimizer, weights, sum1.data(), 3, /*stale=*/true);
  EXPECT_EQ(weights, (std::vector<float>{0.5f, 2.0f, 0.0f}));
  compensation.step_stale(*optimizer, weights, sum2.data(), 3, /*stale=*/true);
  clamped = compensation.bounded_compensations();
  return weights;
}

TEST(StaleCompensation, DelayCompensationIsAlgorithm2AsPrintedByDefault) {
  std::int64_t clamped = -1;
  EXPECT_EQ(dc_after_two_steps(/*bound=*/false, clamped), (std::vector<float>{0.0f, 2.5f, -0.25f}));  // dyadic: exact
  EXPECT_EQ(clamped, 0);
}

TEST(StaleCompensation, DelayCompensationWithTheBoundClampsAndCounts) {
  std::int64_t clamped = -1;
  const std::vector<float> g2 = {2.0f, -2.0f, 1.0f};
  std::vector<float> expected = {0.5f, 2.0f, 0.0f};
  for (std::size_t i = 0; i < 3; ++i) expected[i] -= 0.5f * g2[i] * kClampedFactor;
  expect_near(dc_after_two_steps(/*bound=*/true, clamped), expected);
  EXPECT_EQ(clamped, 1);  // the second step only: the first had D = 0
}

// Alg. 3 option 3 at t = 2 on worker i (n = 2):
//   g~ = DC(g_{t-1} - g_{i,t-1} / n, D) + g_{i,t} / n;  x~ = optimizer(x_{t-1}, g~) = x_{t-1} - eta g~,
// with g_{t-1} = G(0) / n the latest synchronized gradient, g_{i,t-1} = L(0) this worker's part of
// it, g_{i,t} = L(1) its newest local gradient, and D = x_{t-1} - x_{t-2} the step taken with G(0)/n.
//   x_0 = {1, 1, 1}, G(0) = {4, -4, 2}: x_1 = x_0 - 0.5 {2, -2, 1} = {0, 2, 0.5}, D = {-1, 1, -0.5}.
//   L(0) = {2, 0, 0}: h = {2, -2, 1} - {1, 0, 0} = {1, -2, 1}; h^T D = -1 - 2 - 0.5 = -3.5,
//   lambda h^T D = -0.4375 (|.| > 0.293).  L(1) = {2, 2, -2}: L(1) / n = {1, 1, -1}.
//     as printed:  DC(h) = 0.5625 h = {0.5625, -1.125, 0.5625},  g~ = {1.5625, -0.125, -0.4375},
//                  x~ = x_1 - 0.5 g~ = {-0.78125, 2.0625, 0.71875};
//     clamped:     DC(h) = h / sqrt(2),  x~ = x_1 - 0.5 (h / sqrt(2) + L(1) / n).
// The model holds x~; the true weights stay x_1.
std::vector<float> wp3_prediction(bool bound, std::int64_t& clamped) {
  const std::unique_ptr<Optimizer> optimizer = sgd();
  StaleCompensation compensation(Compensation::kPredictCombined, kLambda, bound, 1.0f / kWorkers, 3);
  std::vector<float> model = {1.0f, 1.0f, 1.0f};
  compensation.use_stale_range(model, 3);
  const std::vector<float> local0 = {2.0f, 0.0f, 0.0f}, local1 = {2.0f, 2.0f, -2.0f}, sum0 = {4.0f, -4.0f, 2.0f};
  compensation.record_local_gradient(local0, 0, 3, 0);
  compensation.record_local_gradient(local1, 0, 3, 1);
  compensation.step_stale(*optimizer, model, sum0.data(), 3, /*stale=*/true);
  const std::span<const float> truth = compensation.true_weights();
  EXPECT_EQ(std::vector<float>(truth.begin(), truth.end()), (std::vector<float>{0.0f, 2.0f, 0.5f}));
  compensation.predict(*optimizer, model, 3, 2, sum0.data());
  EXPECT_EQ(std::vector<float>(truth.begin(), truth.end()), (std::vector<float>{0.0f, 2.0f, 0.5f}));
  clamped = compensation.bounded_compensations();
  return model;
}

TEST(StaleCompensation, WeightPredictionOption3IsAlgorithm3AsPrintedByDefault) {
  std::int64_t clamped = -1;
  EXPECT_EQ(wp3_prediction(/*bound=*/false, clamped), (std::vector<float>{-0.78125f, 2.0625f, 0.71875f}));
  EXPECT_EQ(clamped, 0);
}

TEST(StaleCompensation, WeightPredictionOption3WithTheBoundClampsAndCounts) {
  std::int64_t clamped = -1;
  const std::vector<float> h = {1.0f, -2.0f, 1.0f}, local1_mean = {1.0f, 1.0f, -1.0f};
  std::vector<float> expected = {0.0f, 2.0f, 0.5f};
  for (std::size_t i = 0; i < 3; ++i) expected[i] -= 0.5f * (h[i] * kClampedFactor + local1_mean[i]);
  expect_near(wp3_prediction(/*bound=*/true, clamped), expected);
  EXPECT_EQ(clamped, 1);
}

// The clamp count survives a checkpoint; a count with the bound off is refused as a DataError.
TEST(StaleCompensation, ClampCountIsCheckpointed) {
  const std::unique_ptr<Optimizer> optimizer = sgd();
  StaleCompensation bounded(Compensation::kDelay, kLambda, /*bound=*/true, 1.0f / kWorkers, 3);
  std::vector<float> weights = {1.0f, 1.0f, 1.0f};
  const std::vector<float> sum1 = {2.0f, -4.0f, 4.0f}, sum2 = {4.0f, -4.0f, 2.0f};
  bounded.step_stale(*optimizer, weights, sum1.data(), 3, true);
  bounded.step_stale(*optimizer, weights, sum2.data(), 3, true);
  ASSERT_EQ(bounded.bounded_compensations(), 1);
  CheckpointWriter out;
  bounded.save(out, "c.");
  const std::vector<std::byte> bytes = out.serialize();
  const CheckpointReader in = CheckpointReader::parse(bytes, "test");

  StaleCompensation restored(Compensation::kDelay, kLambda, /*bound=*/true, 1.0f / kWorkers, 3);
  restored.load(in, "c.");
  EXPECT_EQ(restored.bounded_compensations(), 1);
  // The restored last step D = -0.5 g_2 / sqrt(2) compensates the next update as the original's does:
  // g_3 = g_2 gives lambda g^T D = -0.125 * 4.5 / sqrt(2) = -0.398, clamped again.
  std::vector<float> original_weights = weights, restored_weights = weights;
  bounded.step_stale(*optimizer, original_weights, sum2.data(), 3, true);
  restored.step_stale(*sgd(), restored_weights, sum2.data(), 3, true);
  EXPECT_EQ(restored_weights, original_weights);
  EXPECT_EQ(bounded.bounded_compensations(), 2);
  EXPECT_EQ(restored.bounded_compensations(), 2);
  StaleCompensation unbounded(Compensation::kDelay, kLambda, /*bound=*/false, 1.0f / kWorkers, 3);
  EXPECT_THROW(unbounded.load(in, "c."), DataError);
}

}  // namespace
}  // namespace pipesgd
