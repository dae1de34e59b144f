// Tests of the allreduce cost model (MG-WFBP Table II, Pipe-SGD Eq. 5), its generalisation to any
// world size, the fits to timings, the calibration file and the choice of an algorithm.
#include "temp_dir.h"
#include "pipesgd/timing/allreduce_cost_model.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/core/random.h"
#include "pipesgd/timing/pipe_timing_model.h"

namespace pipesgd {
namespace {

using nlohmann::json;

// Round numbers, so that every expected a and b below is exact arithmetic by hand.
const LinkParameters kRoundLink{1, 10, 100};

struct ExpectedCost {
  const char* algorithm;
  int world_size;
  double a;
  double b;
};

void expect_costs(const std::vector<ExpectedCost>& table) {
  for (const ExpectedCost& row : table) {
    const LinearCost cost = allreduce_cost(row.algorithm, row.world_size, kRoundLink);
    EXPECT_NEAR(cost.a, row.a, 1e-12 * row.a) << row.algorithm << ", p = " << row.world_size;
    EXPECT_NEAR(cost.b, row.b, 1e-12 * row.b) << row.algorithm << ", p = " << row.world_size;
  }
}

TEST(AllreduceCostModel, MatchesTableTwoForPowersOfTwo) {
  // α = 1, β = 10, γ = 100. Table II, N = p:
  //   tree     a = 2α log2 p   b = (2β + γ) log2 p = 120 log2 p
  //   rd       a = α log2 p    b = (β + γ) log2 p = 110 log2 p
  //   hd       a = 2α log2 p   b = 2β - (2β + γ)/p + γ = 120 - 120/p
  //   ring     a = 2(p-1)α     b = 2(p-1)/p β + (p-1)/p γ = 120 (p-1)/p
  expect_costs({
      {"tree", 2, 2, 120},
      {"tree", 4, 4, 240},
      {"tree", 8, 6, 360},
      {"recursive-doubling", 2, 1, 110},
      {"recursive-doubling", 4, 2, 220},
      {"recursive-doubling", 8, 3, 330},
      {"halving-doubling", 2, 2, 60},
      {"halving-doubling", 4, 4, 90},
      {"halving-doubling", 8, 6, 105},
      {"ring", 2, 2, 60},
      {"ring", 4, 6, 90},
      {"ring", 8, 14, 105},
  });
}

TEST(AllreduceCostModel, NonPowersOfTwoByHand) {
  // p = 3: q = 2, r = 1; p = 5: q = 4, r = 1. Fold: pre-step α + β + γ, post-step α + β, i.e.
  // a += 2, b += 2·10 + 100 = 120. Tree: heap depth floor(log2 3) = 1 and floor(log2 5) = 2
  // levels each way.
  expect_costs({
      {"recursive-doubling", 3, 1 + 2, 110 + 120},
      {"recursive-doubling", 5, 2 + 2, 220 + 120},
      {"halving-doubling", 3, 2 + 2, 60 + 120},
      {"halving-doubling", 5, 4 + 2, 90 + 120},
      {"tree", 3, 2, 120},
      {"tree", 5, 4, 240},
      {"tree", 7, 4, 240},
      {"ring", 3, 4, 80},  // 2·2/3·10 + 2/3·100
      {"ring", 5, 8, 96},  // 2·4/5·10 + 4/5·100
  });
  // Between powers of two the fold costs a fixed extra; at the next power of two it disappears.
  const LinearCost six = allreduce_cost("recursive-doubling", 6, kRoundLink);
  const LinearCost seven = allreduce_cost("recursive-doubling", 7, kRoundLink);
  EXPECT_DOUBLE_EQ(six.a, seven.a);
  EXPECT_DOUBLE_EQ(six.b, seven.b);
  EXPECT_LT(allreduce_cost("recursive-doubling", 8, kRoundLink).a, seven.a);
}

TEST(AllreduceCostModel, RingIsPipeSgdEquationFive) {
  const RingCostParameters ring{3e-6, 7e-10, 2e-10, 0};
  const LinkParameters link{ring.alpha, ring.beta, ring.gamma};
  for (int p = 1; p <= 17; ++p) {
    for (double bytes : {0.0, 1.0, 4096.0, 2.59e6, 64.0 * 1024 * 1024}) {
      const double expected = ring_allreduce_time(p, bytes, ring);
      EXPECT_NEAR(allreduce_cost("ring", p, link).time(bytes), expected, 1e-13 * expected)
          << "p = " << p << ", bytes = " << bytes;
    }
  }
}

TEST(AllreduceCostModel, OneRankCostsNothing) {
  for (const std::string& algorithm : cost_model_algorithm_names()) {
    const LinearCost cost = allreduce_cost(algorithm, 1, kRoundLink);
    EXPECT_EQ(cost.a, 0.0) << algorithm;
    EXPECT_EQ(cost.b, 0.0) << algorithm;
    EXPECT_EQ(cost.time(1e9), 0.0) << algorithm;
  }
}

TEST(AllreduceCostModel, CostIsTheCoefficientsTimesTheLink) {
  const LinkParameters link{2e-6, 3e-10, 5e-11};
  for (const std::string& algorithm : cost_model_algorithm_names()) {
    for (int p = 1; p <= 12; ++p) {
      const AllreduceCoefficients c = allreduce_coefficients(algorithm, p);
      const LinearCost cost = allreduce_cost(algorithm, p, link);
      EXPECT_DOUBLE_EQ(cost.a, c.messages * link.alpha) << algorithm << ", p = " << p;
      EXPECT_DOUBLE_EQ(cost.b, c.transferred * link.beta + c.reduced * link.gamma)
          << algorithm << ", p = " << p;
    }
  }
}

TEST(AllreduceCostModel, NamesTheFourAlgorithms) {
  EXPECT_EQ(cost_model_algorithm_names(),
            (std::vector<std::string>{"ring", "recursive-doubling", "halving-doubling", "tree", "direct"}));
  EXPECT_TRUE(is_cost_model_algorithm("tree"));
  EXPECT_FALSE(is_cost_model_algorithm("Tree"));
}

TEST(AllreduceCostModel, UnknownAlgorithmOrWorldSizeIsAUsageError) {
  try {
    allreduce_cost("butterfly", 4, kRoundLink);
    FAIL() << "an unknown algorithm was accepted";
  } catch (const UsageError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'butterfly'"), std::string::npos) << message;
    for (const std::string& name : cost_model_algorithm_names()) {
      EXPECT_NE(message.find(name), std::string::npos) << message;
    }
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_THROW(allreduce_cost("ring", 0, kRoundLink), UsageError);
  EXPECT_THROW(allreduce_coefficients("tree", -3), UsageError);
}

TEST(AllreduceCostModel, DefaultLinkIsPlausibleForSharedMemory) {
  const LinkParameters link = default_link_parameters();
  EXPECT_GT(link.alpha, 1e-7);
  EXPECT_LT(link.alpha, 1e-3);
  EXPECT_GT(link.beta, 0.0);
  EXPECT_LT(link.beta, 1e-8);  // faster than 100 MB/s
  EXPECT_GT(link.gamma, 0.0);
  EXPECT_LT(link.gamma, link.beta) << "summing a byte is cheaper than moving it between ranks";
}

// ---------------------------------------------------------------------------------------------
// Fits.

// α = 20 us, β = 0.4 ns/B, γ = 0.25 ns/B: the defaults; the fit does not know them.
const LinkParameters kTrueLink{20e-6, 0.4e-9, 0.25e-9};
constexpr double kCliffBytes = 8.0 * 1024 * 1024;

// Every algorithm on p = 2, 3, 4, 5, 8 ranks, sizes 4 KiB, 16 KiB, ..., 64 MiB as in `pipesgd bench
// allreduce` (160 samples): the model's time times a uniform factor in [1 - noise, 1 + noise], and
// times `cliff` for sizes of 8 MiB and more (messages that no longer fit the caches).
std::vector<TimingSample> synthetic_timings(double noise, double cliff) {
  Random random(20240611);
  std::vector<TimingSample> samples;
  for (const std::string& algorithm : cost_model_algorithm_names()) {
    for (int p : {2, 3, 4, 5, 8}) {
      for (double bytes = 4096; bytes <= 64.0 * 1024 * 1024; bytes *= 4) {
        const double model = allreduce_cost(algorithm, p, kTrueLink).time(bytes);
        const double factor = 1 + noise * (2 * random.uniform() - 1);
        samples.push_back(
            {algorithm, p, bytes, model * factor * (bytes >= kCliffBytes ? cliff : 1)});
      }
    }
  }
  return samples;
}

// The largest |fitted / true - 1| over α, β, γ.
double worst_parameter_error(const LinkParameters& fitted) {
  return std::max({std::abs(fitted.alpha / kTrueLink.alpha - 1),
                   std::abs(fitted.beta / kTrueLink.beta - 1),
                   std::abs(fitted.gamma / kTrueLink.gamma - 1)});
}

std::string describe(const LinkParameters& link) {
  return concat("alpha ", link.alpha, ", beta ", link.beta, ", gamma ", link.gamma);
}

TEST(CostFit, RecoversTheLinkFromExactTimings) {
  const LinkFit fit = fit_link_parameters(synthetic_timings(0, 1));
  EXPECT_LT(worst_parameter_error(fit.link), 1e-9) << describe(fit.link);
  EXPECT_TRUE(fit.unique);
  EXPECT_TRUE(fit.ambiguity.empty());
  EXPECT_LT(fit.rms_relative_residual, 1e-9);
}

TEST(CostFit, RecoversTheLinkWithinTwoPercentFromNoisyTimings) {
  const std::vector<TimingSample> samples = synthetic_timings(0.03, 1);
  const LinkFit fit = fit_link_parameters(samples);
  const double error = worst_parameter_error(fit.link);
  EXPECT_LT(error, 0.02) << describe(fit.link);
  // Uniform ±3% noise has an RMS of 3%/sqrt(3) = 1.7%.
  EXPECT_GT(fit.rms_relative_residual, 0.010);
  EXPECT_LT(fit.rms_relative_residual, 0.025);
  RecordProperty("worst_parameter_error", std::to_string(error));
  std::cout << "noisy timings: " << describe(fit.link) << ", worst parameter error " << error
            << ", rms relative residual " << fit.rms_relative_residual << "\n";
}

TEST(CostFit, RelativeWeightingResistsACacheCliffThatSpoilsPlainLeastSquares) {
  const std::vector<TimingSample> samples = synthetic_timings(0.03, 1.3);
  const LinkFit relative = fit_link_parameters(samples, ResidualWeighting::relative);
  const LinkFit absolute = fit_link_parameters(samples, ResidualWeighting::absolute);
  const double relative_error = worst_parameter_error(relative.link);
  const double absolute_error = worst_parameter_error(absolute.link);
  std::cout << "cache cliff, relative weighting: " << describe(relative.link) << ", worst error "
            << relative_error << ", rms relative residual " << relative.rms_relative_residual
            << "\ncache cliff, absolute weighting: " << describe(absolute.link) << ", worst error "
            << absolute_error << ", rms relative residual " << absolute.rms_relative_residual
            << "\n";
  // 16 MiB and 64 MiB are a quarter of the samples but half of those whose time is mostly
  // bandwidth, so no fit of a straight line can ignore them: the relative fit's slopes absorb about
  // a third of the 30% (β +12% even without noise, γ +2%), while α stays within a few percent. The
  // plain fit follows the largest times, loses α entirely (0) and inflates β and γ by 30%.
  EXPECT_LT(std::abs(relative.link.alpha / kTrueLink.alpha - 1), 0.05) << describe(relative.link);
  EXPECT_LT(relative_error, 0.15) << describe(relative.link);
  EXPECT_GT(absolute_error, 2 * relative_error) << describe(absolute.link);
  EXPECT_GT(std::abs(absolute.link.alpha / kTrueLink.alpha - 1), 0.5) << describe(absolute.link);
  EXPECT_LT(relative.rms_relative_residual, absolute.rms_relative_residual);
}

TEST(CostFit, ReportsEverySamplesPredictionAndResidual) {
  const std::vector<TimingSample> samples = synthetic_timings(0.03, 1);
  const LinkFit fit = fit_link_parameters(samples);
  ASSERT_EQ(fit.predicted_seconds.size(), samples.size());
  ASSERT_EQ(fit.relative_residuals.size(), samples.size());
  double sum_of_squares = 0;
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const TimingSample& sample = samples[i];
    const double predicted =
        allreduce_cost(sample.algorithm, sample.world_size, fit.link).time(sample.bytes);
    EXPECT_DOUBLE_EQ(fit.predicted_seconds[i], predicted) << i;
    EXPECT_DOUBLE_EQ(fit.relative_residuals[i], (predicted - sample.seconds) / sample.seconds) << i;
    sum_of_squares += fit.relative_residuals[i] * fit.relative_residuals[i];
  }
  EXPECT_DOUBLE_EQ(fit.rms_relative_residual, std::sqrt(sum_of_squares / samples.size()));
}

// Sum of squared relative residuals of `link` on `samples`.
double relative_objective(const std::vector<TimingSample>& samples, const LinkParameters& link) {
  double sum = 0;
  for (const TimingSample& sample : samples) {
    const double predicted =
        allreduce_cost(sample.algorithm, sample.world_size, link).time(sample.bytes);
    sum += std::pow((predicted - sample.seconds) / sample.seconds, 2);
  }
  return sum;
}

TEST(CostFit, KeepsEveryParameterNonNegativeAndOptimal) {
  // No latency at all, and small messages a little faster than linear: the unconstrained optimum
  // has a negative α. The constrained one has α = 0 and no feasible step improves on it.
  std::vector<TimingSample> samples;
  for (const std::string algorithm : {"ring", "recursive-doubling"}) {
    for (double bytes = 1024; bytes <= 1024 * 1024; bytes *= 4) {
      const double model = allreduce_cost(algorithm, 4, {0, 1e-9, 0.5e-9}).time(bytes);
      samples.push_back({algorithm, 4, bytes, model * (bytes < 10000 ? 0.8 : 1.0)});
    }
  }
  const LinkFit fit = fit_link_parameters(samples);
  EXPECT_EQ(fit.link.alpha, 0.0);
  EXPECT_GT(fit.link.beta, 0.0);
  EXPECT_GT(fit.link.gamma, 0.0);
  const double best = relative_objective(samples, fit.link);
  LinkParameters moved = fit.link;
  moved.alpha = 1e-9;  // the only feasible direction for α
  EXPECT_GT(relative_objective(samples, moved), best);
  for (double factor : {0.999, 1.001}) {
    moved = fit.link;
    moved.beta *= factor;
    EXPECT_GT(relative_objective(samples, moved), best) << factor;
    moved = fit.link;
    moved.gamma *= factor;
    EXPECT_GT(relative_objective(samples, moved), best) << factor;
  }
}

TEST(CostFit, SaysWhenTheSamplesCannotSeparateBetaFromGamma) {
  // Ring, tree and halving-doubling all transfer two bytes per byte reduced: only the combination
  // 2β + γ is determined. The fit attributes it all to β and says so; its predictions are exact.
  std::vector<TimingSample> samples;
  for (const std::string algorithm : {"ring", "tree", "halving-doubling"}) {
    for (int p : {2, 4, 8}) {
      for (double bytes : {4096.0, 65536.0, 1048576.0, 16777216.0}) {
        samples.push_back(
            {algorithm, p, bytes, allreduce_cost(algorithm, p, kTrueLink).time(bytes)});
      }
    }
  }
  const LinkFit fit = fit_link_parameters(samples);
  EXPECT_FALSE(fit.unique);
  EXPECT_NE(fit.ambiguity.find("beta and gamma"), std::string::npos) << fit.ambiguity;
  EXPECT_NE(fit.ambiguity.find("recursive-doubling"), std::string::npos) << fit.ambiguity;
  EXPECT_EQ(fit.link.gamma, 0.0);
  EXPECT_NEAR(fit.link.alpha, kTrueLink.alpha, 1e-9 * kTrueLink.alpha);
  EXPECT_NEAR(fit.link.beta, kTrueLink.beta + kTrueLink.gamma / 2, 1e-9 * kTrueLink.beta);
  EXPECT_LT(fit.rms_relative_residual, 1e-9);
}

void expect_data_error(const std::vector<TimingSample>& samples, const std::string& expected) {
  try {
    fit_link_parameters(samples);
    FAIL() << "accepted; expected an error containing: " << expected;
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(CostFit, RejectsTooFewSamplesAndUnusableOnes) {
  const TimingSample good{"ring", 4, 4096, 1e-4};
  expect_data_error({}, "at least 3 samples");
  expect_data_error({good, good}, "got 2");
  TimingSample zero_time = good;
  zero_time.seconds = 0;
  expect_data_error({good, good, zero_time},
                    "timing sample 2 (ring, 4 ranks, 4096 bytes): time must be positive");
  TimingSample negative_time = good;
  negative_time.seconds = -1e-3;
  expect_data_error({good, negative_time, good}, "timing sample 1");
  TimingSample not_a_number = good;
  not_a_number.seconds = std::numeric_limits<double>::quiet_NaN();
  expect_data_error({good, good, not_a_number}, "time must be positive and finite");
  TimingSample one_rank = good;
  one_rank.world_size = 1;
  expect_data_error({one_rank, good, good}, "world size must be at least 2");
  TimingSample negative_bytes = good;
  negative_bytes.bytes = -4;
  expect_data_error({good, good, negative_bytes}, "bytes must be finite and >= 0");
  TimingSample unknown = good;
  unknown.algorithm = "butterfly";
  expect_data_error({good, unknown, good}, "unknown allreduce algorithm");
}

TEST(LinearCostFit, RecoversAAndB) {
  Random random(7);
  std::vector<TimingSample> exact;
  std::vector<TimingSample> noisy;
  const LinearCost truth{150e-6, 0.75e-9};
  for (double bytes = 4096; bytes <= 64.0 * 1024 * 1024; bytes *= 2) {
    exact.push_back({"ring", 4, bytes, truth.time(bytes)});
    noisy.push_back(
        {"ring", 4, bytes, truth.time(bytes) * (1 + 0.03 * (2 * random.uniform() - 1))});
  }
  const LinearCost from_exact = fit_linear_cost(exact);
  EXPECT_NEAR(from_exact.a, truth.a, 1e-9 * truth.a);
  EXPECT_NEAR(from_exact.b, truth.b, 1e-9 * truth.b);
  const LinearCost from_noisy = fit_linear_cost(noisy);
  EXPECT_NEAR(from_noisy.a, truth.a, 0.02 * truth.a);
  EXPECT_NEAR(from_noisy.b, truth.b, 0.02 * truth.b);
}

TEST(LinearCostFit, KeepsTheInterceptNonNegative) {
  // Times exactly proportional to size, the smallest a bit faster: a would be negative.
  std::vector<TimingSample> samples = {
      {"tree", 2, 1000, 0.5e-6}, {"tree", 2, 10000, 10e-6}, {"tree", 2, 100000, 100e-6}};
  const LinearCost cost = fit_linear_cost(samples);
  EXPECT_EQ(cost.a, 0.0);
  EXPECT_GT(cost.b, 0.0);
}

TEST(LinearCostFit, RejectsMixedOrInsufficientSamples) {
  const std::vector<TimingSample> mixed_algorithms = {{"ring", 4, 4096, 1e-4},
                                                      {"tree", 4, 8192, 2e-4}};
  EXPECT_THROW(fit_linear_cost(mixed_algorithms), UsageError);
  const std::vector<TimingSample> mixed_world_sizes = {{"ring", 4, 4096, 1e-4},
                                                       {"ring", 8, 8192, 2e-4}};
  EXPECT_THROW(fit_linear_cost(mixed_world_sizes), UsageError);
  const std::vector<TimingSample> one_size = {{"ring", 4, 4096, 1e-4}, {"ring", 4, 4096, 1.1e-4}};
  try {
    fit_linear_cost(one_size);
    FAIL() << "one message size was accepted";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find("two or more message sizes"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(fit_linear_cost(std::vector<TimingSample>{}), DataError);
  const std::vector<TimingSample> zero_time = {{"ring", 4, 4096, 1e-4}, {"ring", 4, 8192, 0}};
  EXPECT_THROW(fit_linear_cost(zero_time), DataError);
}

// ---------------------------------------------------------------------------------------------
// Calibration file.

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

Calibration example_calibration() {
  Calibration calibration;
  calibration.transport = "local";
  calibration.world_size = 4;
  calibration.link = {21.3e-6, 0.41e-9,
                      0.2e-9 / 3};  // not short in decimal: tests exact round trip
  calibration.measured["ring"] = {150.7e-6, 0.78e-9};
  calibration.measured["tree"] = {0, 1.3e-9};
  calibration.samples = {
      {"ring", 4, 4096, 152.5e-6}, {"ring", 4, 16777216, 12327.5e-6}, {"tree", 2, 65536, 0.1 / 3}};
  return calibration;
}

void expect_same(const Calibration& loaded, const Calibration& saved) {
  EXPECT_EQ(loaded.transport, saved.transport);
  EXPECT_EQ(loaded.world_size, saved.world_size);
  EXPECT_EQ(loaded.link.alpha, saved.link.alpha);
  EXPECT_EQ(loaded.link.beta, saved.link.beta);
  EXPECT_EQ(loaded.link.gamma, saved.link.gamma);
  ASSERT_EQ(loaded.measured.size(), saved.measured.size());
  for (const auto& [algorithm, cost] : saved.measured) {
    ASSERT_TRUE(loaded.measured.count(algorithm)) << algorithm;
    EXPECT_EQ(loaded.measured.at(algorithm).a, cost.a) << algorithm;
    EXPECT_EQ(loaded.measured.at(algorithm).b, cost.b) << algorithm;
  }
  ASSERT_EQ(loaded.samples.size(), saved.samples.size());
  for (std::size_t i = 0; i < saved.samples.size(); ++i) {
    EXPECT_EQ(loaded.samples[i].algorithm, saved.samples[i].algorithm) << i;
    EXPECT_EQ(loaded.samples[i].world_size, saved.samples[i].world_size) << i;
    EXPECT_EQ(loaded.samples[i].bytes, saved.samples[i].bytes) << i;
    EXPECT_EQ(loaded.samples[i].seconds, saved.samples[i].seconds) << i;
  }
}

TEST(Calibration, SaveAndLoadRoundTripExactly) {
  TempDir dir;
  const std::string path = dir.file("calibration.json");
  const Calibration saved = example_calibration();
  save_calibration(saved, path);
  expect_same(load_calibration(path), saved);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"calibration.json"}) << "temporary file left";

  // Saving again replaces the file.
  Calibration changed = saved;
  changed.world_size = 8;
  changed.measured.clear();
  changed.samples.clear();
  save_calibration(changed, path);
  expect_same(load_calibration(path), changed);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"calibration.json"});
}

TEST(Calibration, MeasuredAndSamplesMayBeOmitted) {
  TempDir dir;
  const std::string path = dir.file("link_only.json");
  write_text(path, concat(R"({"format": ")", kCalibrationFormat,
                          R"(", "transport": "mpi", "world_size": 16,
                             "link": {"alpha": 5e-6, "beta": 1e-10, "gamma": 0}})"));
  const Calibration calibration = load_calibration(path);
  EXPECT_EQ(calibration.transport, "mpi");
  EXPECT_EQ(calibration.world_size, 16);
  EXPECT_EQ(calibration.link.alpha, 5e-6);
  EXPECT_TRUE(calibration.measured.empty());
  EXPECT_TRUE(calibration.samples.empty());
}

void expect_load_error(const std::string& path, const std::string& expected) {
  try {
    load_calibration(path);
    FAIL() << "accepted; expected an error containing: " << expected;
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_NE(message.find("calibration file '" + path + "'"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  }
}

TEST(Calibration, MissingFileNamesTheFile) {
  TempDir dir;
  expect_load_error(dir.file("absent.json"), "cannot open (No such file or directory)");
}

struct MalformedCase {
  const char* name;
  std::string text;      // file contents
  std::string expected;  // part of the message
};

void PrintTo(const MalformedCase& c, std::ostream* out) { *out << c.name; }

// A valid file's JSON, changed by `edit`.
template <typename Edit>
std::string edited(const Edit& edit) {
  json document = to_json(example_calibration());
  edit(document);
  return document.dump(2);
}

std::vector<MalformedCase> malformed_cases() {
  return {
      {"Empty", "", "is empty"},
      {"NotJson", "{\"format\": ", "not valid JSON (parse error at byte"},
      {"Truncated", to_json(example_calibration()).dump().substr(0, 60), "not valid JSON"},
      {"TopLevelArray", "[1, 2]", "top level must be a JSON object, got [1,2]"},
      {"NoFormat", edited([](json& d) { d.erase("format"); }), "missing field \"format\""},
      {"WrongFormatVersion",
       edited([](json& d) { d["format"] = "pipesgd-allreduce-calibration/2"; }),
       "\"format\" is \"pipesgd-allreduce-calibration/2\", expected "
       "\"pipesgd-allreduce-calibration/1\""},
      {"FormatNotAString", edited([](json& d) { d["format"] = 1; }), "\"format\" is 1"},
      {"NoTransport", edited([](json& d) { d.erase("transport"); }), "missing field \"transport\""},
      {"TransportNotAString", edited([](json& d) { d["transport"] = 3; }),
       "\"transport\" must be a string, got 3"},
      {"NoWorldSize", edited([](json& d) { d.erase("world_size"); }),
       "missing field \"world_size\""},
      {"WorldSizeZero", edited([](json& d) { d["world_size"] = 0; }),
       "\"world_size\" must be an integer >= 1, got 0"},
      {"WorldSizeNegative", edited([](json& d) { d["world_size"] = -2; }),
       "\"world_size\" must be an integer >= 1, got -2"},
      {"WorldSizeFraction", edited([](json& d) { d["world_size"] = 2.5; }),
       "\"world_size\" must be an integer >= 1, got 2.5"},
      {"WorldSizeHuge", edited([](json& d) { d["world_size"] = 1ull << 40; }),
       "\"world_size\" must be an integer >= 1"},
      {"NoLink", edited([](json& d) { d.erase("link"); }), "missing field \"link\""},
      {"LinkNotAnObject", edited([](json& d) { d["link"] = 5; }),
       "\"link\" must be a JSON object, got 5"},
      {"NoBeta", edited([](json& d) { d["link"].erase("beta"); }), "missing field \"link.beta\""},
      {"NegativeGamma", edited([](json& d) { d["link"]["gamma"] = -1e-10; }),
       "\"link.gamma\" must be a finite number >= 0, got -1e-10"},
      {"AlphaAString", edited([](json& d) { d["link"]["alpha"] = "fast"; }),
       "\"link.alpha\" must be a number, got \"fast\""},
      {"AlphaNull", edited([](json& d) { d["link"]["alpha"] = nullptr; }),
       "\"link.alpha\" must be a number, got null"},
      {"NumberOverflow",
       R"({"format": "pipesgd-allreduce-calibration/1", "transport": "local", "world_size": 4,
           "link": {"alpha": 1e-6, "beta": 1e999, "gamma": 0}})",
       "not valid JSON (number overflow parsing '1e999')"},
      {"UnknownLinkField", edited([](json& d) { d["link"]["delta"] = 1; }),
       "unknown field \"link.delta\""},
      {"UnknownTopLevelField", edited([](json& d) { d["mesured"] = json::object(); }),
       "unknown field \"mesured\""},
      {"UnknownMeasuredAlgorithm", edited([](json& d) {
         d["measured"]["butterfly"] = {{"a", 1}, {"b", 1}};
       }),
       "\"measured\" has unknown allreduce algorithm \"butterfly\""},
      {"NegativeMeasuredB", edited([](json& d) { d["measured"]["ring"]["b"] = -1; }),
       "\"measured.ring.b\" must be a finite number >= 0, got -1"},
      {"MissingMeasuredA", edited([](json& d) { d["measured"]["tree"].erase("a"); }),
       "missing field \"measured.tree.a\""},
      {"MeasuredNotAnObject", edited([](json& d) { d["measured"] = json::array(); }),
       "\"measured\" must be a JSON object"},
      {"SamplesNotAnArray", edited([](json& d) { d["samples"] = json::object(); }),
       "\"samples\" must be a JSON array"},
      {"SampleZeroSeconds", edited([](json& d) { d["samples"][1]["seconds"] = 0; }),
       "\"samples[1].seconds\" must be a finite number > 0, got 0"},
      {"SampleMissingBytes", edited([](json& d) { d["samples"][2].erase("bytes"); }),
       "missing field \"samples[2].bytes\""},
      {"SampleNegativeBytes", edited([](json& d) { d["samples"][0]["bytes"] = -8; }),
       "\"samples[0].bytes\" must be a finite number >= 0, got -8"},
      {"SampleWorldSizeZero", edited([](json& d) { d["samples"][0]["world_size"] = 0; }),
       "\"samples[0].world_size\" must be an integer >= 1, got 0"},
      {"SampleUnknownAlgorithm", edited([](json& d) { d["samples"][0]["algorithm"] = "star"; }),
       "\"samples[0].algorithm\" is unknown: \"star\""},
  };
}

class MalformedCalibration : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(MalformedCalibration, GivesAOneLineDataErrorNamingTheFileAndTheProblem) {
  TempDir dir;
  const std::string path = dir.file("calibration.json");
  write_text(path, GetParam().text);
  expect_load_error(path, GetParam().expected);
}

INSTANTIATE_TEST_SUITE_P(Files, MalformedCalibration, ::testing::ValuesIn(malformed_cases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(Calibration, SaveRejectsAnInvalidCalibrationAndKeepsTheOldFile) {
  TempDir dir;
  const std::string path = dir.file("calibration.json");
  save_calibration(example_calibration(), path);
  Calibration invalid = example_calibration();
  invalid.link.beta = std::numeric_limits<double>::quiet_NaN();
  try {
    save_calibration(invalid, path);
    FAIL() << "a NaN beta was saved";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("cannot save calibration to '" + path + "'"), std::string::npos)
        << message;
    EXPECT_NE(message.find("link.beta"), std::string::npos) << message;
  }
  expect_same(load_calibration(path), example_calibration());
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"calibration.json"});
}

TEST(Calibration, FromJsonRejectsNonFiniteNumbers) {
  // JSON text cannot hold NaN or infinity, but a document built in memory can.
  json document = to_json(example_calibration());
  document["link"]["beta"] = std::numeric_limits<double>::quiet_NaN();
  try {
    calibration_from_json(document, "test document");
    FAIL() << "a NaN beta was accepted";
  } catch (const DataError& error) {
    EXPECT_EQ(std::string(error.what()),
              "test document: \"link.beta\" must be a finite number >= 0, got nan");
  }
  document = to_json(example_calibration());
  document["samples"][0]["seconds"] = std::numeric_limits<double>::infinity();
  EXPECT_THROW(calibration_from_json(document, "test document"), DataError);
  EXPECT_NO_THROW(calibration_from_json(to_json(example_calibration()), "test document"));
}

TEST(Calibration, SaveToAMissingDirectoryIsAUsageErrorNamingTheFile) {
  TempDir dir;
  const std::string path = dir.file("no_such_directory/calibration.json");
  try {
    save_calibration(example_calibration(), path);
    FAIL() << "saved into a missing directory";
  } catch (const UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot write calibration file '" + path + "': directory '" +
                                             dir.file("no_such_directory") + "' does not exist"),
              std::string::npos)
        << error.what();
  }
  EXPECT_TRUE(dir.entries().empty());
}

// ---------------------------------------------------------------------------------------------
// Choice.

const std::vector<std::string> kAllAlgorithms = cost_model_algorithm_names();

TEST(CostChoice, LatencyOptimalForTinyMessagesBandwidthOptimalForHugeOnes) {
  const LinkParameters link{10e-6, 1e-9, 1e-9};
  // p = 8, per-message a: rd 3α < hd = tree 6α < ring 14α; b: ring = hd = 7/8·3 ns < rd 3·2 ns
  // < tree 3·3 ns. Tiny: recursive doubling. Huge: halving-doubling (ring's bandwidth, fewer
  // messages).
  EXPECT_EQ(choose_allreduce_algorithm(link, 8, 8, kAllAlgorithms), "recursive-doubling");
  EXPECT_EQ(choose_allreduce_algorithm(link, 8, 1e9, kAllAlgorithms), "halving-doubling");
  // p = 6: the fold costs halving-doubling 2β + γ per byte, so the ring wins huge messages. The
  // tree (depth 2) sends as few messages as folded recursive doubling (2 + 2) and fewer bytes per
  // byte (4β + 2γ against 4β + 3γ), so it wins tiny ones; at p = 3 it sends fewer messages (2 vs 3).
  EXPECT_EQ(choose_allreduce_algorithm(link, 6, 8, kAllAlgorithms), "tree");
  EXPECT_EQ(choose_allreduce_algorithm(link, 3, 8, kAllAlgorithms), "tree");
  EXPECT_EQ(choose_allreduce_algorithm(link, 6, 1e9, kAllAlgorithms), "ring");
  // Only the candidates given are considered.
  const std::vector<std::string> ring_or_tree = {"tree", "ring"};
  EXPECT_EQ(choose_allreduce_algorithm(link, 8, 8, ring_or_tree), "tree");
  EXPECT_EQ(choose_allreduce_algorithm(link, 8, 1e9, ring_or_tree), "ring");
}

TEST(CostChoice, MeasuredCostsOverrideTheModelAtTheirWorldSize) {
  Calibration calibration;
  calibration.world_size = 4;
  calibration.link = {10e-6, 1e-9, 1e-9};
  // The model says recursive doubling for 8 bytes on 4 ranks; the measurement says the ring
  // is faster here (it was, say, better implemented).
  calibration.measured["ring"] = {1e-6, 1e-9};
  EXPECT_EQ(choose_allreduce_algorithm(calibration, 4, 8, kAllAlgorithms), "ring");
  EXPECT_DOUBLE_EQ(predict_allreduce_seconds(calibration, "ring", 4, 1000), 1e-6 + 1e-6);
  // At another world size the measurement does not apply.
  EXPECT_EQ(choose_allreduce_algorithm(calibration, 8, 8, kAllAlgorithms), "recursive-doubling");
  EXPECT_DOUBLE_EQ(predict_allreduce_seconds(calibration, "ring", 8, 1000),
                   allreduce_cost("ring", 8, calibration.link).time(1000));
  // Without measurements the calibration's link decides, as with the link alone.
  calibration.measured.clear();
  EXPECT_EQ(choose_allreduce_algorithm(calibration, 4, 8, kAllAlgorithms),
            choose_allreduce_algorithm(calibration.link, 4, 8, kAllAlgorithms));
}

// Inside the calibrated range the measured times themselves decide (interpolated in log-log), where a
// straight line fitted over all sizes would mislead; outside it the fitted line applies.
TEST(CostChoice, MeasuredTimesInterpolatedInsideTheCalibratedRange) {
  Calibration calibration;
  calibration.world_size = 2;
  calibration.link = {10e-6, 1e-9, 1e-9};
  // The lines say "direct" everywhere (lower a and b)...
  calibration.measured["ring"] = {5e-6, 2e-10};
  calibration.measured["direct"] = {4e-6, 1e-10};
  // ...but the measurements say the ring is faster at 64 KiB and 256 KiB.
  calibration.samples = {{"ring", 2, 65536, 20e-6},   {"ring", 2, 262144, 40e-6},
                         {"direct", 2, 65536, 25e-6}, {"direct", 2, 262144, 55e-6}};
  const std::vector<std::string> candidates = {"ring", "direct"};
  EXPECT_EQ(choose_allreduce_algorithm(calibration, 2, 65536, candidates), "ring");
  EXPECT_EQ(choose_allreduce_algorithm(calibration, 2, 131072, candidates), "ring");
  // Exact at a measured size; the geometric mean halfway (in log bytes) between two.
  EXPECT_DOUBLE_EQ(predict_allreduce_seconds(calibration, "ring", 2, 262144), 40e-6);
  EXPECT_NEAR(predict_allreduce_seconds(calibration, "ring", 2, 131072), std::sqrt(20e-6 * 40e-6),
              1e-15);
  // Outside the measured sizes: the fitted lines.
  EXPECT_DOUBLE_EQ(predict_allreduce_seconds(calibration, "ring", 2, 1 << 20),
                   calibration.measured["ring"].time(1 << 20));
  EXPECT_EQ(choose_allreduce_algorithm(calibration, 2, 1 << 20, candidates), "direct");
  // Another world size: neither samples nor lines apply.
  EXPECT_DOUBLE_EQ(predict_allreduce_seconds(calibration, "ring", 4, 65536),
                   allreduce_cost("ring", 4, calibration.link).time(65536));
}

TEST(CostChoice, TiesGoToTheFirstCandidate) {
  const LinkParameters link = default_link_parameters();
  // One rank: everything costs 0.
  const std::vector<std::string> tree_first = {"tree", "ring"};
  const std::vector<std::string> ring_first = {"ring", "tree"};
  EXPECT_EQ(choose_allreduce_algorithm(link, 1, 1e6, tree_first), "tree");
  EXPECT_EQ(choose_allreduce_algorithm(link, 1, 1e6, ring_first), "ring");
  // Two ranks, no latency: ring and halving-doubling cost exactly the same.
  const LinkParameters no_latency{0, 1e-9, 1e-9};
  const std::vector<std::string> hd_first = {"halving-doubling", "ring"};
  const std::vector<std::string> ring_then_hd = {"ring", "halving-doubling"};
  EXPECT_EQ(choose_allreduce_algorithm(no_latency, 2, 1e6, hd_first), "halving-doubling");
  EXPECT_EQ(choose_allreduce_algorithm(no_latency, 2, 1e6, ring_then_hd), "ring");
}

TEST(CostChoice, RejectsBadArguments) {
  const LinkParameters link = default_link_parameters();
  EXPECT_THROW(choose_allreduce_algorithm(link, 4, 1e6, std::vector<std::string>{}), UsageError);
  EXPECT_THROW(choose_allreduce_algorithm(link, 4, 1e6, std::vector<std::string>{"ring", "star"}),
               UsageError);
  EXPECT_THROW(choose_allreduce_algorithm(link, 0, 1e6, kAllAlgorithms), UsageError);
  EXPECT_THROW(choose_allreduce_algorithm(link, 4, -1, kAllAlgorithms), UsageError);
  EXPECT_THROW(
      choose_allreduce_algorithm(link, 4, std::numeric_limits<double>::infinity(), kAllAlgorithms),
      UsageError);
}

}  // namespace
}  // namespace pipesgd
