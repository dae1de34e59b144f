// Runs shorter than their method's planning, profiling or warm-up (report/short_run.h): each
// method's deferred phase starts where its schedule says (worked out by hand from the options),
// the warning and report texts say so, and the reports of such runs say what ran instead of a plan
// that never took effect.
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pipesgd/algo/dsync/layer_wise_report.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/algo/sapipe/sapipe_report.h"
#include "pipesgd/report/report.h"
#include "pipesgd/report/short_run.h"
#include "resegmented_model.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

// ---------------------------------------------------------------------------------------------
// 1. Each method's deferred phase, from its options.

struct PhaseCase {
  std::string name;  // the test's name
  std::string spec;
  OptionValues options;
  std::int64_t expected_start;  // -1: no deferred phase
};

// gtest prints a failing case by this.
void PrintTo(const PhaseCase& c, std::ostream* out) {
  *out << c.name << " (" << c.spec;
  for (const auto& [flag, value] : c.options.all()) *out << " " << flag << " " << value;
  *out << ", deferred phase at " << c.expected_start << ")";
}

// The starts, by hand: a layer-wise plan takes effect after kProfileWarmupIterations (8) start-up
// and P profiled iterations (8 + P); a warm-up of W iterations ends at W; sapipe pipelines at
// max(W, 8 + P) when k is auto or its plan needs measured times (optimal, mgwfbp), else at W; auto's
// choice takes over after kAutoProfileWarmupIterations (3) start-up and P profiled iterations.
std::vector<PhaseCase> phase_cases() {
  return {
      {"dsync", "dsync", {}, -1},
      {"nocomm", "nocomm", {}, -1},
      {"dsync_wfbp_default_profile", "dsync+wfbp", {}, 18},
      {"mgwfbp_profile_4", "mgwfbp", {{"--profile-iters", "4"}}, 12},
      {"synceasgd_profile_1", "synceasgd", {{"--profile-iters", "1"}}, 9},
      {"wfbp", "wfbp", {}, 18},
      {"dsync_optimal", "dsync+optimal", {}, 18},
      {"pipe", "pipe", {}, -1},
      {"pipe_warmup_7", "pipe", {{"--warmup-iters", "7"}}, 7},
      {"pssync", "pssync", {}, -1},
      {"asgd", "asgd", {}, -1},
      {"dcasgd", "dcasgd", {}, -1},
      {"odsgd_default_warmup", "odsgd", {}, 200},
      {"odsgd_warmup_0", "odsgd", {{"--warmup-iters", "0"}}, -1},
      {"sapipe_auto", "sapipe", {}, 18},
      {"sapipe_auto_wfbp_profile_3", "sapipe", {{"--buckets", "wfbp"}, {"--profile-iters", "3"}}, 11},
      {"sapipe_k0_optimal", "sapipe", {{"--stale-layers", "0"}}, 18},
      {"sapipe_k1_wfbp", "sapipe", {{"--stale-layers", "1"}, {"--buckets", "wfbp"}}, -1},
      {"sapipe_k1_wfbp_warmup_5", "sapipe", {{"--stale-layers", "1"}, {"--buckets", "wfbp"}, {"--warmup-iters", "5"}}, 5},
      {"sapipe_k2_mgwfbp_warmup_30", "sapipe",
       {{"--stale-layers", "2"}, {"--buckets", "mgwfbp"}, {"--profile-iters", "3"}, {"--warmup-iters", "30"}}, 30},
      {"auto", "auto", {}, 13},
      {"auto_any_profile_4", "auto:any", {{"--profile-iters", "4"}}, 7},
  };
}

class DeferredPhases : public testing::TestWithParam<PhaseCase> {};

TEST_P(DeferredPhases, StartWhereTheScheduleSays) {
  const PhaseCase& c = GetParam();
  const MethodSelection method = select_for_test(c.spec, c.options);
  const MethodOptions& options = *method.options;
  const std::int64_t warmup = options.warmup().iterations;  // no --warmup-epochs here
  const std::optional<DeferredPhase> phase = options.deferred_phase(warmup);
  if (c.expected_start < 0) {
    EXPECT_FALSE(phase.has_value()) << phase->event;
    EXPECT_EQ(options.steady_state_start(warmup), warmup);
    EXPECT_FALSE(unreached_phase(options, warmup, 1).has_value());
    return;
  }
  ASSERT_TRUE(phase.has_value());
  EXPECT_EQ(phase->start, c.expected_start);
  EXPECT_EQ(options.steady_state_start(warmup), c.expected_start);
  EXPECT_FALSE(phase->event.empty());
  EXPECT_FALSE(phase->reason.empty());
  EXPECT_FALSE(phase->before.empty());
  // A run of `start` iterations (0 .. start - 1) never reaches it; one more iteration does.
  EXPECT_TRUE(unreached_phase(options, warmup, 1).has_value());
  EXPECT_TRUE(unreached_phase(options, warmup, c.expected_start).has_value());
  EXPECT_FALSE(unreached_phase(options, warmup, c.expected_start + 1).has_value());
}

INSTANTIATE_TEST_SUITE_P(Methods, DeferredPhases, testing::ValuesIn(phase_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(DeferredPhases, CasesCoverEveryMethod) {
  std::set<std::string> covered;
  for (const PhaseCase& c : phase_cases()) covered.insert(method_of_spec(c.spec)->name);
  for (const std::string& name : method_names()) EXPECT_TRUE(covered.count(name)) << name;
}

// BucketedDSync runs one bucket until the second half of its first profiling cycle, which runs one
// bucket per layer: iterations [8 + P - P/2, 8 + P).
TEST(DeferredPhases, LayerWiseSaysWhichIterationsRunWhichBuckets) {
  auto before = [](const std::string& profile) {
    return select_for_test("mgwfbp", {{"--profile-iters", profile}}).options->deferred_phase(0)->before;
  };
  EXPECT_EQ(before("10"), "until then it allreduces the whole gradient as one bucket (iterations 0-12), then one "
                          "bucket per layer to profile (iterations 13-17)");
  EXPECT_EQ(before("3"), "until then it allreduces the whole gradient as one bucket (iterations 0-9), then one "
                         "bucket per layer to profile (iteration 10)");
  EXPECT_EQ(before("1"), "until then it allreduces the whole gradient as one bucket (iterations 0-8)");
  const DeferredPhase phase = *select_for_test("mgwfbp").options->deferred_phase(0);
  EXPECT_EQ(phase.event, "the mgwfbp bucket plan takes effect");
  EXPECT_EQ(phase.reason, "it is made from 10 profiled iterations after 8 start-up ones");
}

TEST(DeferredPhases, WarmUpsSayTheirLength) {
  const DeferredPhase pipe = *select_for_test("pipe", {{"--warmup-iters", "7"}}).options->deferred_phase(7);
  EXPECT_EQ(pipe.event, "Pipe-SGD with K = 2 starts");
  EXPECT_EQ(pipe.reason, "after its warm-up of 7 iterations, set by --warmup-epochs and --warmup-iters");
  // sapipe: the later of the warm-up and the profiling.
  const MethodSelection sapipe = select_for_test("sapipe", {{"--profile-iters", "3"}});
  EXPECT_EQ(sapipe.options->deferred_phase(0)->reason,
            "after 8 start-up and 3 profiling iterations, which choose k and the synchronous layers' optimal plan");
  EXPECT_EQ(sapipe.options->deferred_phase(40)->reason,
            "after its warm-up of 40 iterations, set by --warmup-epochs and --warmup-iters");
}

// ---------------------------------------------------------------------------------------------
// 2. The texts.

TEST(ShortRunText, WarningAndDescription) {
  const DeferredPhase phase{18, "E happens", "because R", "until then B"};
  EXPECT_EQ(describe_short_run(phase, 5), "the run's 5 iterations end before E happens at iteration 18 (because R); "
                                          "until then B");
  EXPECT_EQ(describe_short_run(phase, 1), "the run's 1 iteration ends before E happens at iteration 18 (because R); "
                                          "until then B");
  EXPECT_EQ(short_run_warning(phase, 5),
            "pipesgd: warning: the run's 5 iterations end before E happens at iteration 18 (because R); until then B; "
            "a run of 19 or more iterations reaches it\n");
  const nlohmann::json json = unreached_phase_json(phase);
  EXPECT_EQ(json["start_iteration"], 18);
  EXPECT_EQ(json["event"], "E happens");
  EXPECT_EQ(json["reason"], "because R");
  EXPECT_EQ(json["before"], "until then B");
  EXPECT_TRUE(unreached_phase_json(std::nullopt).is_null());
}

// ---------------------------------------------------------------------------------------------
// 3. What short runs report.

constexpr std::size_t kPieces = 7;  // the softmax model as 14 layers

RunSummary run_layer_wise(const std::string& spec, std::int64_t iterations) {
  TrainConfig config = tiny_config(spec, 2);
  config.iterations = iterations;
  config.warn_short_run = false;
  return run_training(config, resegmented_softmax_factory(kPieces), small_data());
}

const LayerWiseReport& layer_wise(const RunSummary& summary) {
  const auto* report = dynamic_cast<const LayerWiseReport*>(summary.figures.report.get());
  if (report == nullptr) throw std::logic_error("not a layer-wise run");
  return *report;
}

TEST(ShortRunReport, LayerWiseBeforeThePlanReportsTheSingleBucketItRan) {
  const RunSummary summary = run_layer_wise("mgwfbp", 5);  // the plan takes effect at 18
  const LayerWiseReport& report = layer_wise(summary);
  EXPECT_FALSE(report.planned);
  EXPECT_EQ(report.bucket_plan(), "single: 1 bucket: [13..0]");
  EXPECT_EQ(report.allreduce_calls(), 1u);
  EXPECT_EQ(report.plan_text(),
            "mgwfbp: not reached (it takes effect at iteration 18); the last iteration ran single: 1 bucket: [13..0]");
  ASSERT_TRUE(summary.unreached_phase.has_value());
  EXPECT_EQ(summary.unreached_phase->start, 18);
  // No plan, no plan prediction: D-Sync's Eq. 2.
  EXPECT_EQ(summary.figures.predicted_iteration, summary.timing.predicted_sync_iteration);
  const nlohmann::json json = summary_to_json(summary);
  EXPECT_EQ(json["bucket_plan"], "single: 1 bucket: [13..0]");
  EXPECT_EQ(json["planned_bucket_plan"], "mgwfbp");
  EXPECT_EQ(json["bucket_plan_reached"], false);
  EXPECT_EQ(json["bucket_plan_start_iteration"], 18);
  EXPECT_TRUE(json["predicted_non_overlapped_comm_s"].is_null());
  EXPECT_EQ(json["unreached_phase"]["start_iteration"], 18);
  std::ostringstream text;
  print_run_report(text, summary);
  EXPECT_NE(text.str().find("Short run: the run's 5 iterations end before the mgwfbp bucket plan takes effect at "
                            "iteration 18"),
            std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("plan mgwfbp: not reached"), std::string::npos) << text.str();
}

TEST(ShortRunReport, LayerWiseEndingInTheProfilingReportsOneBucketPerLayer) {
  // P = 10: iterations 13-17 profile with one bucket per layer; a run of 15 ends at 14.
  const RunSummary summary = run_layer_wise("mgwfbp", 15);
  const LayerWiseReport& report = layer_wise(summary);
  EXPECT_FALSE(report.planned);
  EXPECT_EQ(report.bucket_plan(), "wfbp: 14 buckets: [13] [12] [11] [10] [9] [8] [7] [6] [5] [4] [3] [2] [1] [0]");
  EXPECT_EQ(report.allreduce_calls(), 14u);
}

TEST(ShortRunReport, LayerWiseReachingThePlanReportsIt) {
  const RunSummary summary = run_layer_wise("wfbp", 19);  // the plan runs in iteration 18
  const LayerWiseReport& report = layer_wise(summary);
  EXPECT_TRUE(report.planned);
  EXPECT_EQ(report.plan_text(), report.bucket_plan());
  EXPECT_EQ(report.bucket_plan().rfind("wfbp: 14 buckets", 0), 0u) << report.bucket_plan();
  EXPECT_FALSE(summary.unreached_phase.has_value());
  const nlohmann::json json = summary_to_json(summary);
  EXPECT_EQ(json["bucket_plan_reached"], true);
  EXPECT_TRUE(json["unreached_phase"].is_null());
  EXPECT_TRUE(json["predicted_non_overlapped_comm_s"].is_number());
}

RunSummary run_tiny(const std::string& spec, std::int64_t iterations, OptionValues options = {}) {
  TrainConfig config = tiny_config(spec, 2, 0, std::move(options));
  config.iterations = iterations;
  config.warn_short_run = false;
  return run_training(config, softmax_factory(), small_data());
}

const SapipeFacts& sapipe_facts(const RunSummary& summary) {
  const auto* report = dynamic_cast<const SapipeReport*>(summary.figures.report.get());
  if (report == nullptr) throw std::logic_error("not a sapipe run");
  return report->facts;
}

TEST(ShortRunReport, SapipeBeforeItsPipelineReportsSynchronousIterations) {
  // k = 1 given, but the optimal plan needs the profile: pipelining would start at 8 + 10 = 18.
  const RunSummary summary = run_tiny("sapipe", 3, {{"--stale-layers", "1"}});
  const SapipeFacts& facts = sapipe_facts(summary);
  EXPECT_FALSE(facts.pipelined);
  EXPECT_EQ(facts.pipeline_start, 18);
  EXPECT_EQ(facts.stale_layers, 0u);
  EXPECT_EQ(facts.stale_fraction, 0.0);
  EXPECT_EQ(summary.figures.report->allreduce_calls(), 1u);
  EXPECT_EQ(summary.figures.report->bucket_plan(),
            "(never pipelined: the whole gradient in one allreduce after backward)");
  EXPECT_EQ(describe_sapipe(facts),
            "never pipelined (it would start at iteration 18): every iteration ran synchronously, the whole gradient "
            "in one allreduce after backward, no layer stale (compensation wp3 never applied)");  // the default
  // Never pipelined: D-Sync's Eq. 2, not Pipe-SGD's Eq. 4.
  EXPECT_EQ(summary.figures.predicted_iteration, summary.timing.predicted_sync_iteration);
  const nlohmann::json json = summary_to_json(summary);
  EXPECT_EQ(json["sapipe"]["pipelined"], false);
  EXPECT_EQ(json["sapipe"]["stale_layers"], 0);
  EXPECT_EQ(json["unreached_phase"]["start_iteration"], 18);
}

TEST(ShortRunReport, SapipeWithoutProfileIsPipelinedFromTheStart) {
  const RunSummary summary = run_tiny("sapipe+wfbp", 3, {{"--stale-layers", "1"}});
  const SapipeFacts& facts = sapipe_facts(summary);
  EXPECT_TRUE(facts.pipelined);
  EXPECT_EQ(facts.pipeline_start, 0);
  EXPECT_EQ(facts.stale_layers, 1u);
  EXPECT_FALSE(summary.unreached_phase.has_value());
  EXPECT_EQ(summary.figures.predicted_iteration, summary.timing.predicted_pipe_iteration);
}

TEST(ShortRunReport, WarmUpLongerThanTheRunIsReported) {
  const RunSummary pipe = run_tiny("pipe", 5, {{"--warmup-iters", "10"}});
  ASSERT_TRUE(pipe.unreached_phase.has_value());
  EXPECT_EQ(pipe.unreached_phase->start, 10);
  EXPECT_EQ(pipe.figures.predicted_iteration, pipe.timing.predicted_sync_iteration);
  const RunSummary pipelined = run_tiny("pipe", 5, {{"--warmup-iters", "2"}});
  EXPECT_FALSE(pipelined.unreached_phase.has_value());
  EXPECT_EQ(pipelined.figures.predicted_iteration, pipelined.timing.predicted_pipe_iteration);
  TrainConfig odsgd = tiny_config("odsgd", 2, 1);
  odsgd.iterations = 5;
  odsgd.warn_short_run = false;
  const RunSummary warm = run_training(odsgd, softmax_factory(), small_data());
  ASSERT_TRUE(warm.unreached_phase.has_value());
  EXPECT_EQ(warm.unreached_phase->start, 200);
}

}  // namespace
}  // namespace pipesgd
