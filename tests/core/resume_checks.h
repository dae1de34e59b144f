#pragma once
// Test helpers for checkpoint / resume tests: the interrupt-and-resume schedule (60 iterations, a
// checkpoint every 10, the last worker crashed at 37, resumed from 30) and the configurations for
// it, comparing two runs' final weights bit for bit, checking a run trained, and running a
// configuration whose worker crashes (--inject-fault).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/fault_injection.h"
#include "pipesgd/train/trainer.h"
#include "tiny_run.h"

namespace pipesgd {

inline constexpr std::int64_t kIterations = 60;
inline constexpr std::int64_t kEvery = 10;
inline constexpr std::int64_t kCrashAt = 37;  // after checkpoint 30, before 40

// The synthetic data every resume test trains on (built once).
inline const DataSplits& data() {
  static const DataSplits splits = small_data();
  return splits;
}

// `config` writing a checkpoint every kEvery iterations into `dir`.
inline TrainConfig checkpointing(TrainConfig config, const std::string& dir) {
  config.checkpoint_dir = dir;
  config.checkpoint_every = kEvery;
  return config;
}

// `config` with its last worker crashing at `iteration` and a 1 s comm timeout for the others.
inline TrainConfig crashing(TrainConfig config, std::int64_t iteration = kCrashAt) {
  config.fault.rank = config.workers - 1;
  config.fault.iteration = iteration;
  config.fault.kind = FaultInjection::Kind::kCrash;
  config.method.allreduce.timeout = std::chrono::seconds(1);
  return config;
}

// `config` resuming from `dir` (and writing checkpoints on, unless keep_writing is false).
inline TrainConfig resuming(TrainConfig config, const std::string& dir, bool keep_writing = true) {
  config.checkpoint_dir = dir;
  config.checkpoint_every = keep_writing ? kEvery : 0;
  config.resume = true;
  return config;
}

// The file name of `part` of the checkpoint of `iteration`.
inline std::string name_of(std::int64_t iteration, const std::string& part) {
  return checkpoint_path("", iteration, part).filename().string();
}

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
