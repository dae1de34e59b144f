// The trainer's reliability features (train/trainer.h): --on-nonfinite stop|skip (a NaN or Inf in a
// worker's gradient is found before it is communicated), --check-consistency N (the replicas of the
// synchronous methods compare weight checksums) and --inject-fault (train/fault_injection.h: one
// worker crashes or hangs; the others must stop with a CommError naming where they were).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/algo/training_method.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/model.h"
#include "pipesgd/train/fault_injection.h"
#include "pipesgd/train/trainer.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

// gmock is not linked: substring checks with readable failures.
::testing::AssertionResult Contains(const std::string& text, const std::string& fragment) {
  if (text.find(fragment) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' lacks '" << fragment << "'";
}
::testing::AssertionResult Lacks(const std::string& text, const std::string& fragment) {
  if (text.find(fragment) == std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' contains '" << fragment << "'";
}

// --- Models ------------------------------------------------------------------------------------

// What GradientTamperingModel writes into the gradient of one segment at one iteration.
enum class Tamper { kNaN, kInf, kZeros };

struct GradientInjection {
  int rank = 0;                 // the replica that tampers (replicas are built in rank order)
  std::int64_t iteration = 0;   // its forward_backward call with this index (= the iteration)
  std::size_t segment = 0;      // the segment of the gradient buffer
  Tamper tamper = Tamper::kNaN;
  bool report_segments = true;  // false: report no segment (the trainer checks after backward)
};

constexpr std::size_t kTamperedElement = 7;  // inside every segment of the softmax model (10 biases)

// Behaves like `inner` but, if `tampers`, changes the gradient of one segment at one iteration after
// the inner backward and before the segments are reported ready (it reports them itself, in
// backward order, after the inner call, as ResegmentedModel does): NaN or +Inf in one element, or
// zeros in the whole segment (what --on-nonfinite skip must make of the NaN).
class GradientTamperingModel final : public Model {
 public:
  GradientTamperingModel(std::unique_ptr<Model> inner, bool tampers, GradientInjection injection)
      : inner_(std::move(inner)), tampers_(tampers), injection_(injection) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& on_ready) override {
    StepResult result = inner_->forward_backward(batch, gradients, {});
    if (tampers_ && calls_ == injection_.iteration) {
      const std::span<float> values = layout().slice(gradients, injection_.segment);
      switch (injection_.tamper) {
        case Tamper::kNaN: values[kTamperedElement] = std::numeric_limits<float>::quiet_NaN(); break;
        case Tamper::kInf: values[kTamperedElement] = std::numeric_limits<float>::infinity(); break;
        case Tamper::kZeros: std::fill(values.begin(), values.end(), 0.0f); break;
      }
    }
    ++calls_;
    if (on_ready && injection_.report_segments) {
      for (std::size_t s = layout().segment_count(); s-- > 0;) on_ready(s, 0.0);
    }
    return result;
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
  bool tampers_;
  GradientInjection injection_;
  std::int64_t calls_ = 0;
};

// A fresh factory per run (it counts the replicas it built to know their ranks).
ModelFactory tampering_factory(GradientInjection injection) {
  auto built = std::make_shared<std::atomic<int>>(0);
  return [built, injection](std::uint64_t seed) -> std::unique_ptr<Model> {
    const bool tampers = (*built)++ == injection.rank;
    return std::make_unique<GradientTamperingModel>(softmax_factory()(seed), tampers, injection);
  };
}

// Behaves like `inner` but, on rank `rank`, adds `delta` to parameter 0 at the start of its
// forward_backward of iteration `iteration`: that replica's weights silently diverge.
class ParameterNudgeModel final : public Model {
 public:
  ParameterNudgeModel(std::unique_ptr<Model> inner, bool nudges, std::int64_t iteration, float delta)
      : inner_(std::move(inner)), nudges_(nudges), iteration_(iteration), delta_(delta) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& on_ready) override {
    if (nudges_ && calls_ == iteration_) inner_->parameters()[0] += delta_;
    ++calls_;
    StepResult result = inner_->forward_backward(batch, gradients, {});
    if (on_ready) {
      for (std::size_t s = layout().segment_count(); s-- > 0;) on_ready(s, 0.0);
    }
    return result;
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
  bool nudges_;
  std::int64_t iteration_;
  float delta_;
  std::int64_t calls_ = 0;
};

ModelFactory nudge_factory(int rank, std::int64_t iteration, float delta) {
  auto built = std::make_shared<std::atomic<int>>(0);
  return [built, rank, iteration, delta](std::uint64_t seed) -> std::unique_ptr<Model> {
    const bool nudges = (*built)++ == rank;
    return std::make_unique<ParameterNudgeModel>(softmax_factory()(seed), nudges, iteration, delta);
  };
}

// --- Configurations ----------------------------------------------------------------------------

// tiny_config for `method`, with the method-specific settings these tests use: sapipe with one
// stale layer, wp1 and a single bucket (no profiling); pssync and odsgd with one server (odsgd with
// 2 warm-up iterations).
TrainConfig method_config(const std::string& method, int workers) {
  if (method == "pssync" || method == "odsgd") {
    return tiny_config(method, workers, 1, method == "odsgd" ? OptionValues{{"--warmup-iters", "2"}} : OptionValues{});
  }
  if (method == "sapipe") {
    return tiny_config(method, workers, 0, {{"--stale-layers", "1"}, {"--compensation", "wp1"}, {"--buckets", "single"}});
  }
  return tiny_config(method, workers);
}

bool all_finite(const std::vector<float>& values) {
  for (float value : values) {
    if (!std::isfinite(value)) return false;
  }
  return true;
}

// --- 1. Non-finite gradients, --on-nonfinite stop ----------------------------------------------

std::string tamper_name(Tamper tamper) {
  return tamper == Tamper::kNaN ? "NaN" : tamper == Tamper::kInf ? "+Inf" : "zeros";
}

// Runs `config` with `injection` and expects the NumericalError of the tampering rank (the root
// cause, not another rank's PeerFailedError or CommError) naming its rank, layer and iteration.
void expect_numerical_error(const TrainConfig& config, const GradientInjection& injection) {
  const std::string layer = softmax_factory()(1)->layout().segment(injection.segment).name;
  try {
    run_training(config, tampering_factory(injection), small_data());
    ADD_FAILURE() << "expected a NumericalError";
  } catch (const NumericalError& error) {
    const std::string message = error.what();
    EXPECT_TRUE(Contains(message, concat("rank ", injection.rank, ":")));
    EXPECT_TRUE(Contains(message, concat("layer '", layer, "'")));
    EXPECT_TRUE(Contains(message, concat("at iteration ", injection.iteration, ",")));
    EXPECT_TRUE(Contains(message, "non-finite gradient (NaN or Inf)"));
    EXPECT_TRUE(Contains(message, "--on-nonfinite"));
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected the tampering rank's NumericalError (the root cause), got "
                  << (dynamic_cast<const PeerFailedError*>(&error) ? "PeerFailedError"
                      : dynamic_cast<const CommError*>(&error)     ? "CommError"
                                                                   : "another error")
                  << ": " << error.what();
  }
}

TEST(ReliabilityNonFinite, StopNamesRankLayerAndIteration) {
  for (const std::string method : {"dsync", "pipe", "wfbp", "sapipe"}) {
    for (const int workers : {1, 3}) {
      for (const Tamper tamper : {Tamper::kNaN, Tamper::kInf}) {
        GradientInjection injection;
        injection.rank = workers - 2 < 0 ? 0 : 1;
        injection.iteration = tamper == Tamper::kNaN ? 7 : 12;
        injection.segment = tamper == Tamper::kNaN ? 0 : 1;  // linear.weight, linear.bias
        injection.tamper = tamper;
        SCOPED_TRACE(concat(method, ", ", workers, " workers, ", tamper_name(tamper), " on rank ", injection.rank,
                            " at iteration ", injection.iteration));
        expect_numerical_error(method_config(method, workers), injection);
      }
    }
  }
}

// A model that reports no segment ready: the trainer checks every segment after backward, before
// end_iteration communicates.
TEST(ReliabilityNonFinite, StopWhenTheModelReportsNoSegment) {
  for (const std::string method : {"dsync", "pipe"}) {
    SCOPED_TRACE(method);
    GradientInjection injection;
    injection.rank = 2;
    injection.iteration = 4;
    injection.segment = 0;
    injection.report_segments = false;
    expect_numerical_error(method_config(method, 3), injection);
  }
}

TEST(ReliabilityNonFinite, FiniteRunIsNotStopped) {
  GradientInjection none;
  none.rank = -1;
  const RunSummary summary = run_training(method_config("dsync", 3), tampering_factory(none), small_data());
  EXPECT_EQ(summary.reliability.nonfinite_skipped, 0);
  EXPECT_EQ(summary.timing.iterations, 25);
}

// --- 2. Non-finite gradients, --on-nonfinite skip ----------------------------------------------

void expect_identical_finite_replicas(const RunSummary& summary, int workers) {
  ASSERT_EQ(summary.final_parameters.size(), static_cast<std::size_t>(workers));
  for (int rank = 0; rank < workers; ++rank) {
    EXPECT_TRUE(all_finite(summary.final_parameters[rank])) << "rank " << rank;
    EXPECT_EQ(summary.final_parameters[rank], summary.final_parameters[0]) << "rank " << rank << " differs from rank 0";
  }
}

TEST(ReliabilityNonFinite, SkipReplacesTheLayerByZeros) {
  constexpr int kWorkers = 3;
  for (const std::string method : {"dsync", "pipe", "wfbp", "sapipe"}) {
    for (const Tamper tamper : {Tamper::kNaN, Tamper::kInf}) {
      SCOPED_TRACE(concat(method, ", ", tamper_name(tamper)));
      TrainConfig config = method_config(method, kWorkers);
      config.reliability.on_nonfinite = "skip";
      GradientInjection injection;
      injection.rank = 1;
      injection.iteration = 9;
      injection.segment = tamper == Tamper::kNaN ? 0 : 1;
      injection.tamper = tamper;
      const RunSummary skipped = run_training(config, tampering_factory(injection), small_data());
      EXPECT_EQ(skipped.timing.iterations, 25);
      EXPECT_EQ(skipped.reliability.nonfinite_skipped, 1);
      expect_identical_finite_replicas(skipped, kWorkers);

      // The same run with that segment's gradient zeros at that iteration on that rank.
      GradientInjection zeros = injection;
      zeros.tamper = Tamper::kZeros;
      const RunSummary zeroed = run_training(config, tampering_factory(zeros), small_data());
      EXPECT_EQ(zeroed.reliability.nonfinite_skipped, 0);
      ASSERT_EQ(zeroed.final_parameters.size(), skipped.final_parameters.size());
      for (int rank = 0; rank < kWorkers; ++rank) {
        EXPECT_EQ(skipped.final_parameters[rank], zeroed.final_parameters[rank])
            << "rank " << rank << ": skipping the " << tamper_name(tamper)
            << " is not the same as a zero gradient in that layer";
      }

      // The zeros changed the run (else the comparison above proves nothing).
      GradientInjection none;
      none.rank = -1;
      const RunSummary clean = run_training(config, tampering_factory(none), small_data());
      EXPECT_EQ(clean.reliability.nonfinite_skipped, 0);
      EXPECT_NE(clean.final_parameters[0], zeroed.final_parameters[0]);
    }
  }
}

TEST(ReliabilityNonFinite, SkipWhenTheModelReportsNoSegment) {
  TrainConfig config = method_config("dsync", 3);
  config.reliability.on_nonfinite = "skip";
  GradientInjection injection;
  injection.rank = 0;
  injection.iteration = 3;
  injection.segment = 1;
  injection.report_segments = false;
  const RunSummary skipped = run_training(config, tampering_factory(injection), small_data());
  EXPECT_EQ(skipped.reliability.nonfinite_skipped, 1);
  expect_identical_finite_replicas(skipped, 3);
  injection.tamper = Tamper::kZeros;
  const RunSummary zeroed = run_training(config, tampering_factory(injection), small_data());
  EXPECT_EQ(skipped.final_parameters, zeroed.final_parameters);
}

// Every rank's NaN at the same iteration, in both layers: each layer of each rank counts once.
TEST(ReliabilityNonFinite, SkipCountsEveryLayerOfEveryRank) {
  TrainConfig config = method_config("dsync", 2);
  config.reliability.on_nonfinite = "skip";
  // Two injections per replica (segment 0 at iteration 5, segment 1 at iteration 5): a wrapper
  // around a wrapper.
  ModelFactory factory = [](std::uint64_t seed) -> std::unique_ptr<Model> {
    GradientInjection weight{0, 5, 0, Tamper::kNaN, false};
    GradientInjection bias{0, 5, 1, Tamper::kNaN, true};
    auto inner = std::make_unique<GradientTamperingModel>(softmax_factory()(seed), true, weight);
    return std::make_unique<GradientTamperingModel>(std::move(inner), true, bias);
  };
  const RunSummary summary = run_training(config, factory, small_data());
  EXPECT_EQ(summary.reliability.nonfinite_skipped, 4);
  expect_identical_finite_replicas(summary, 2);
}

// --- 3. --check-consistency ---------------------------------------------------------------------

TEST(ReliabilityConsistency, PassesForTheSynchronousMethods) {
  for (const std::string method : {"dsync", "pipe", "sapipe", "pssync"}) {
    SCOPED_TRACE(method);
    TrainConfig config = method_config(method, 3);
    config.reliability.check_consistency = 1;
    const RunSummary summary = run_training(config, softmax_factory(), small_data());
    EXPECT_EQ(summary.reliability.consistency_checks, 25);
    // The checks do not change the training.
    const RunSummary unchecked = run_training(method_config(method, 3), softmax_factory(), small_data());
    EXPECT_EQ(unchecked.reliability.consistency_checks, 0);
    EXPECT_EQ(summary.final_parameters, unchecked.final_parameters);
  }
  TrainConfig every4 = method_config("dsync", 3);
  every4.reliability.check_consistency = 4;  // after iterations 3, 7, ..., 23
  EXPECT_EQ(run_training(every4, softmax_factory(), small_data()).reliability.consistency_checks, 6);
}

void expect_divergence(const TrainConfig& config, const std::string& rank, std::int64_t iteration) {
  try {
    run_training(config, nudge_factory(2, 5, 1e-3f), small_data());
    ADD_FAILURE() << "expected a ReplicaDivergenceError";
  } catch (const ReplicaDivergenceError& error) {
    const std::string message = error.what();
    EXPECT_TRUE(Contains(message, concat("iteration ", iteration, ":")));
    EXPECT_TRUE(Contains(message, concat("rank ", rank, " (")));
    EXPECT_TRUE(Lacks(message, "ranks ")) << "only rank 2 diverged";
    EXPECT_TRUE(Contains(message, "--check-consistency"));
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected a ReplicaDivergenceError, got: " << error.what();
  }
}

TEST(ReliabilityConsistency, DivergedReplicaIsNamed) {
  for (const std::string method : {"dsync", "pipe"}) {
    SCOPED_TRACE(method);
    TrainConfig config = method_config(method, 3);
    config.reliability.check_consistency = 1;
    expect_divergence(config, "2", 5);
    config.reliability.check_consistency = 4;  // checks after iterations 3 and 7
    expect_divergence(config, "2", 7);
    // Without checks the run completes, with rank 2's weights differing.
    config.reliability.check_consistency = 0;
    const RunSummary summary = run_training(config, nudge_factory(2, 5, 1e-3f), small_data());
    EXPECT_EQ(summary.final_parameters[0], summary.final_parameters[1]);
    EXPECT_NE(summary.final_parameters[0], summary.final_parameters[2]);
  }
}

TEST(ReliabilityConsistency, ValidateRejectsMethodsWhoseReplicasDiffer) {
  for (const std::string method : {"asgd", "dcasgd", "odsgd"}) {
    SCOPED_TRACE(method);
    TrainConfig config = tiny_config(method, 2, 1);
    config.reliability.check_consistency = 1;
    try {
      validate_train_config(config);
      ADD_FAILURE() << "expected a UsageError";
    } catch (const UsageError& error) {
      EXPECT_TRUE(Contains(error.what(), "differ by design"));
      EXPECT_TRUE(Contains(error.what(), "--check-consistency"));
    }
    config.reliability.check_consistency = 0;
    EXPECT_NO_THROW(validate_train_config(config));
  }
  TrainConfig negative = tiny_config("dsync", 2);
  negative.reliability.check_consistency = -1;
  EXPECT_THROW(validate_train_config(negative), UsageError);
  TrainConfig huge = tiny_config("dsync", 2);
  huge.reliability.check_consistency = kMaxIterations + 1;
  EXPECT_THROW(validate_train_config(huge), UsageError);
  TrainConfig fine = tiny_config("pssync", 2, 1);
  fine.reliability.check_consistency = 3;
  EXPECT_NO_THROW(validate_train_config(fine));
}

TEST(ReliabilityNonFinite, ValidateRejectsAnUnknownPolicy) {
  for (const std::string policy : {"maybe", "", "Stop", "SKIP"}) {
    TrainConfig config = tiny_config("dsync", 2);
    config.reliability.on_nonfinite = policy;
    try {
      validate_train_config(config);
      ADD_FAILURE() << "expected a UsageError for '" << policy << "'";
    } catch (const UsageError& error) {
      EXPECT_TRUE(Contains(error.what(), "--on-nonfinite must be stop or skip"));
    }
  }
}

// --- 4. Fault injection -------------------------------------------------------------------------

TEST(ReliabilityFaultParse, ValidForms) {
  FaultInjection fault = parse_fault_injection("rank=1,iter=5,kind=crash");
  EXPECT_TRUE(fault.active());
  EXPECT_EQ(fault.rank, 1);
  EXPECT_EQ(fault.iteration, 5);
  EXPECT_EQ(fault.kind, FaultInjection::Kind::kCrash);

  fault = parse_fault_injection("kind=hang,iter=0,rank=3");
  EXPECT_EQ(fault.rank, 3);
  EXPECT_EQ(fault.iteration, 0);
  EXPECT_EQ(fault.kind, FaultInjection::Kind::kHang);

  fault = parse_fault_injection("iter=123456789,kind=crash,rank=0");
  EXPECT_TRUE(fault.active());
  EXPECT_EQ(fault.rank, 0);
  EXPECT_EQ(fault.iteration, 123456789);
  EXPECT_EQ(fault.kind, FaultInjection::Kind::kCrash);

  EXPECT_FALSE(FaultInjection{}.active());

  fault = parse_fault_injection("factor=2.5,kind=slow,iter=7,rank=1");
  EXPECT_TRUE(fault.active());
  EXPECT_TRUE(fault.slows_link());
  EXPECT_EQ(fault.rank, 1);
  EXPECT_EQ(fault.iteration, 7);
  EXPECT_DOUBLE_EQ(fault.factor, 2.5);
  EXPECT_EQ(describe(fault), "rank=1,iter=7,kind=slow,factor=2.5");
  EXPECT_EQ(describe(parse_fault_injection(describe(fault))), describe(fault));
  EXPECT_FALSE(parse_fault_injection("rank=0,iter=1,kind=hang").slows_link());
}

// kind=slow slows an emulated link: a run without an emulated bandwidth is refused before it starts.
TEST(ReliabilityFaultParse, SlowLinkNeedsAnEmulatedBandwidth) {
  TrainConfig config = method_config("dsync", 2);
  config.reliability.fault = parse_fault_injection("rank=1,iter=1,kind=slow,factor=4");
  try {
    run_training(config, softmax_factory(), small_data());
    ADD_FAILURE() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_TRUE(Contains(error.what(), "kind=slow slows worker 1's emulated link: it needs --net with a bandwidth"))
        << error.what();
  }
  // With one, the run goes on: a slower link changes no weight.
  config.network = parse_network_spec("bw=1Gbit");
  config.keep_parameters = true;
  const RunSummary slowed = run_training(config, softmax_factory(), small_data());
  config.reliability.fault = FaultInjection{};
  const RunSummary plain = run_training(config, softmax_factory(), small_data());
  ASSERT_EQ(slowed.final_parameters.size(), 2u);
  EXPECT_EQ(slowed.final_parameters, plain.final_parameters);
}

TEST(ReliabilityFaultParse, ErrorsNameTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "expected key=value"},
      {"rank=1", "'iter' is missing"},
      {"rank=1,iter=2", "'kind' is missing"},
      {"iter=2,kind=crash", "'rank' is missing"},
      {"rank=1,iter=2,kind=crash,when=now", "unknown key 'when'"},
      {"rank=1,iter=2,kind=crash,rank=2", "'rank' given twice"},
      {"rank=1,iter=2,iter=3,kind=crash", "'iter' given twice"},
      {"rank=1,iter=2,kind=explode", "kind must be crash, hang or slow"},
      {"rank=1,iter=2,kind=", "kind must be crash, hang or slow"},
      {"rank=1,iter=2,kind=Crash", "kind must be crash, hang or slow"},
      {"rank=1,iter=2,kind=slow", "kind=slow needs factor=F"},
      {"rank=1,iter=2,kind=crash,factor=4", "factor applies to kind=slow only"},
      {"rank=1,iter=2,kind=slow,factor=4,at=allreduce", "kind=slow takes no at="},
      {"rank=1,iter=2,kind=slow,factor=0.5", "factor must be a number in [1, 1e6], got '0.5'"},
      {"rank=1,iter=2,kind=slow,factor=4x", "factor must be a number in [1, 1e6], got '4x'"},
      {"rank=1,iter=2,kind=slow,factor=", "factor must be a number in [1, 1e6], got ''"},
      {"rank=1,iter=2,kind=slow,factor=nan", "factor must be a number in [1, 1e6]"},
      {"rank=-1,iter=2,kind=crash", "rank must be an integer >= 0"},
      {"rank=one,iter=2,kind=crash", "rank must be an integer >= 0"},
      {"rank=,iter=2,kind=crash", "rank must be an integer >= 0"},
      {"rank=1x,iter=2,kind=crash", "rank must be an integer >= 0"},
      {"rank=99999999999,iter=2,kind=crash", "rank must be an integer >= 0"},
      {"rank=1,iter=-5,kind=crash", "iter must be an integer >= 0"},
      {"rank=1,iter=2.5,kind=crash", "iter must be an integer >= 0"},
      {"rank=1,iter=,kind=crash", "iter must be an integer >= 0"},
      {"rank=1,iter=2,kind=crash,", "expected key=value"},
      {",rank=1,iter=2,kind=crash", "expected key=value"},
      {"rank=1;iter=2;kind=crash", "rank must be an integer >= 0"},
      {"rank 1", "expected key=value"},
  };
  for (const auto& [text, fragment] : cases) {
    SCOPED_TRACE(text);
    try {
      parse_fault_injection(text);
      ADD_FAILURE() << "expected a UsageError";
    } catch (const UsageError& error) {
      EXPECT_TRUE(Contains(error.what(), "--inject-fault"));
      EXPECT_TRUE(Contains(error.what(), fragment));
    }
  }
}

TEST(ReliabilityFaultParse, RunRejectsFaultsOutsideTheRun) {
  TrainConfig config = method_config("dsync", 3);
  config.reliability.fault = parse_fault_injection("rank=3,iter=1,kind=crash");
  try {
    run_training(config, softmax_factory(), small_data());
    ADD_FAILURE() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_TRUE(Contains(error.what(), "--inject-fault"));
    EXPECT_TRUE(Contains(error.what(), "is not a worker"));
  }
  config.reliability.fault = parse_fault_injection("rank=2,iter=25,kind=crash");  // iterations 0..24
  try {
    run_training(config, softmax_factory(), small_data());
    ADD_FAILURE() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_TRUE(Contains(error.what(), "--inject-fault"));
    EXPECT_TRUE(Contains(error.what(), "past the run"));
  }
  // pssync: a server rank is not a worker either.
  TrainConfig ps = method_config("pssync", 2);
  ps.reliability.fault = parse_fault_injection("rank=2,iter=1,kind=hang");
  EXPECT_THROW(run_training(ps, softmax_factory(), small_data()), UsageError);
}

class ReliabilityFault : public ::testing::TestWithParam<std::string> {};

TEST_P(ReliabilityFault, OtherWorkersStopWithACommError) {
  for (const auto kind : {FaultInjection::Kind::kCrash, FaultInjection::Kind::kHang}) {
    const bool crash = kind == FaultInjection::Kind::kCrash;
    SCOPED_TRACE(crash ? "crash" : "hang");
    TrainConfig config = method_config(GetParam(), 3);
    set_timeout(config, std::chrono::seconds(1));
    config.reliability.fault.rank = 1;
    config.reliability.fault.iteration = 5;
    config.reliability.fault.kind = kind;
    try {
      run_training(config, softmax_factory(), small_data());
      ADD_FAILURE() << "expected a CommError";
    } catch (const CommError& error) {
      const std::string message = error.what();
      // The one line says what happened: a wait timed out, or a peer failed.
      EXPECT_TRUE(message.find("timed out") != std::string::npos || message.find("failed") != std::string::npos)
          << "neither 'timed out' nor 'failed' in: " << message;
      if (dynamic_cast<const CommTimeoutError*>(&error) != nullptr) {
        // ... and, for a timeout, where the worker was (run_worker: " (worker R at iteration T)").
        EXPECT_TRUE(Contains(message, " at iteration ")) << "the timeout does not name the iteration";
      }
    } catch (const std::exception& error) {
      ADD_FAILURE() << "expected a CommError, got: " << error.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ReliabilityMethods, ReliabilityFault, ::testing::Values("dsync", "pipe", "wfbp", "pssync", "odsgd"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// --- 5. Faults in the middle of an operation (at=allreduce, at=push) ---------------------------------

TEST(ReliabilityMidOperationFault, ParseAndValidate) {
  FaultInjection fault = parse_fault_injection("rank=1,iter=2,kind=crash,at=allreduce");
  EXPECT_EQ(fault.point, FaultInjection::Point::kAllreduce);
  EXPECT_FALSE(fault.during_checkpoint());
  EXPECT_TRUE(fault.in_operation());
  fault = parse_fault_injection("at=push,rank=1,iter=2,kind=hang");
  EXPECT_EQ(fault.point, FaultInjection::Point::kPush);
  fault = parse_fault_injection("rank=1,iter=2,kind=hang,at=checkpoint");
  EXPECT_TRUE(fault.during_checkpoint());
  EXPECT_FALSE(fault.in_operation());
  EXPECT_THROW(parse_fault_injection("rank=1,iter=2,kind=hang,at=backward"), UsageError);

  TrainConfig dsync = method_config("dsync", 3);
  dsync.reliability.fault = parse_fault_injection("rank=1,iter=2,kind=crash,at=push");
  try {
    run_training(dsync, softmax_factory(), small_data());
    ADD_FAILURE() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_TRUE(Contains(error.what(), "at=push"));
  }
  TrainConfig pssync = method_config("pssync", 2);
  pssync.reliability.fault = parse_fault_injection("rank=1,iter=2,kind=crash,at=allreduce");
  try {
    run_training(pssync, softmax_factory(), small_data());
    ADD_FAILURE() << "expected a UsageError";
  } catch (const UsageError& error) {
    EXPECT_TRUE(Contains(error.what(), "at=allreduce"));
  }
}

// The decorator forwards everything until armed, then fails on exactly the promised send.
TEST(ReliabilityMidOperationFault, DecoratorFiresOnTheIntendedSend) {
  LocalFabric fabric(2);
  int fired = 0;
  FaultInjectingTransport faulty(fabric.endpoint(0), FaultInjection::Point::kAllreduce, 2, [&] {
    ++fired;
    throw InjectedFault{};
  });
  const float value[1] = {1.0f};
  const auto bytes = std::as_bytes(std::span<const float>(value));
  float got[1] = {0};
  auto exchange = [&](Tag tag) {
    Request send = faulty.send(1, tag, bytes, "test");
    Request recv = fabric.endpoint(1).recv(0, tag, std::as_writable_bytes(std::span<float>(got)), "test");
    recv.wait(std::chrono::seconds(5));
    send.wait(std::chrono::seconds(5));
  };
  const Tag iteration4 = step_tag(collective_tag(Channel::kGradients, 4), 0, 0);
  const Tag iteration5 = step_tag(collective_tag(Channel::kGradients, 5), 0, 0);
  const Tag iteration5_next = step_tag(collective_tag(Channel::kGradients, 5), 1, 0);
  exchange(iteration5);  // not armed: forwarded
  faulty.arm(5);
  exchange(iteration4);  // an earlier allreduce still in flight: not counted
  exchange(step_tag(collective_tag(Channel::kControl, 5), 0, 0));  // not a gradient allreduce
  exchange(iteration5);  // the first message of iteration 5's allreduce goes out
  EXPECT_EQ(fired, 0);
  EXPECT_THROW(faulty.send(1, iteration5_next, bytes, "test"), InjectedFault);
  EXPECT_EQ(fired, 1);
  EXPECT_TRUE(faulty.fired());
  exchange(iteration5_next);  // fires once only

  // Push: only push requests (kind 1) of version >= the minimum count; with fire_on 1 the first fails.
  int push_fired = 0;
  FaultInjectingTransport pushes(fabric.endpoint(0), FaultInjection::Point::kPush, 1, [&] {
    ++push_fired;
    throw InjectedFault{};
  });
  pushes.arm(3);
  std::uint64_t pull[2] = {2, 3}, old_push[2] = {1, 2}, push[2] = {1, 3};
  const Tag request = step_tag(collective_tag(Channel::kParameterServer, 7), 0, 0);
  std::uint64_t received[2];
  for (auto* header : {pull, old_push}) {
    Request send = pushes.send(1, request, std::as_bytes(std::span<const std::uint64_t>(header, 2)), "ps");
    Request recv = fabric.endpoint(1).recv(0, request, std::as_writable_bytes(std::span<std::uint64_t>(received)), "ps");
    recv.wait(std::chrono::seconds(5));
    send.wait(std::chrono::seconds(5));
  }
  EXPECT_EQ(push_fired, 0);
  EXPECT_THROW(pushes.send(1, request, std::as_bytes(std::span<const std::uint64_t>(push)), "ps push"), InjectedFault);
  EXPECT_EQ(push_fired, 1);
}

struct MidOperationCase {
  std::string method;
  FaultInjection::Point point;
  std::int64_t iteration;
  int servers = 0;
  std::int64_t warmup = 0;
  std::string name;
  // How far past the faulty iteration a survivor can run before it blocks: its pipeline depth (pipe
  // and sapipe K = 2, odsgd's pipelined stage 1, the synchronous methods 0).
  std::int64_t ahead = 0;
  // Tag sequences per iteration when a gradient tag tells the iteration (dsync and pipe: t, the
  // layer-wise wfbp: t * layers + bucket; the softmax model has 2 layers); 0 when it does not
  // (sapipe, the parameter-server request sequences).
  std::uint64_t sequences_per_iteration = 0;
};

void PrintTo(const MidOperationCase& c, std::ostream* out) { *out << c.name; }

// A survivor's line, as the transports (comm/local_transport.cpp, "OP: send to|recv from rank P (tag
// CHANNEL:SEQ step S segment G) on rank R timed out after X s") and then run_worker (" (worker R at
// iteration T)") or a parameter server (ps/parameter_server.cpp: " (parameter server shard S on
// rank R, waiting for the push of version V, i.e. at iteration V)") write it.
struct TimeoutLine {
  std::string operation;
  int peer = -1;
  std::string channel;
  std::uint64_t sequence = 0;
  int reporter = -1;       // "on rank R"
  std::string seconds;     // "timed out after X s"
  bool server = false;     // a parameter server's line (else a worker's)
  int where = -1;          // the worker R or the server's rank R of the parenthesis
  int shard = -1;          // a server's shard
  std::int64_t iteration = -1;
};

std::optional<TimeoutLine> parse_timeout_line(const std::string& message) {
  static const std::regex worker(
      R"(^([a-z -]+): (?:send to|recv from) rank (\d+) \(tag ([a-z]+):(\d+) step \d+ segment \d+\) on rank (\d+) )"
      R"(timed out after ([0-9.]+) s \(worker (\d+) at iteration (\d+)\)$)");
  static const std::regex server(
      R"(^(ps serve): recv from rank (\d+) \(tag ([a-z]+):(\d+) step \d+ segment \d+\) on rank (\d+) )"
      R"(timed out after ([0-9.]+) s \(parameter server shard (\d+) on rank (\d+), waiting for the push of )"
      R"(version (\d+), i\.e\. at iteration \9\)$)");  // \9: the version again
  std::smatch m;
  TimeoutLine line;
  if (std::regex_match(message, m, worker)) {
    line.where = std::stoi(m[7]);
    line.iteration = std::stoll(m[8]);
  } else if (std::regex_match(message, m, server)) {
    line.server = true;
    line.shard = std::stoi(m[7]);
    line.where = std::stoi(m[8]);
    line.iteration = std::stoll(m[9]);
  } else {
    return std::nullopt;
  }
  line.operation = m[1];
  line.peer = std::stoi(m[2]);
  line.channel = m[3];
  line.sequence = std::stoull(m[4]);
  line.reporter = std::stoi(m[5]);
  line.seconds = m[6];
  return line;
}

// Runs `c` with `workers` workers, worker 1 crashing or hanging inside its operation, and returns
// the one line the run stopped with, checked for what every such line must say: a CommTimeoutError
// (the survivors learn of a silent peer by their timeouts, nothing else) whose line names the
// peer waited on (a rank of the run other than the reporter, equal to CommTimeoutError::peer()),
// the operation and tag (a gradient allreduce, or the parameter-server protocol), the 1 s timeout,
// and where the reporter was: a surviving worker and the iteration it had reached (from the faulty
// iteration to its pipeline depth past it), or a server and the version it waited for (the faulty
// iteration's push, or the next one on a shard that had it). Empty if the run did not stop so.
std::optional<TimeoutLine> run_mid_operation_fault(const MidOperationCase& c, FaultInjection::Kind kind, int workers) {
  TrainConfig config = method_config(c.method, workers);
  OptionValues options;
  if (c.servers > 0) options.set("--servers", std::to_string(c.servers));
  if (c.warmup > 0) options.set("--warmup-iters", std::to_string(c.warmup));
  config.method = reselect(config.method, options, std::nullopt, std::chrono::seconds(1));
  config.reliability.fault.rank = 1;
  config.reliability.fault.iteration = c.iteration;
  config.reliability.fault.kind = kind;
  config.reliability.fault.point = c.point;
  const int ranks = workers + c.servers;
  const bool push = c.point == FaultInjection::Point::kPush;
  try {
    run_training(config, softmax_factory(), small_data());
    ADD_FAILURE() << "expected a CommTimeoutError";
    return std::nullopt;
  } catch (const CommTimeoutError& error) {
    const std::string message = error.what();
    std::printf("[ midfault ] %s %s, %d workers: %s\n", c.name.c_str(),
                kind == FaultInjection::Kind::kCrash ? "crash" : "hang", workers, message.c_str());
    const std::optional<TimeoutLine> line = parse_timeout_line(message);
    if (!line) {
      ADD_FAILURE() << "not one line naming peer, operation, tag and iteration: '" << message << "'";
      return std::nullopt;
    }
    SCOPED_TRACE(message);
    // The peer: a rank of the run, not the reporter itself, the one CommTimeoutError::peer() gives.
    EXPECT_GE(line->peer, 0);
    EXPECT_LT(line->peer, ranks);
    EXPECT_NE(line->peer, line->reporter) << "a rank cannot wait on itself";
    EXPECT_EQ(error.peer(), line->peer);
    // The reporter: a survivor (the faulty worker 1 is silent), named alike in both places.
    EXPECT_GE(line->reporter, 0);
    EXPECT_LT(line->reporter, ranks);
    EXPECT_NE(line->reporter, 1) << "the faulty worker reported";
    EXPECT_EQ(line->where, line->reporter);
    EXPECT_EQ(line->seconds, "1");
    // The operation and the tag.
    if (push) {
      EXPECT_EQ(line->channel, "ps");
      EXPECT_EQ(line->operation.rfind("ps ", 0), 0u) << "not a parameter-server operation";
    } else {
      EXPECT_EQ(line->channel, "gradients");
      EXPECT_TRUE(line->operation.ends_with(" allreduce")) << "not an allreduce";
      EXPECT_FALSE(line->server);
    }
    if (c.sequences_per_iteration > 0) {
      EXPECT_EQ(line->sequence / c.sequences_per_iteration, static_cast<std::uint64_t>(c.iteration))
          << "the tag is not of the faulty iteration's allreduce";
    }
    // Where the reporter was.
    if (line->server) {
      EXPECT_GE(line->reporter, workers);
      EXPECT_EQ(line->shard, line->reporter - workers);
      // The version it waited for: the faulty iteration's push; with two servers, shard 0 had that
      // push (rank 1 died sending to shard 1) and may have moved on to wait for the next one.
      EXPECT_GE(line->iteration, c.iteration) << "the version the server waited for";
      EXPECT_LE(line->iteration, c.iteration + (c.servers >= 2 ? 1 : 0)) << "the version the server waited for";
      // For the faulty iteration's push it waits on rank 1 alone. For the next one it waits on every
      // worker (the survivors are blocked behind the other shard, which waits on rank 1), and
      // check_idle_workers names the lowest rank whose wait ran out: any worker.
      if (line->iteration == c.iteration) {
        EXPECT_EQ(line->peer, 1) << "a server waits on the faulty worker's push";
      } else {
        EXPECT_LT(line->peer, workers) << "a server waits on a worker's push";
      }
    } else {
      EXPECT_LT(line->reporter, workers);
      EXPECT_GE(line->iteration, c.iteration);
      EXPECT_LE(line->iteration, c.iteration + c.ahead);
    }
    return line;
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected a CommTimeoutError, got: " << error.what();
    return std::nullopt;
  }
}

class ReliabilityMidOperation : public ::testing::TestWithParam<MidOperationCase> {};

// With three workers (and the servers), the peer a survivor's line names is the faulty rank 1 in
// most runs, but not always: a survivor blocked behind another survivor that is stuck on rank 1 (the
// ring's next rank, or the server waiting for rank 1's push) may time out first, and then its line
// names that survivor (run_training prefers a timeout on a silent peer when both fire). So this
// checks what every line guarantees; ReliabilityMidOperationTwoWorkers checks the faulty rank.
TEST_P(ReliabilityMidOperation, SurvivorsNameAPeerTheOperationTheTagAndTheIteration) {
  const MidOperationCase& c = GetParam();
  for (const auto kind : {FaultInjection::Kind::kCrash, FaultInjection::Kind::kHang}) {
    const bool crash = kind == FaultInjection::Kind::kCrash;
    SCOPED_TRACE(crash ? "crash" : "hang");
    const auto start = std::chrono::steady_clock::now();
    run_mid_operation_fault(c, kind, 3);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Printed, not asserted (the machine is noisy): a hang is caught by ctest's per-test timeout.
    std::printf("[ midfault ] %s %s: survivors stopped after %.2f s\n", c.name.c_str(), crash ? "crash" : "hang",
                seconds);
  }
}

const MidOperationCase kAllreduceCases[] = {
    {"dsync", FaultInjection::Point::kAllreduce, 5, 0, 0, "dsync_allreduce", 0, 1},
    {"pipe", FaultInjection::Point::kAllreduce, 5, 0, 0, "pipe_allreduce", 2, 1},
    {"wfbp", FaultInjection::Point::kAllreduce, 5, 0, 0, "wfbp_allreduce", 0, 2},
    {"sapipe", FaultInjection::Point::kAllreduce, 15, 0, 0, "sapipe_allreduce", 2, 0},
};

std::string mid_operation_name(const ::testing::TestParamInfo<MidOperationCase>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    ReliabilityMidOperationMethods, ReliabilityMidOperation,
    ::testing::Values(kAllreduceCases[0], kAllreduceCases[1], kAllreduceCases[2], kAllreduceCases[3],
                      MidOperationCase{"pssync", FaultInjection::Point::kPush, 5, 1, 0, "pssync_push_1server"},
                      MidOperationCase{"pssync", FaultInjection::Point::kPush, 5, 2, 0, "pssync_push_2servers"},
                      MidOperationCase{"odsgd", FaultInjection::Point::kPush, 5, 1, 10, "odsgd_warmup_push_1server"},
                      MidOperationCase{"odsgd", FaultInjection::Point::kPush, 5, 2, 10, "odsgd_warmup_push_2servers"},
                      MidOperationCase{"odsgd", FaultInjection::Point::kPush, 15, 1, 10, "odsgd_comm_push_1server", 1},
                      MidOperationCase{"odsgd", FaultInjection::Point::kPush, 15, 2, 10, "odsgd_comm_push_2servers", 1}),
    mid_operation_name);

// With two workers and no servers the survivor's every wait is on rank 1: its line must name the
// faulty rank, deterministically.
class ReliabilityMidOperationTwoWorkers : public ::testing::TestWithParam<MidOperationCase> {};

TEST_P(ReliabilityMidOperationTwoWorkers, TheSurvivorNamesTheFaultyRank) {
  const MidOperationCase& c = GetParam();
  for (const auto kind : {FaultInjection::Kind::kCrash, FaultInjection::Kind::kHang}) {
    SCOPED_TRACE(kind == FaultInjection::Kind::kCrash ? "crash" : "hang");
    const std::optional<TimeoutLine> line = run_mid_operation_fault(c, kind, 2);
    if (!line) continue;  // failed above
    EXPECT_EQ(line->peer, 1) << "the line does not name the faulty rank";
    EXPECT_EQ(line->reporter, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(ReliabilityMidOperationMethods, ReliabilityMidOperationTwoWorkers,
                         ::testing::ValuesIn(kAllreduceCases), mid_operation_name);

}  // namespace
}  // namespace pipesgd
