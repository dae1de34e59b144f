// nocomm (algo/nocomm/): compute alone. Built through the registry as the CLI builds it, every worker
// steps its parameters with its own gradient (never the mean over workers) by the optimizer, and
// nothing is sent. Checked against SGD computed by hand (in double) on the pure-C++ softmax model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/algo/nocomm/nocomm_method.h"
#include "pipesgd/algo/registry.h"
#include "pipesgd/algo/training_method.h"
#include "pipesgd/core/random.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/models/softmax_regression.h"
#include "softmax_batches.h"
#include "test_world.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

constexpr std::size_t kFeatures = 5;
constexpr std::size_t kClasses = 3;
constexpr std::size_t kBatch = 4;
constexpr std::uint64_t kSeed = 13;

using Batches = SoftmaxBatches;
Batches make_batches(int ranks, std::int64_t iterations) {
  return make_softmax_batches(5, ranks, iterations, kFeatures, kClasses, kBatch);
}

struct NocommCase {
  int ranks;
  std::int64_t iterations;
  SgdOptions sgd;
};
void PrintTo(const NocommCase& c, std::ostream* out) {
  *out << c.ranks << " workers, " << c.iterations << " iterations, lr " << c.sgd.learning_rate << ", momentum "
       << c.sgd.momentum << ", weight decay " << c.sgd.weight_decay;
}

// SGD on rank `rank`'s own gradients, in double: v = m v + (g + wd w); w -= lr v.
std::vector<double> hand_computed(const NocommCase& c, int rank, const Batches& data) {
  SoftmaxRegression initial(kFeatures, kClasses, kSeed);
  std::vector<double> w(initial.parameters().begin(), initial.parameters().end());
  std::vector<double> v(w.size(), 0.0);
  for (std::int64_t t = 0; t < c.iterations; ++t) {
    const std::vector<float> w_float(w.begin(), w.end());
    const std::vector<float> g = SoftmaxRegression::gradient_for(w_float, data.at(rank, t, c.ranks), kFeatures, kClasses);
    for (std::size_t i = 0; i < w.size(); ++i) {
      v[i] = c.sgd.momentum * v[i] + (g[i] + c.sgd.weight_decay * w[i]);
      w[i] -= c.sgd.learning_rate * v[i];
    }
  }
  return w;
}

class NocommMethod : public ::testing::TestWithParam<NocommCase> {};

TEST_P(NocommMethod, EveryWorkerStepsOnItsOwnGradientAndSendsNothing) {
  const NocommCase c = GetParam();
  const Batches data = make_batches(c.ranks, c.iterations);
  const MethodSelection selection = select_for_test("nocomm", {}, c.sgd);
  ASSERT_EQ(selection.spec, "nocomm");
  std::vector<std::vector<float>> final_weights(static_cast<std::size_t>(c.ranks));
  std::vector<std::uint64_t> sent(static_cast<std::size_t>(c.ranks), 1);
  run_ranks(c.ranks, [&](int rank, Transport& transport) {
    SoftmaxRegression model(kFeatures, kClasses, kSeed);
    std::unique_ptr<TrainingMethod> method = make_method(selection, transport, model, 0);
    for (std::int64_t t = 0; t < c.iterations; ++t) {
      IterationTimes times;
      std::span<float> gradients = method->begin_iteration(t, times);
      ASSERT_EQ(gradients.size(), model.parameters().size());
      model.forward_backward(data.at(rank, t, c.ranks), gradients, {});
      method->end_iteration(t, times);
    }
    IterationTimes times;
    method->finish(times);
    final_weights[static_cast<std::size_t>(rank)].assign(model.parameters().begin(), model.parameters().end());
    sent[static_cast<std::size_t>(rank)] = transport.bytes_sent();
  });
  for (int rank = 0; rank < c.ranks; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    EXPECT_EQ(sent[static_cast<std::size_t>(rank)], 0u) << "nocomm sent bytes";
    const std::vector<double> expected = hand_computed(c, rank, data);
    const std::vector<float>& actual = final_weights[static_cast<std::size_t>(rank)];
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t i = 0; i < actual.size(); ++i) {
      ASSERT_NEAR(actual[i], expected[i], 2e-5 * (1 + std::fabs(expected[i]))) << "element " << i;
    }
  }
  // Own gradients: the replicas drift apart (each saw other batches).
  for (int rank = 1; rank < c.ranks; ++rank) {
    EXPECT_NE(final_weights[static_cast<std::size_t>(rank)], final_weights[0]) << "rank " << rank << " equals rank 0";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, NocommMethod,
                         ::testing::Values(NocommCase{2, 1, SgdOptions{0.5f, 0.0f, 0.0f}},
                                           NocommCase{2, 4, SgdOptions{0.5f, 0.9f, 0.01f}},
                                           NocommCase{3, 3, SgdOptions{0.1f, 0.0f, 0.0f}}),
                         [](const ::testing::TestParamInfo<NocommCase>& info) {
                           return "p" + std::to_string(info.param.ranks) + "_T" + std::to_string(info.param.iterations) +
                                  (info.param.sgd.momentum > 0 ? "_momentum" : "");
                         });

// The one-iteration case in closed form on the first parameter: w1 = w0 - lr * g_own(w0), and not
// w0 - lr * mean_r g_r(w0) (what data-parallel training would give).
TEST(NocommMethod, OneIterationIsWZeroMinusLearningRateTimesTheOwnGradient) {
  const Batches data = make_batches(2, 1);
  const SgdOptions sgd{0.25f, 0.0f, 0.0f};
  SoftmaxRegression initial(kFeatures, kClasses, kSeed);
  const std::vector<float> w0(initial.parameters().begin(), initial.parameters().end());
  std::vector<std::vector<float>> own(2), after(2);
  for (int rank = 0; rank < 2; ++rank) own[rank] = SoftmaxRegression::gradient_for(w0, data.at(rank, 0, 2), kFeatures, kClasses);
  run_ranks(2, [&](int rank, Transport& transport) {
    SoftmaxRegression model(kFeatures, kClasses, kSeed);
    auto method = make_method(select_for_test("nocomm", {}, sgd), transport, model, 0);
    IterationTimes times;
    model.forward_backward(data.at(rank, 0, 2), method->begin_iteration(0, times), {});
    method->end_iteration(0, times);
    after[rank].assign(model.parameters().begin(), model.parameters().end());
  });
  std::size_t differing = 0;  // elements whose own and mean gradient differ
  for (int rank = 0; rank < 2; ++rank) {
    for (std::size_t i = 0; i < w0.size(); ++i) {
      const double expected = static_cast<double>(w0[i]) - sgd.learning_rate * static_cast<double>(own[rank][i]);
      EXPECT_NEAR(after[rank][i], expected, 1e-6 * (1 + std::fabs(expected))) << "rank " << rank << " element " << i;
      const double mean = (static_cast<double>(own[0][i]) + own[1][i]) / 2;
      if (std::fabs(mean - own[rank][i]) * sgd.learning_rate > 1e-4 * (1 + std::fabs(expected))) ++differing;
    }
  }
  EXPECT_GT(differing, 0u) << "the batches give the same gradients: the test cannot tell own from mean";
}

}  // namespace
}  // namespace pipesgd
