#pragma once
// The hand-computed weights of a softmax run whose iterations follow phases of methods, each with
// its iteration dependency K (1: D-Sync and the layer-wise plans; K >= 2: Pipe-SGD), switched the
// way `--algo auto` switches (algo/auto/): at each boundary the phase before applies what it still
// holds, in iteration order (its finish()), so every gradient is applied exactly once and the
// optimizer's state (momentum) carries over.
//   phase [a, b) with K:  at t: if K >= 2 and t-K >= a: w <- SGD(w, g_{t-K})
//                                g_t = mean_r g_r(w_t)
//                                if K == 1: w <- SGD(w, g_t)
//                         at b:  w <- SGD(w, g_i) for the i in [max(a, b-K), b) not yet applied
// (with stale_elements, the stale rule holds for those first elements and K = 1 for the others).
// SGD as LibTorch: v = m v + (g + wd w); w -= lr v. Computed in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "pipesgd/models/softmax_regression.h"
#include "pipesgd/optim/sgd.h"
#include "softmax_batches.h"

namespace pipesgd {

// The small problem the oracle tests train (training_method_test, auto_method_test,
// mpi_auto_switch_test): softmax regression of 6 features to 3 classes, 4 examples per worker and
// iteration, initial weights drawn with seed 7.
inline constexpr std::size_t kFeatures = 6;
inline constexpr std::size_t kClasses = 3;
inline constexpr std::size_t kBatch = 4;
inline constexpr std::uint64_t kSeed = 7;

// Weights computed in float against the oracle's doubles: within 2e-5 relative (the tests of the
// training methods, tests/core/training_method_test.cpp and auto_method_test.cpp).
inline void expect_close(const std::vector<float>& actual, const std::vector<double>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], 2e-5 * (1 + std::fabs(expected[i]))) << what << " element " << i;
  }
}

// K applies to the elements [0, stale_elements) (all of them by default: Pipe-SGD); the others are
// synchronous (K = 1) as SAPipe's layers after its first k (stale_elements: their elements).
struct OraclePhase {
  std::int64_t start = 0;
  int k = 1;
  std::size_t stale_elements = SIZE_MAX;
};

struct OracleRun {
  std::vector<std::vector<double>> weights_used;  // [t]: the weights gradient t was computed on
  std::vector<double> final_weights;
};

inline OracleRun phased_sgd(const SgdOptions& sgd, const std::vector<OraclePhase>& phases, int ranks,
                            std::int64_t iterations, const SoftmaxBatches& data, std::size_t features,
                            std::size_t classes, std::uint64_t seed) {
  SoftmaxRegression initial(features, classes, seed);
  std::vector<double> w(initial.parameters().begin(), initial.parameters().end());
  std::vector<double> v(w.size(), 0.0);
  std::vector<std::vector<double>> gradient_of(static_cast<std::size_t>(iterations));
  // Applies gradient i to the elements [begin, end).
  auto apply = [&](std::int64_t i, std::size_t begin, std::size_t end) {
    const std::vector<double>& g = gradient_of[static_cast<std::size_t>(i)];
    for (std::size_t e = begin; e < std::min(end, w.size()); ++e) {
      v[e] = sgd.momentum * v[e] + (g[e] + sgd.weight_decay * w[e]);
      w[e] -= sgd.learning_rate * v[e];
    }
  };
  OracleRun run;
  for (std::size_t p = 0; p < phases.size(); ++p) {
    const std::int64_t a = phases[p].start;
    const std::int64_t b = p + 1 < phases.size() ? phases[p + 1].start : iterations;
    const int k = phases[p].k;
    const std::size_t stale = k >= 2 ? std::min(phases[p].stale_elements, w.size()) : 0;
    for (std::int64_t t = a; t < b; ++t) {
      if (k >= 2 && t - k >= a) apply(t - k, 0, stale);
      run.weights_used.push_back(w);
      const std::vector<float> w_float(w.begin(), w.end());
      std::vector<double> mean(w.size(), 0.0);
      for (int r = 0; r < ranks; ++r) {
        const std::vector<float> g = SoftmaxRegression::gradient_for(w_float, data.at(r, t, ranks), features, classes);
        for (std::size_t e = 0; e < g.size(); ++e) mean[e] += g[e] / ranks;
      }
      gradient_of[static_cast<std::size_t>(t)] = std::move(mean);
      apply(t, stale, w.size());  // the synchronous elements
    }
    if (k >= 2) {
      for (std::int64_t i = std::max(a, b - k); i < b; ++i) apply(i, 0, stale);  // finish() at the boundary
    }
  }
  run.final_weights = w;
  return run;
}

}  // namespace pipesgd
