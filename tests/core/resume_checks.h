#pragma once
// Test helpers for checkpoint / resume tests: comparing two runs' final weights bit for bit, checking
// a run trained, and running a configuration whose worker crashes (--inject-fault).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <exception>

#include "pipesgd/core/error.h"
#include "pipesgd/train/trainer.h"
#include "tiny_run.h"

namespace pipesgd {

// Every rank's final parameters (and the weights checksum) of `actual` equal `expected`'s bit for bit.
inline ::testing::AssertionResult BitIdentical(const RunSummary& expected, const RunSummary& actual) {
  if (expected.final_parameters.size() != actual.final_parameters.size()) {
    return ::testing::AssertionFailure() << "ranks: " << expected.final_parameters.size() << " vs "
                                         << actual.final_parameters.size();
  }
  for (std::size_t r = 0; r < expected.final_parameters.size(); ++r) {
    const auto& a = expected.final_parameters[r];
    const auto& b = actual.final_parameters[r];
    if (a.empty()) return ::testing::AssertionFailure() << "rank " << r << " has no final parameters";
    if (a.size() != b.size()) {
      return ::testing::AssertionFailure() << "rank " << r << ": " << a.size() << " vs " << b.size()
                                           << " parameters";
    }
    if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
      std::size_t first = 0, differing = 0;
      for (std::size_t i = a.size(); i-- > 0;) {
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
          first = i;
          ++differing;
        }
      }
      return ::testing::AssertionFailure() << "rank " << r << ": " << differing << " of " << a.size()
                                           << " parameters differ; first at " << first << ": "
                                           << a[first] << " vs " << b[first];
    }
  }
  if (expected.weights_checksum != actual.weights_checksum) {
    return ::testing::AssertionFailure() << "weights_checksum differs";
  }
  return ::testing::AssertionSuccess();
}

// The run trained: every parameter is finite (memcmp of two NaN runs would pass as well).
inline ::testing::AssertionResult Trained(const RunSummary& summary) {
  if (summary.final_parameters.empty() || summary.final_parameters[0].empty()) {
    return ::testing::AssertionFailure() << "no final parameters";
  }
  for (const auto& rank : summary.final_parameters) {
    for (float value : rank) {
      if (!std::isfinite(value)) return ::testing::AssertionFailure() << "non-finite parameter";
    }
  }
  return ::testing::AssertionSuccess();
}

// How a run whose worker crashed ended. With several workers the others must stop with an error
// (never a UsageError: the configuration was fine). With one worker there is nobody to notice: the
// crashed thread ends silently and run_training returns; the summary then lacks rank 0's final
// parameters (it never finished).
enum class CrashOutcome { kThrew, kReturned };

inline CrashOutcome run_crashing(const TrainConfig& config, const DataSplits& data) {
  try {
    RunSummary summary = run_training(config, softmax_factory(), data);
    EXPECT_EQ(config.workers, 1) << "a run with a crashed worker among " << config.workers
                                 << " returned normally";
    EXPECT_TRUE(summary.final_parameters.empty() || summary.final_parameters[0].empty())
        << "the crashed (only) worker reported final parameters";
    return CrashOutcome::kReturned;
  } catch (const UsageError& error) {
    ADD_FAILURE() << "the crashing run failed with a UsageError: " << error.what();
    return CrashOutcome::kThrew;
  } catch (const std::exception&) {
    return CrashOutcome::kThrew;
  }
}

}  // namespace pipesgd
