#pragma once
// Test helpers for checkpoint / resume tests: the interrupt-and-resume schedule (60 iterations, a
// checkpoint every 10, the last worker crashed at 37, resumed from 30) and the configurations for
// it, comparing two runs' final weights bit for bit, checking a run trained, and interrupting a
// checkpointing run by a crashed worker (interrupt(): --inject-fault, see there).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/model.h"
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
  config.reliability.checkpoint_dir = dir;
  config.reliability.checkpoint_every = kEvery;
  return config;
}

// `config` with its last worker crashing at `iteration` and a 1 s comm timeout for the others.
inline TrainConfig crashing(TrainConfig config, std::int64_t iteration = kCrashAt) {
  config.reliability.fault.rank = config.workers - 1;
  config.reliability.fault.iteration = iteration;
  config.reliability.fault.kind = FaultInjection::Kind::kCrash;
  set_timeout(config, std::chrono::seconds(1));
  return config;
}

// `config` resuming from `dir` (and writing checkpoints on, unless keep_writing is false).
inline TrainConfig resuming(TrainConfig config, const std::string& dir, bool keep_writing = true) {
  config.reliability.checkpoint_dir = dir;
  config.reliability.checkpoint_every = keep_writing ? kEvery : 0;
  config.reliability.resume = true;
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

// The figures of `actual`'s summary that are not timings equal `expected`'s: what a resumed run
// must report as the run never interrupted does (with the same checkpoints, whose barriers and
// markers count in the bytes sent).
inline ::testing::AssertionResult SameReport(const RunSummary& expected, const RunSummary& actual) {
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  auto differs = [&](const char* what, auto a, auto b) {
    if (a == b) return;
    if (result) result = ::testing::AssertionFailure();
    result << what << ": " << a << " vs " << b << "; ";
  };
  differs("iterations", expected.timing.iterations, actual.timing.iterations);
  differs("bytes_sent_per_iteration", expected.timing.bytes_sent_per_iteration, actual.timing.bytes_sent_per_iteration);
  differs("mean loss", expected.figures.mean.loss, actual.figures.mean.loss);
  differs("non-finite skipped", expected.reliability.nonfinite_skipped, actual.reliability.nonfinite_skipped);
  differs("consistency checks", expected.reliability.consistency_checks, actual.reliability.consistency_checks);
  differs("final train accuracy", expected.figures.final_train_accuracy, actual.figures.final_train_accuracy);
  differs("final test accuracy", expected.figures.final_test_accuracy, actual.figures.final_test_accuracy);
  differs("weights checksum", expected.weights_checksum, actual.weights_checksum);
  differs("epochs", expected.epochs.size(), actual.epochs.size());
  for (std::size_t e = 0; e < std::min(expected.epochs.size(), actual.epochs.size()); ++e) {
    const EpochRecord& a = expected.epochs[e];
    const EpochRecord& b = actual.epochs[e];
    differs("epoch number", a.epoch, b.epoch);
    differs("epoch iterations", a.iterations, b.iterations);
    differs("epoch train loss", a.train_loss, b.train_loss);
    differs("epoch train accuracy", a.train_accuracy, b.train_accuracy);
    differs("epoch test accuracy", a.test_accuracy, b.test_accuracy);
    differs("epoch test loss", a.test_loss, b.test_loss);
  }
  return result;
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
  } catch (const std::exception& error) {
    // How the survivors learned of it (shown by ctest when the test fails).
    std::printf("[ crashed  ] %s\n", error.what());
    return CrashOutcome::kThrew;
  }
}

// Behaves like `inner` but, if `fails`, throws DataError at its forward pass of `iteration` (its
// call with that index: a run that does not resume calls it once per iteration from 0).
class FailingAtIterationModel final : public Model {
 public:
  static constexpr const char* kMessage = "injected failure of the last worker";
  FailingAtIterationModel(std::unique_ptr<Model> inner, bool fails, std::int64_t iteration)
      : inner_(std::move(inner)), fails_(fails), iteration_(iteration) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& ready) override {
    if (fails_ && calls_++ == iteration_) throw DataError(kMessage);
    return inner_->forward_backward(batch, gradients, ready);
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
  bool fails_;
  std::int64_t iteration_;
  std::int64_t calls_ = 0;
};

// Interrupts `config`, which writes checkpoints (checkpointing()), by its last worker crashing at
// `iteration` (not a checkpoint iteration), and returns how the crashed run ended. Two runs:
//  1. The run fails at `iteration`, loudly: the last worker's model throws there, so every rank
//     stops at once. It writes the checkpoints before `iteration` with the default (patient) comm
//     timeout: each write fsyncs, and under load a worker waiting for its previous write held
//     the others for more than 0.3 s (measured; a 1 s timeout over these phases left little margin).
//  2. Resumed from the newest of them, the run crashes at `iteration` as a dead worker does
//     (--inject-fault kind=crash: silently), and the others stop on their 1 s comm timeout. No
//     checkpoint is written between the resume and the crash, so that short timeout covers
//     computing and communicating only, and matters only once the worker has crashed.
// Together they leave on disk the checkpoints before `iteration`, and none of the crashed worker's
// after it.
inline CrashOutcome interrupt(const TrainConfig& config, const DataSplits& data, std::int64_t iteration = kCrashAt) {
  if (config.reliability.checkpoint_every <= 0 || iteration % config.reliability.checkpoint_every == 0) {
    ADD_FAILURE() << "interrupt() needs a checkpointing configuration and a crash between checkpoints";
    return CrashOutcome::kThrew;
  }
  auto built = std::make_shared<std::atomic<int>>(0);
  const int last = config.workers - 1;
  const ModelFactory failing = [built, last, iteration](std::uint64_t seed) -> std::unique_ptr<Model> {
    return std::make_unique<FailingAtIterationModel>(softmax_factory()(seed), (*built)++ == last, iteration);
  };
  try {
    run_training(config, failing, data);
    ADD_FAILURE() << "the run whose last worker fails at iteration " << iteration << " completed";
  } catch (const DataError& error) {
    EXPECT_STREQ(error.what(), FailingAtIterationModel::kMessage) << "the run failed otherwise";
  } catch (const std::exception& error) {
    ADD_FAILURE() << "the run whose last worker fails at iteration " << iteration
                  << " failed otherwise: " << error.what();
  }
  TrainConfig resumed = crashing(config, iteration);
  resumed.reliability.resume = true;
  return run_crashing(resumed, data);
}

}  // namespace pipesgd
