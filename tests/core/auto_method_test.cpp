// `--algo auto` (algo/auto/): a switch between methods loses no gradient and keeps the optimizer's
// state (the weights against the hand-computed phased sequence of tests/core/phase_oracle.h, for
// every ordered pair of the methods auto switches between, with momentum so that a lost momentum
// buffer shows); a commit anywhere resumes bit for bit; and the decision on synthetic profiles picks
// what the timing models say (tables of cases).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <mutex>
#include <set>
#include <thread>
#include <ostream>

#include <nlohmann/json.hpp>

#include "phase_oracle.h"
#include "pipesgd/algo/auto/auto_method.h"
#include "pipesgd/algo/planning.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "test_world.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

const SgdOptions kSgd{0.3f, 0.9f, 0.01f};

// The methods auto switches between, with their iteration dependency K (of their first
// stale_elements: SAPipe's stale layer, the softmax model's weight matrix).
struct Switchable {
  std::string spec;
  OptionValues flags;
  int k;
  std::string label;
  std::size_t stale_elements = SIZE_MAX;
};
// SAPipe with the weight matrix stale and the bias synchronous, no compensation (the oracle's rule;
// weight prediction is checked against SAPipe's own run below), a plan that needs no profile.
const OptionValues kSapipeOneStaleLayer = {{"--stale-layers", "1"}, {"--buckets", "wfbp"}, {"--compensation", "none"}};
const std::vector<Switchable>& switchable() {
  static const std::vector<Switchable> methods = {
      {"dsync", {}, 1, "dsync"},
      {"dsync+optimal", {}, 1, "dsync+optimal"},
      {"wfbp", {}, 1, "wfbp"},
      {"synceasgd", {}, 1, "synceasgd"},
      {"mgwfbp", {}, 1, "mgwfbp"},
      {"pipe", {{"--staleness-k", "2"}}, 2, "pipe K=2"},
      {"pipe", {{"--staleness-k", "3"}}, 3, "pipe K=3"},
      {"sapipe", kSapipeOneStaleLayer, 2, "sapipe+none k=1", kClasses * kFeatures},
  };
  return methods;
}

MethodSelection scheduled_auto(const std::vector<ScheduledMethod>& schedule, const SgdOptions& sgd = kSgd) {
  MethodSelection selection = select_for_test("auto", {}, sgd);
  auto options = std::make_shared<AutoOptions>(options_as<AutoOptions>(*selection.options));
  options->schedule = schedule;
  selection.options = options;
  return selection;
}

struct Observed {
  std::vector<std::vector<std::vector<float>>> weights_used;  // [rank][t]
  std::vector<std::vector<float>> final_weights;              // [rank]
  nlohmann::json phases;                                      // rank 0's summary.json auto.phases
};

// The softmax model without forward reports: SAPipe then applies its synchronous layers' updates
// at the start of the iteration, before the test reads the weights the iteration computes on.
class SoftmaxWithoutForwardReports final : public SoftmaxRegression {
 public:
  using SoftmaxRegression::SoftmaxRegression;
  bool reports_forward_progress() const override { return false; }
};

// Runs `selection` on `ranks` threads for `iterations`; with `commit_after` >= 0 every rank saves
// its method's state after that iteration, and a new model and method restored from it go on.
Observed run_auto(const MethodSelection& selection, int ranks, std::int64_t iterations, const SoftmaxBatches& data,
                  std::int64_t commit_after = -1) {
  Observed observed;
  observed.weights_used.assign(ranks, {});
  observed.final_weights.assign(ranks, {});
  run_ranks(ranks, [&](int rank, Transport& transport) {
    std::unique_ptr<SoftmaxRegression> model = std::make_unique<SoftmaxWithoutForwardReports>(kFeatures, kClasses, kSeed);
    auto method = make_method(selection, transport, *model, 0);
    for (std::int64_t t = 0; t < iterations; ++t) {
      IterationTimes times;
      const std::span<float> gradients = method->begin_iteration(t, times);
      const std::span<const float> parameters = model->parameters();
      observed.weights_used[rank].emplace_back(parameters.begin(), parameters.end());
      const SegmentReadyFn* ready = method->segment_ready();
      model->forward_backward(data.at(rank, t, ranks), gradients, ready != nullptr ? *ready : SegmentReadyFn{});
      method->end_iteration(t, times);
      if (t == commit_after) {
        CheckpointWriter state;
        method->save_state(state);
        const std::vector<float> weights(model->parameters().begin(), model->parameters().end());
        method.reset();
        model = std::make_unique<SoftmaxWithoutForwardReports>(kFeatures, kClasses, kSeed + 1);
        std::copy(weights.begin(), weights.end(), model->parameters().begin());
        method = make_method(selection, transport, *model, 0);
        method->load_state(CheckpointReader::parse(state.serialize(), "<test commit>"), t + 1);
      }
    }
    IterationTimes times;
    method->finish(times);
    const std::span<const float> parameters = model->parameters();
    observed.final_weights[rank].assign(parameters.begin(), parameters.end());
    if (rank == 0) {
      nlohmann::json summary;
      method->report()->add_json(summary, RunFigures{});
      observed.phases = summary["auto"]["phases"];
    }
  });
  return observed;
}

// A -> B -> A, switched at iterations 5 and 11 of 16.
struct SwitchCase {
  int ranks;
  std::size_t first;   // index into switchable()
  std::size_t second;
};

void PrintTo(const SwitchCase& c, std::ostream* out) {
  *out << c.ranks << " ranks, " << switchable()[c.first].label << " -> " << switchable()[c.second].label << " -> "
       << switchable()[c.first].label;
}

class AutoSwitch : public ::testing::TestWithParam<SwitchCase> {};

TEST_P(AutoSwitch, LosesNoGradientAndKeepsTheMomentum) {
  const SwitchCase c = GetParam();
  const Switchable& a = switchable()[c.first];
  const Switchable& b = switchable()[c.second];
  const std::int64_t iterations = 16;
  const SoftmaxBatches data = make_softmax_batches(99, c.ranks, iterations, kFeatures, kClasses, kBatch);
  const MethodSelection selection =
      scheduled_auto({{0, a.spec, a.flags}, {5, b.spec, b.flags}, {11, a.spec, a.flags}});
  const Observed observed = run_auto(selection, c.ranks, iterations, data);
  const OracleRun expected =
      phased_sgd(kSgd, {{0, a.k, a.stale_elements}, {5, b.k, b.stale_elements}, {11, a.k, a.stale_elements}}, c.ranks,
                 iterations, data, kFeatures, kClasses, kSeed);
  for (int rank = 0; rank < c.ranks; ++rank) {
    for (std::int64_t t = 0; t < iterations; ++t) {
      expect_close(observed.weights_used[rank][t], expected.weights_used[t],
                   concat("rank ", rank, " weights used at iteration ", t));
    }
    expect_close(observed.final_weights[rank], expected.final_weights, concat("rank ", rank, " final"));
    EXPECT_EQ(observed.final_weights[rank], observed.final_weights[0]) << "replicas diverged";
  }
}

std::vector<SwitchCase> switch_cases() {
  std::vector<SwitchCase> cases;
  const std::size_t n = switchable().size();
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b) {
      if (a != b) cases.push_back({2, a, b});
    }
  }
  cases.push_back({1, 0, 5});  // dsync -> pipe K=2 -> dsync
  cases.push_back({3, 0, 5});
  cases.push_back({3, 4, 6});  // mgwfbp -> pipe K=3 -> mgwfbp
  cases.push_back({3, 6, 1});  // pipe K=3 -> dsync+optimal -> pipe K=3
  cases.push_back({1, 0, 7});  // dsync -> sapipe -> dsync
  cases.push_back({3, 7, 5});  // sapipe -> pipe K=2 -> sapipe
  return cases;
}

std::string label_for_test_name(const std::string& label) {
  std::string name;
  for (char ch : label) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Pairs, AutoSwitch, ::testing::ValuesIn(switch_cases()), [](const auto& info) {
  const SwitchCase& c = info.param;
  return concat("ranks", c.ranks, "_", label_for_test_name(switchable()[c.first].label), "_then_",
                label_for_test_name(switchable()[c.second].label));
});

// The oracle tells the phases apart: without the drain or the momentum the weights differ.
TEST(AutoSwitch, OracleDistinguishesDrainAndMomentum) {
  const SoftmaxBatches data = make_softmax_batches(99, 2, 16, kFeatures, kClasses, kBatch);
  const OracleRun switched = phased_sgd(kSgd, {{0, 1}, {5, 2}, {11, 1}}, 2, 16, data, kFeatures, kClasses, kSeed);
  const OracleRun dsync = phased_sgd(kSgd, {{0, 1}}, 2, 16, data, kFeatures, kClasses, kSeed);
  const OracleRun pipe = phased_sgd(kSgd, {{0, 2}}, 2, 16, data, kFeatures, kClasses, kSeed);
  EXPECT_NE(switched.final_weights, dsync.final_weights);
  EXPECT_NE(switched.final_weights, pipe.final_weights);
}

// SAPipe with weight prediction (wp3, its default) computes on predicted weights: the method that
// follows it starts from the true ones, which SAPipe's own run ends with (finish()).
TEST(AutoSwitch, AfterSapipesWeightPredictionTheNextMethodStartsFromTheTrueWeights) {
  const SoftmaxBatches data = make_softmax_batches(31, 2, 12, kFeatures, kClasses, kBatch);
  const OptionValues wp3 = {{"--stale-layers", "1"}, {"--buckets", "wfbp"}};
  const Observed sapipe_alone = run_auto(scheduled_auto({{0, "dsync", {}}, {3, "sapipe", wp3}}), 2, 9, data);
  const Observed switched = run_auto(scheduled_auto({{0, "dsync", {}}, {3, "sapipe", wp3}, {9, "dsync", {}}}), 2, 12, data);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(switched.weights_used[rank][9], sapipe_alone.final_weights[rank]) << "rank " << rank;
    EXPECT_EQ(switched.final_weights[rank], switched.final_weights[0]) << "replicas diverged";
  }
}

// A commit anywhere (inside a phase, with pipe's or SAPipe's gradients in flight, just before a
// switch) resumes to the weights of the run never interrupted, bit for bit.
class AutoCommit : public ::testing::TestWithParam<std::int64_t> {};

TEST_P(AutoCommit, ResumesBitForBit) {
  const std::int64_t iterations = 20;
  const SoftmaxBatches data = make_softmax_batches(5, 2, iterations, kFeatures, kClasses, kBatch);
  const MethodSelection selection = scheduled_auto(
      {{0, "dsync", {}}, {5, "pipe", {{"--staleness-k", "2"}}}, {9, "sapipe", {{"--stale-layers", "1"}, {"--buckets", "wfbp"}}},
       {12, "mgwfbp", {}}, {16, "pipe", {{"--staleness-k", "3"}}}});
  const Observed uninterrupted = run_auto(selection, 2, iterations, data);
  const Observed resumed = run_auto(selection, 2, iterations, data, GetParam());
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(resumed.final_weights[rank], uninterrupted.final_weights[rank]) << "rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(After, AutoCommit, ::testing::Values(3, 4, 6, 9, 10, 11, 13, 15, 17),
                         [](const auto& info) { return concat("iteration", info.param); });

// Synthetic measurements: `layers` layers of `bytes` each, backward `backward` s each, forward
// `forward` s, update 0.5 ms, and an allreduce of a + b·M.
PlanningInputs synthetic(std::size_t layers, double bytes, double backward, double forward, double a, double b) {
  PlanningInputs inputs;
  inputs.profile.bytes.assign(layers, bytes);
  inputs.profile.backward_seconds.assign(layers, backward);
  inputs.profile.forward_seconds = forward;
  inputs.update_seconds = 0.5e-3;
  inputs.cost = LinearCost{a, b};
  return inputs;
}

struct DecisionCase {
  std::string name;
  std::string policy;
  PlanningInputs measured;
  std::string expected;  // the chosen candidate's label
};

void PrintTo(const DecisionCase& c, std::ostream* out) { *out << c.name << " (auto:" << c.policy << ")"; }

class AutoDecides : public ::testing::TestWithParam<DecisionCase> {};

TEST_P(AutoDecides, AsTheTimingModelsSay) {
  const DecisionCase& c = GetParam();
  const MethodSelection selection = select_for_test(concat("auto:", c.policy));
  const std::vector<AutoCandidate> candidates =
      auto_candidates(options_as<AutoOptions>(*selection.options), selection.common);
  const AutoDecision decision = decide_method(candidates, c.measured, 2, 0.05);
  ASSERT_LT(decision.chosen, candidates.size());
  EXPECT_EQ(candidates[decision.chosen].label, c.expected) << decision.why;
  // The chosen is never slower than the runner-up unless it trades less.
  if (decision.runner_up) {
    const std::size_t other = *decision.runner_up;
    if (decision.predictions[decision.chosen].seconds > decision.predictions[other].seconds) {
      EXPECT_LT(candidates[decision.chosen].trades, candidates[other].trades) << decision.why;
    }
  }
  // Policy sync never trades accuracy.
  if (c.policy == "sync") {
    EXPECT_TRUE(candidates[decision.chosen].accuracy_trade.empty());
  }
}

// 1 MB per layer; a 10 Gbit/s-like link (b = 1e-9 s/B: 1 ms per MB) or a slow one (1e-8 s/B).
INSTANTIATE_TEST_SUITE_P(
    Cases, AutoDecides,
    ::testing::Values(
        // Compute-bound (4 ms allreduce beside 50 ms of compute): plain D-Sync is within a few
        // percent of the layer-wise plans' overlap, and no trade is worth it.
        DecisionCase{"compute_bound_any", "any", synthetic(4, 1e6, 10e-3, 10e-3, 0.1e-3, 1e-9), "dsync+optimal"},
        // Communication-bound behind a long backward: the layer-wise plan hides most of it.
        DecisionCase{"backward_hides_buckets_sync", "sync", synthetic(4, 1e6, 10e-3, 2e-3, 0.1e-3, 1e-8),
                     "dsync+optimal"},
        // Communication-bound, most compute in forward: only pipelining hides the allreduce.
        DecisionCase{"comm_bound_stale", "stale", synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-8), "pipe K=2"},
        DecisionCase{"comm_bound_sync", "sync", synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-8), "dsync+optimal"},
        // ... a lossy codec shrinks it: int8 sends a quarter of the bytes.
        DecisionCase{"comm_bound_lossy", "lossy", synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-8), "dsync+optimal+int8"},
        DecisionCase{"comm_bound_any", "any", synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-8), "pipe+int8 K=2"},
        // The allreduce just past the compute: pipe with a codec hides it all but is < 5% faster
        // than pipe, which is far faster than any synchronous method: a codec on top of staleness
        // is not worth it, staleness is (the rule goes tier by tier, as the trials' does).
        DecisionCase{"codec_on_staleness_below_gain_any", "any", synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 2.675e-9),
                     "pipe K=2"},
        // Pipelining would gain less than the 5% minimum: stay synchronous.
        DecisionCase{"small_gain_stale", "stale", synthetic(4, 1e5, 0.5e-3, 28e-3, 0.1e-3, 2.5e-9), "dsync+optimal"},
        // Many small layers on a high-latency link: per-layer allreduces pay 50 latencies, one
        // allreduce after backward hides nothing; merged buckets win.
        DecisionCase{"many_small_layers_sync", "sync", synthetic(50, 1e4, 0.2e-3, 2e-3, 0.5e-3, 1e-9), "dsync+optimal"}),
    [](const auto& info) { return info.param.name; });

TEST(AutoDecides, WhyNamesTheMeasurementsAndTheTrade) {
  const MethodSelection selection = select_for_test("auto:stale");
  const std::vector<AutoCandidate> candidates =
      auto_candidates(options_as<AutoOptions>(*selection.options), selection.common);
  const AutoDecision decision = decide_method(candidates, synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-8), 2, 0.05);
  EXPECT_NE(decision.why.find("measured compute 10.500 ms"), std::string::npos) << decision.why;
  EXPECT_NE(decision.why.find("allreduce of the whole gradient 40.100 ms"), std::string::npos) << decision.why;
  EXPECT_NE(decision.why.find("trades accuracy (staleness K=2)"), std::string::npos) << decision.why;
  // Tier by tier: a codec on top of staleness 2.9% faster (10.5 against 10.8 ms) is below the
  // minimum; staleness alone gains 84.3% over the fastest synchronous method.
  const MethodSelection any = select_for_test("auto:any");
  const std::vector<AutoCandidate> all = auto_candidates(options_as<AutoOptions>(*any.options), any.common);
  const AutoDecision tiers = decide_method(all, synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 2.675e-9), 2, 0.05);
  EXPECT_EQ(all[tiers.chosen].label, "pipe K=2");
  EXPECT_NE(tiers.why.find("; pipe+bf16 K=2 would be 2.9% faster but trades more accuracy (staleness K=2, lossy codec "
                           "bf16), below the 5% minimum (--auto-min-gain); it trades accuracy (staleness K=2) for "
                           "84.3% over dsync+optimal"),
            std::string::npos)
      << tiers.why;
}

// Drift across a decision boundary (cnn at 10gbe with its link slowed 4x, in synthetic numbers):
// 10.5 ms of compute, mostly forward, and a 0.5 ms allreduce that the layer-wise plan nearly hides,
// so auto:stale keeps dsync+optimal (pipe would gain < 5%). The measured allreduce 4x longer makes
// pipe more than 5% faster by the profile: a crossing. Returns the label the scaled profile chooses.
std::optional<std::string> crossing_label(const std::string& policy, const std::string& running, double comm_scale,
                                          double compute_scale) {
  const MethodSelection selection = select_for_test(concat("auto:", policy));
  const std::vector<AutoCandidate> candidates =
      auto_candidates(options_as<AutoOptions>(*selection.options), selection.common);
  std::size_t index = candidates.size();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].label == running) index = i;
  }
  EXPECT_LT(index, candidates.size()) << running;
  const std::optional<BoundaryCrossing> crossing = decision_boundary_crossed(
      candidates, synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-10), 2, 0.05, index, comm_scale, compute_scale);
  if (!crossing) return std::nullopt;
  EXPECT_LT(crossing->choice_seconds * 1.05, crossing->running_seconds) << candidates[crossing->choice].label;
  return candidates[crossing->choice].label;
}

TEST(AutoDrift, AComm4xLongerCrossesTheBoundaryToPipe) {
  const MethodSelection selection = select_for_test("auto:stale");
  const std::vector<AutoCandidate> candidates =
      auto_candidates(options_as<AutoOptions>(*selection.options), selection.common);
  const PlanningInputs measured = synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-10);
  ASSERT_EQ(candidates[decide_method(candidates, measured, 2, 0.05).chosen].label, "dsync+optimal");
  EXPECT_EQ(crossing_label("stale", "dsync+optimal", 4, 1), "pipe K=2");
  EXPECT_EQ(crossing_label("stale", "dsync+optimal", 1, 1), std::nullopt);    // nothing moved
  EXPECT_EQ(crossing_label("stale", "dsync+optimal", 1.2, 1), std::nullopt);  // still hidden
  // Compute 4x longer too: the ratio is the reference's, the choice stays.
  EXPECT_EQ(crossing_label("stale", "dsync+optimal", 4, 4), std::nullopt);
  // auto:sync has no pipe: the slower link changes nothing the policy allows.
  EXPECT_EQ(crossing_label("sync", "dsync+optimal", 4, 1), std::nullopt);
  // The trials kept pipe, which the profile predicted no faster: unchanged scales cross nothing, and
  // a faster link does not make auto leave a method that is not predicted slower than the choice.
  EXPECT_EQ(crossing_label("stale", "pipe K=2", 1, 1), std::nullopt);
  EXPECT_EQ(crossing_label("stale", "pipe K=2", 0.25, 1), std::nullopt);
  // The trials kept plain dsync (predicted behind dsync+optimal already): only a move beyond that counts.
  EXPECT_EQ(crossing_label("stale", "dsync", 1, 1), std::nullopt);
  EXPECT_EQ(crossing_label("stale", "dsync", 4, 1), "pipe K=2");
}

TEST(AutoDrift, ScaledInputsScaleTheAllreduceAndTheCompute) {
  PlanningInputs measured = synthetic(2, 1e6, 1e-3, 2e-3, 0.1e-3, 1e-9);
  measured.backward_tail_seconds = 0.2e-3;
  measured.profile.per_bucket_compute_seconds = 0.01e-3;
  const PlanningInputs scaled = scaled_planning_inputs(measured, 4, 0.5);
  EXPECT_DOUBLE_EQ(scaled.cost.a, 0.4e-3);
  EXPECT_DOUBLE_EQ(scaled.cost.b, 4e-9);
  EXPECT_EQ(scaled.profile.backward_seconds, (std::vector<double>{0.5e-3, 0.5e-3}));
  EXPECT_DOUBLE_EQ(scaled.profile.forward_seconds, 1e-3);
  EXPECT_DOUBLE_EQ(scaled.profile.per_bucket_compute_seconds, 0.005e-3);
  EXPECT_DOUBLE_EQ(scaled.update_seconds, 0.25e-3);
  EXPECT_DOUBLE_EQ(scaled.backward_tail_seconds, 0.1e-3);
  EXPECT_EQ(scaled.profile.bytes, measured.profile.bytes);
  EXPECT_DOUBLE_EQ(measured_compute_seconds(scaled), 0.5 * measured_compute_seconds(measured));
}

// Trials: the candidates tried are the choice, then those predicted within the margin of the
// fastest, at most kMaxTrials.
AutoDecision predicted(std::vector<double> seconds, std::size_t chosen) {
  AutoDecision decision;
  for (double s : seconds) {
    IterationPrediction prediction;
    prediction.seconds = s;
    decision.predictions.push_back(prediction);
  }
  for (std::size_t i = 0; i < seconds.size(); ++i) decision.ranking.push_back(i);
  std::stable_sort(decision.ranking.begin(), decision.ranking.end(),
                   [&](std::size_t a, std::size_t b) { return seconds[a] < seconds[b]; });
  decision.chosen = chosen;
  return decision;
}

// Candidates that trade `trades[i]` things each (only AutoCandidate::trades matters to the trials).
std::vector<AutoCandidate> trading(std::vector<int> trades) {
  std::vector<AutoCandidate> candidates(trades.size());
  for (std::size_t i = 0; i < trades.size(); ++i) candidates[i].trades = trades[i];
  return candidates;
}

TEST(AutoTrials, ContendersAreTheChoiceAndThoseWithinTheMargin) {
  using Indices = std::vector<std::size_t>;
  const std::vector<AutoCandidate> none = trading({0, 0, 0, 0, 0});
  EXPECT_EQ(trial_contenders(none, predicted({10, 10.5, 12, 10.2, 30}, 0), 0.1), (Indices{0, 3, 1}));  // 12: 20% off
  EXPECT_EQ(trial_contenders(none, predicted({10, 10.5, 12, 10.2, 30}, 0), 0.0), (Indices{0}));        // trials off
  EXPECT_EQ(trial_contenders(none, predicted({10, 10.5, 12, 10.2, 30}, 0), 0.01), (Indices{0}));       // none that close
  EXPECT_EQ(trial_contenders(none, predicted({10, 10.5, 12, 10.2, 30}, 0), 5.0), (Indices{0, 3, 1}));  // at most 3
  // The choice need not be the fastest (a trade below --auto-min-gain): it is tried first.
  EXPECT_EQ(trial_contenders(trading({1, 0, 0}), predicted({10, 10.4, 50}, 1), 0.1), (Indices{1, 0}));
  EXPECT_EQ(trial_contenders(trading({0}), predicted({10}, 0), 0.1), (Indices{0}));
}

// A choice that trades accuracy on a predicted gain below kTradeCheckGain is tried against the
// fastest candidate that trades less, before those within the margin; not with trials off, and not
// when the gain is larger.
TEST(AutoTrials, ATradeIsMeasuredAgainstTheFastestThatTradesLess) {
  using Indices = std::vector<std::size_t>;
  // pipe (1 trade) 10, pipe+bf16 (2) 10, pipe+int8 (2) 10, wfbp (0) 13, dsync (0) 14; the last
  // slot goes to int8 (fewest bytes among the equal predictions).
  std::vector<AutoCandidate> candidates = trading({1, 2, 2, 0, 0});
  candidates[1].wire_bytes_per_value = 2;
  candidates[2].wire_bytes_per_value = 1.01;
  const AutoDecision decision = predicted({10, 10, 10, 13, 14}, 0);
  EXPECT_EQ(trial_contenders(candidates, decision, 0.1), (Indices{0, 3, 2}));
  EXPECT_EQ(trial_contenders(candidates, decision, 0.0), (Indices{0}));
  // Just below and at the gain: 14.99 is tried, 15 is not.
  const double below = 10 * (1 + kTradeCheckGain) - 0.01, at = 10 * (1 + kTradeCheckGain);
  EXPECT_EQ(trial_contenders(candidates, predicted({10, 10, 10, below, 16}, 0), 0.1), (Indices{0, 3, 2}));
  EXPECT_EQ(trial_contenders(candidates, predicted({10, 10, 10, at, 16}, 0), 0.1), (Indices{0, 2, 1}));
  // Two trades (a codec on staleness): the check is the fastest with fewer, here pipe (1 trade).
  EXPECT_EQ(trial_contenders(candidates, predicted({11, 10, 20, 13, 14}, 1), 0.1), (Indices{1, 0}));
  // A choice that trades nothing adds no check.
  EXPECT_EQ(trial_contenders(trading({0, 1, 0}), predicted({10, 9.9, 12}, 0), 0.1), (Indices{0, 1}));
}

// Among equal predictions (a codec on a method whose communication the model sees hidden) the
// fewest bytes on the wire are tried first; a faster prediction still comes before fewer bytes.
TEST(AutoTrials, AmongEqualPredictionsTheFewestBytesOnTheWireAreTriedFirst) {
  using Indices = std::vector<std::size_t>;
  // none 4 bytes, bf16 2, int8 1.01 per value, all trading nothing.
  std::vector<AutoCandidate> candidates = trading({0, 0, 0, 0});
  candidates[1].wire_bytes_per_value = 2;
  candidates[2].wire_bytes_per_value = 1.01;
  candidates[3].wire_bytes_per_value = 1.01;
  EXPECT_EQ(trial_contenders(candidates, predicted({10, 10, 10, 10}, 0), 0.1), (Indices{0, 2, 3}));
  EXPECT_EQ(trial_contenders(candidates, predicted({10, 10, 10.01, 10.02}, 0), 0.1), (Indices{0, 1, 2}));
  EXPECT_EQ(trial_contenders(candidates, predicted({10, 10, 10, 10}, 1), 0.1), (Indices{1, 2, 3}));
  // auto:any's own candidates, with links the pipeline hides whatever the codec.
  const MethodSelection any = select_for_test("auto:any");
  const std::vector<AutoCandidate> all = auto_candidates(options_as<AutoOptions>(*any.options), any.common);
  const auto contenders = [&](const PlanningInputs& measured) {
    const AutoDecision decision = decide_method(all, measured, 2, 0.05);
    std::vector<std::string> labels;
    for (std::size_t i : trial_contenders(all, decision, 0.1)) labels.push_back(all[i].label);
    return labels;
  };
  // A 4 ms allreduce that D-Sync's plan half hides: pipe K=2 is chosen, dsync+optimal is its trade's
  // check, and int8 takes the last slot from bf16 (cnn at 1 Gbit/s).
  EXPECT_EQ(contenders(synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-9)),
            (std::vector<std::string>{"pipe K=2", "dsync+optimal", "pipe+int8 K=2"}));
  // A 0.5 ms allreduce: pipe gains 1.9%, below the minimum, so dsync+optimal is chosen; the pipes
  // tie within the margin, the codecs first (cnn at 10gbe).
  EXPECT_EQ(contenders(synthetic(4, 1e5, 0.5e-3, 8e-3, 0.1e-3, 1e-9)),
            (std::vector<std::string>{"dsync+optimal", "pipe+int8 K=2", "pipe+bf16 K=2"}));
}

// A trial's figure: the settling iterations (the switch's one-time costs) are not counted, the
// counted ones are averaged, and one far above their median (preempted) counts at kTrialOutlier
// times it.
TEST(AutoTrials, TheFigureIsTheMeanOfTheCountedIterationsClippedAtTheirMedian) {
  std::vector<double> scratch(4);
  // 2 settling iterations (50 and 20: building the method, filling the pipeline), then 4 counted.
  EXPECT_DOUBLE_EQ(trial_figure(std::vector<double>{50, 20, 1, 2, 3, 2}, scratch), 2.0);
  // A preempted iteration of 100 counts at 3 x the median (upper median of {1, 2, 3, 100}: 3): 9.
  EXPECT_DOUBLE_EQ(trial_figure(std::vector<double>{50, 20, 1, 2, 3, 100}, scratch), (1 + 2 + 3 + kTrialOutlier * 3) / 4);
  // No settling (scratch as long as the trial) and one counted iteration: itself.
  EXPECT_DOUBLE_EQ(trial_figure(std::vector<double>{4, 5, 6, 9}, scratch), 6.0);
  std::vector<double> one(1);
  EXPECT_DOUBLE_EQ(trial_figure(std::vector<double>{50, 7}, one), 7.0);
  // Pipe K=3 settles max(2, K) = 3 iterations; every other candidate 2.
  AutoOptions options;
  options.staleness = 3;
  EXPECT_EQ(trial_settle_iterations(options), 3);
  options.staleness = 1;
  EXPECT_EQ(trial_settle_iterations(options), kTrialSettleIterations);
}

// Each contender counts at least P iterations and at least --auto-trial-seconds at the fastest
// prediction, an even number (two halves), at most kMaxTrialCounted.
TEST(AutoTrials, ACandidateCountsAtLeastPIterationsAndTheGivenSeconds) {
  AutoOptions options;  // P = 10, --auto-trial-seconds 0.05
  EXPECT_EQ(trial_counted_iterations(options, 20e-3), 10);    // 0.05 s is 3 iterations: P
  EXPECT_EQ(trial_counted_iterations(options, 2.4e-3), 22);   // ceil(20.8) = 21, made even
  EXPECT_EQ(trial_counted_iterations(options, 1e-6), kMaxTrialCounted);
  options.profile_iterations = 7;
  EXPECT_EQ(trial_counted_iterations(options, 1.0), 8);       // P, made even
  options.trial_seconds = 0;
  EXPECT_EQ(trial_counted_iterations(options, 1e-6), 8);      // 0: P alone
  options.profile_iterations = 1;
  EXPECT_EQ(trial_counted_iterations(options, 1e-6), 2);      // one iteration per half at least
}

// The order of the trials is a palindrome: every contender's counted iterations centre on the same
// moment, the last one's run once.
TEST(AutoTrials, TheOrderIsAPalindromeAroundTheLastContender) {
  using Indices = std::vector<std::size_t>;
  EXPECT_EQ(trial_order(1), (Indices{0}));
  EXPECT_EQ(trial_order(2), (Indices{0, 1, 0}));
  EXPECT_EQ(trial_order(3), (Indices{0, 1, 2, 1, 0}));
}

// auto:any's candidates, each found by its label.
struct AnyCandidates {
  std::vector<AutoCandidate> all;
  AnyCandidates() {
    const MethodSelection selection = select_for_test("auto:any");
    all = auto_candidates(options_as<AutoOptions>(*selection.options), selection.common);
  }
  std::size_t index(const std::string& label) const {
    for (std::size_t i = 0; i < all.size(); ++i) {
      if (all[i].label == label) return i;
    }
    ADD_FAILURE() << label;
    return 0;
  }
};

// The measured choice follows --auto-min-gain: a contender that trades accuracy is kept only if it
// measured at least 5% faster than the fastest that trades less.
TEST(AutoTrials, TheFastestMeasuredUnderTheMinimumGain) {
  const AnyCandidates any;
  const std::vector<AutoCandidate>& candidates = any.all;
  auto index = [&](const std::string& label) { return any.index(label); };
  const std::size_t dsync = index("dsync+optimal"), pipe = index("pipe K=2"), pipe_int8 = index("pipe+int8 K=2"),
                    mgwfbp = index("mgwfbp");
  auto contenders_kept = [](const std::vector<AutoCandidate>& all, std::vector<std::size_t> contenders,
                            std::vector<double> seconds, double min_gain) {
    return contenders[choose_measured(all, contenders, seconds, min_gain)];
  };
  auto keep = [&](std::vector<std::size_t> contenders, std::vector<double> seconds) {
    return contenders_kept(candidates, contenders, seconds, 0.05);
  };
  const std::size_t pipe_bf16 = index("pipe+bf16 K=2"), dsync_int8 = index("dsync+int8");
  EXPECT_EQ(keep({pipe, pipe_int8}, {13.5e-3, 10e-3}), pipe_int8);   // measured apart: worth the codec
  EXPECT_EQ(keep({pipe, pipe_bf16}, {4.40e-3, 4.34e-3}), pipe);      // 1.4%: not worth a codec on top
  EXPECT_EQ(keep({pipe_int8, pipe_bf16}, {4.40e-3, 4.34e-3}), pipe_bf16);  // as much traded: the fastest
  // dsync+optimal (0 trades) within 5% of the fastest, pipe+int8 (2): it trades nothing.
  EXPECT_EQ(keep({pipe_int8, dsync_int8, dsync}, {9.6e-3, 9.8e-3, 10e-3}), dsync);
  // dsync+optimal 14.6% slower: the one within 5% that trades least, dsync+int8 (1).
  EXPECT_EQ(keep({pipe_int8, dsync_int8, dsync}, {9.6e-3, 9.8e-3, 11e-3}), dsync_int8);
  // No compounding over tiers: pipe is 4.3% slower than pipe+int8 and dsync+optimal 4.2% slower
  // than pipe, but 8.7% slower than the fastest: pipe, not dsync+optimal (a tier-by-tier rule would
  // give up 8.7%).
  EXPECT_EQ(keep({pipe_int8, pipe, dsync}, {9.2e-3, 9.6e-3, 10e-3}), pipe);
  // At exactly min_gain slower it is no choice (gives up 5%).
  EXPECT_EQ(keep({pipe, dsync}, {10e-3, 10.5e-3 * (1 + 1e-12)}), pipe);
  // --auto-min-gain 0: the fastest, and among equally fast the one that trades least.
  EXPECT_EQ(contenders_kept(candidates, {pipe_int8, pipe, dsync}, {9.2e-3, 9.6e-3, 10e-3}, 0.0), pipe_int8);
  EXPECT_EQ(contenders_kept(candidates, {dsync, pipe}, {10e-3, 9.99e-3}, 0.0), pipe);
  EXPECT_EQ(contenders_kept(candidates, {pipe, dsync}, {10e-3, 10e-3}, 0.0), dsync);
  EXPECT_EQ(keep({dsync, pipe}, {10e-3, 9e-3}), pipe);               // 11% faster: worth its staleness
  EXPECT_EQ(keep({dsync, pipe}, {10e-3, 9.8e-3}), dsync);            // 2%: not
  EXPECT_EQ(keep({pipe, dsync, mgwfbp}, {9.8e-3, 10.1e-3, 10e-3}), mgwfbp);  // the fastest that trades none
  EXPECT_EQ(keep({dsync, mgwfbp}, {10e-3, 9.99e-3}), mgwfbp);
  EXPECT_EQ(keep({pipe}, {1.0}), pipe);
}

// The trials decide between contenders that trade alike only by more than they can tell apart:
// the --auto-min-gain minimum (2%) or their spread (how far one contender's two halves measured
// apart), whichever is larger; within it, the one predicted faster stays.
TEST(AutoTrials, WithinTheTrialsSpreadThePredictionsOrderHolds) {
  const AnyCandidates any;
  const std::vector<AutoCandidate>& candidates = any.all;
  auto index = [&](const std::string& label) { return any.index(label); };
  const std::size_t optimal = index("dsync+optimal"), dsync = index("dsync"), mgwfbp = index("mgwfbp"),
                    pipe = index("pipe K=2"), pipe_int8 = index("pipe+int8 K=2"), pipe_bf16 = index("pipe+bf16 K=2");
  struct Judged {
    std::size_t measured, kept;
    double spread;
  };
  auto judge = [&](std::vector<std::size_t> contenders, std::vector<double> predicted, std::vector<double> phases) {
    const TrialVerdict verdict = judge_trials(candidates, contenders, predicted, phases, 0.02);
    EXPECT_EQ(verdict.seconds.size(), contenders.size());
    return Judged{contenders[verdict.measured_choice], contenders[verdict.kept], verdict.spread};
  };
  // dsync+optimal predicted 2.4% faster than dsync (its buckets overlap the backward).
  const std::vector<double> predicted = {54.8e-3, 56.1e-3};
  // Halves alike (spread 0): dsync measured 3.3% faster is more than the trials' 2%: dsync.
  Judged judged = judge({optimal, dsync}, predicted, {60e-3, 58e-3, 60e-3});
  EXPECT_EQ(judged.measured, dsync);
  EXPECT_EQ(judged.kept, dsync);
  EXPECT_DOUBLE_EQ(judged.spread, 0);
  // The same means, halves 10% apart: the trials cannot tell a 3.3% difference; the prediction's
  // order holds.
  judged = judge({optimal, dsync}, predicted, {57e-3, 58e-3, 63e-3});
  EXPECT_EQ(judged.measured, dsync);
  EXPECT_EQ(judged.kept, optimal);
  EXPECT_NEAR(judged.spread, 0.1, 1e-12);
  // 1.5% faster, halves alike: below the 2% minimum.
  EXPECT_EQ(judge({optimal, dsync}, predicted, {60e-3, 59.1e-3, 60e-3}).kept, optimal);
  // Measured slower than predicted faster: nothing to overrule.
  EXPECT_EQ(judge({dsync, optimal}, {56.1e-3, 54.8e-3}, {60e-3, 55e-3, 60e-3}).kept, optimal);
  // Three contenders: the middle one (mgwfbp, predicted slowest) measured fastest by 3% with
  // halves 4% apart: of those within 4% of it, dsync+optimal is predicted fastest; dsync's
  // halves are the widest apart.
  judged = judge({optimal, dsync, mgwfbp}, {54.8e-3, 56.1e-3, 57e-3}, {60e-3, 59e-3, 58.3e-3, 61.4e-3, 60e-3});
  EXPECT_EQ(judged.measured, mgwfbp);
  EXPECT_EQ(judged.kept, optimal);
  EXPECT_NEAR(judged.spread, 2.4 / 60.2, 1e-12);
  // ... and when dsync+optimal measured 5% slower than mgwfbp, outside the 4%: dsync, the faster
  // predicted of the two within it.
  judged = judge({optimal, dsync, mgwfbp}, {54.8e-3, 56.1e-3, 57e-3}, {61e-3, 59e-3, 58.3e-3, 61.4e-3, 61.5e-3});
  EXPECT_EQ(judged.measured, mgwfbp);
  EXPECT_EQ(judged.kept, dsync);
  // Equal predictions (a codec on a pipeline the model sees hidden): the measurement decides, however
  // wide the spread.
  judged = judge({pipe_int8, pipe_bf16}, {40e-3, 40e-3}, {38e-3, 40e-3, 46e-3});
  EXPECT_EQ(judged.kept, pipe_bf16);
  EXPECT_EQ(judged.kept, judged.measured);
  // Contenders that trade differently follow the --auto-min-gain rule alone: pipe measured 10%
  // faster than dsync+optimal keeps its staleness, whatever the spread.
  judged = judge({optimal, pipe}, {60e-3, 50e-3}, {61e-3, 55e-3, 69e-3});
  EXPECT_EQ(judged.kept, pipe);
  judged = judge({pipe, optimal}, {50e-3, 60e-3}, {50e-3, 54.5e-3, 60e-3});  // 1% slower: no trade
  EXPECT_EQ(judged.kept, optimal);
  // The --auto-min-gain rule holds: pipe measured fastest, dsync 1.5% slower (kept: it trades less),
  // dsync+optimal predicted faster than dsync and within the spread (4%) of it, but 3% slower than
  // pipe: trading less is not worth 2% or more.
  judged = judge({optimal, pipe, dsync}, {54.8e-3, 50e-3, 56.1e-3}, {103e-3, 98e-3, 101.5e-3, 102e-3, 103e-3});
  EXPECT_EQ(judged.measured, dsync);
  EXPECT_EQ(judged.kept, dsync);
  // ... and with dsync+optimal 1.9% slower than pipe, it is.
  EXPECT_EQ(judge({optimal, pipe, dsync}, {54.8e-3, 50e-3, 56.1e-3}, {101.9e-3, 98e-3, 101.5e-3, 102e-3, 101.9e-3}).kept,
            optimal);
  // One contender: kept, no spread.
  judged = judge({pipe}, {50e-3}, {50e-3});
  EXPECT_EQ(judged.kept, pipe);
  EXPECT_DOUBLE_EQ(judged.spread, 0);
}

// A run with trials (every candidate is close with --auto-trial 10): profiling, the trials of 3
// candidates in the order 1 2 3 2 1 (2 settling iterations at each switch, then 2 counted, 4 for the
// third), then the one kept; the weights follow the phases' rules, also when the run commits in the
// middle of the third trial, or of the second's second half, and resumes.
struct TrialCase {
  int ranks;
  std::int64_t commit_after;  // -1: none
};

void PrintTo(const TrialCase& c, std::ostream* out) {
  *out << c.ranks << " ranks, " << (c.commit_after < 0 ? "uninterrupted" : concat("commit after ", c.commit_after));
}

class AutoTrialRun : public ::testing::TestWithParam<TrialCase> {};

TEST_P(AutoTrialRun, KeepsOneOfTheTriedAndLosesNoGradient) {
  const TrialCase c = GetParam();
  const std::int64_t iterations = 40;
  const SoftmaxBatches data = make_softmax_batches(11, c.ranks, iterations, kFeatures, kClasses, kBatch);
  const MethodSelection selection = select_for_test(
      "auto:stale",
      {{"--profile-iters", "4"}, {"--auto-trial", "10"}, {"--auto-trial-seconds", "0"}, {"--auto-drift", "0"},
       {"--compensation", "none"}},
      kSgd);
  const Observed observed = run_auto(selection, c.ranks, iterations, data, c.commit_after);
  const nlohmann::json& phases = observed.phases;
  std::vector<std::pair<std::int64_t, std::string>> shape;
  for (const auto& phase : phases) shape.emplace_back(phase["start_iteration"], phase["kind"]);
  const std::int64_t chosen = kAutoProfileWarmupIterations + 4;  // after --profile-iters 4
  ASSERT_EQ(shape, (std::vector<std::pair<std::int64_t, std::string>>{{0, "profiling"},
                                                                      {chosen, "trial"},
                                                                      {chosen + 4, "trial"},
                                                                      {chosen + 8, "trial"},
                                                                      {chosen + 14, "trial"},
                                                                      {chosen + 18, "trial"},
                                                                      {chosen + 22, "chosen"}}))
      << phases.dump();
  std::set<std::string> tried;
  for (int i = 1; i <= 3; ++i) tried.insert(phases[i]["method"].get<std::string>());
  EXPECT_EQ(tried.size(), 3u) << phases.dump();
  EXPECT_EQ(phases[4]["method"], phases[2]["method"]) << phases.dump();
  EXPECT_EQ(phases[5]["method"], phases[1]["method"]) << phases.dump();
  EXPECT_EQ(phases[1]["why"], "trial 1 of 3, first half");
  EXPECT_EQ(phases[3]["why"], "trial 3 of 3");
  EXPECT_EQ(phases[5]["why"], "trial 1 of 3, second half");
  EXPECT_TRUE(tried.count(phases[6]["method"].get<std::string>())) << phases.dump();
  const std::string why = phases[6]["why"];
  EXPECT_TRUE(why.starts_with("the shortest iteration in the trials: ") ||
              why.starts_with("the iteration in the trials: "))
      << why;
  std::vector<OraclePhase> oracle;
  for (const auto& phase : phases) {
    const std::string label = phase["method"];
    const std::int64_t start = phase["start_iteration"];
    if (label.starts_with("sapipe")) {
      // k as its prediction chose it ("k = 1 of 2 layers stale"): the weight matrix is layer 0.
      const std::string model = phase["model"];
      const std::size_t k_at = model.find("k = ");
      ASSERT_NE(k_at, std::string::npos) << model;
      const int k = std::stoi(model.substr(k_at + 4));
      oracle.push_back({start, 2, k == 0 ? 0 : k == 1 ? kClasses * kFeatures : SIZE_MAX});
      continue;
    }
    const std::size_t k_at = label.find(" K=");
    oracle.push_back({start, k_at == std::string::npos ? 1 : std::stoi(label.substr(k_at + 3))});
  }
  const OracleRun expected = phased_sgd(kSgd, oracle, c.ranks, iterations, data, kFeatures, kClasses, kSeed);
  for (int rank = 0; rank < c.ranks; ++rank) {
    expect_close(observed.final_weights[rank], expected.final_weights, concat("rank ", rank, " final"));
  }
}

INSTANTIATE_TEST_SUITE_P(Runs, AutoTrialRun,
                         ::testing::Values(TrialCase{2, -1}, TrialCase{3, -1}, TrialCase{2, 17}, TrialCase{1, 26}),
                         [](const auto& info) {
                           return concat("ranks", info.param.ranks, info.param.commit_after < 0 ? "_uninterrupted"
                                                                      : concat("_commit", info.param.commit_after));
                         });

// A drift window lasts at least --auto-window-seconds: a 4 ms iteration's window of 50 would be
// 0.2 s, in which the machine's own swings look like drift.
TEST(AutoDrift, AWindowLastsAtLeastTheGivenSeconds) {
  AutoOptions options;  // --auto-window 50, --auto-window-seconds 2
  EXPECT_EQ(drift_window_for(options, 4e-3), 500);
  EXPECT_EQ(drift_window_for(options, 0.1), 50);     // 50 iterations last 5 s
  EXPECT_EQ(drift_window_for(options, 1e-9), kMaxDriftWindow);
  EXPECT_EQ(drift_window_for(options, 0), 50);       // nothing predicted
  options.drift_window_seconds = 0;
  EXPECT_EQ(drift_window_for(options, 4e-3), 50);
  // A run records each chosen phase's window: here the iterations are microseconds, so 2 s is the
  // cap, and the first window of 20 at 0 s.
  const SoftmaxBatches data = make_softmax_batches(3, 2, 20, kFeatures, kClasses, kBatch);
  for (const char* seconds : {"2", "0"}) {
    const Observed observed =
        run_auto(select_for_test("auto", {{"--profile-iters", "2"}, {"--auto-trial", "0"}, {"--auto-window", "20"},
                                          {"--auto-window-seconds", seconds}}),
                 2, 20, data);
    ASSERT_EQ(observed.phases.size(), 2u) << observed.phases.dump();
    const nlohmann::json& chosen = observed.phases[1];
    options.drift_window = 20;
    options.drift_window_seconds = std::stod(seconds);
    EXPECT_EQ(chosen["drift_window_iterations"].get<std::int64_t>(),
              drift_window_for(options, chosen["predicted_iteration_s"].get<double>()))
        << chosen.dump();
    EXPECT_EQ(chosen["drift_window_iterations"].get<std::int64_t>() > 20, std::string(seconds) == "2") << chosen.dump();
  }
}

TEST(AutoCandidates, FollowThePolicy) {
  auto labels = [](const std::string& spec, const OptionValues& flags = {}) {
    const MethodSelection selection = select_for_test(spec, flags);
    std::vector<std::string> out;
    for (const AutoCandidate& c : auto_candidates(options_as<AutoOptions>(*selection.options), selection.common)) {
      out.push_back(c.label);
    }
    return out;
  };
  const std::vector<std::string> sync = {"dsync", "dsync+optimal", "mgwfbp", "wfbp"};
  EXPECT_EQ(labels("auto"), sync);
  EXPECT_EQ(labels("auto:sync"), sync);
  std::vector<std::string> stale = sync;
  stale.push_back("sapipe");
  stale.push_back("pipe K=3");
  EXPECT_EQ(labels("auto:stale", {{"--staleness-k", "3"}}), stale);
  EXPECT_EQ(labels("auto:lossy", {{"--codec", "bf16"}}),
            (std::vector<std::string>{"dsync", "dsync+optimal", "mgwfbp", "wfbp", "dsync+bf16", "dsync+optimal+bf16",
                                      "mgwfbp+bf16", "wfbp+bf16"}));
  EXPECT_EQ(labels("auto:any").size(), 18u);  // 6 per codec: none, bf16, int8
  EXPECT_EQ(labels("auto:any")[16], "sapipe+int8");
}

// SAPipe's prediction: with every layer's allreduce far longer than the compute, k is every layer
// and the iteration is the allreduce of the whole gradient (one, the stale range's, per iteration),
// then the update and wp3's estimated 2 more updates; with a fast link no layer need be stale.
TEST(AutoCandidates, SapipePredictsItsTimeline) {
  const MethodSelection selection = select_for_test("auto:stale");
  const std::vector<AutoCandidate> candidates =
      auto_candidates(options_as<AutoOptions>(*selection.options), selection.common);
  std::size_t sapipe = candidates.size();
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].label == "sapipe") sapipe = i;
  }
  ASSERT_LT(sapipe, candidates.size());
  EXPECT_EQ(candidates[sapipe].trades, 1);
  // 4 layers of 1 MB, 0.5 ms backward each, 8 ms forward, update 0.5 ms; allreduce 0.1 ms + 10 ms/MB.
  const AutoDecision slow = decide_method(candidates, synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-3, 1e-8), 2, 0.05);
  EXPECT_NEAR(slow.predictions[sapipe].seconds, (0.1e-3 + 4e6 * 1e-8) + 0.5e-3 * 3, 1e-9);
  EXPECT_NE(slow.predictions[sapipe].model.find("k = 4 of 4 layers stale"), std::string::npos)
      << slow.predictions[sapipe].model;
  // A link 1000x faster: the layers' allreduces hide behind the backward of the layers before them
  // and the forward, but for the first layer's, launched when backward ends: k = 1.
  const AutoDecision fast = decide_method(candidates, synthetic(4, 1e6, 0.5e-3, 8e-3, 0.1e-6, 1e-11), 2, 0.05);
  EXPECT_NE(fast.predictions[sapipe].model.find("k = 1 of 4 layers stale"), std::string::npos)
      << fast.predictions[sapipe].model;
}

TEST(AutoOptionsErrors, ContradictionsAndUnknownPoliciesAreOneLine) {
  auto message = [](const std::string& spec, const OptionValues& flags) {
    try {
      select_for_test(spec, flags);
    } catch (const UsageError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("auto:fast", {}), "unknown policy 'fast' in auto:fast (policies: sync, stale, lossy or any)");
  EXPECT_EQ(message("auto:sync", {{"--staleness-k", "3"}}),
            "--staleness-k 3 trades accuracy (stale updates), which auto:sync does not allow: use auto:stale or auto:any");
  EXPECT_EQ(message("auto", {{"--codec", "int8"}}),
            "--codec int8 trades accuracy (a lossy codec), which auto:sync does not allow: use auto:lossy or auto:any");
  EXPECT_EQ(message("auto:stale", {{"--codec", "bf16"}}),
            "--codec bf16 trades accuracy (a lossy codec), which auto:stale does not allow: use auto:lossy or auto:any");
  EXPECT_EQ(message("auto:any", {{"--staleness-k", "1"}}),
            "--staleness-k must be in [2, 64] for auto's pipe candidate, got 1");
  EXPECT_EQ(message("auto", {{"--auto-drift", "-1"}}), "--auto-drift must be in [0, 100] (0: never choose again), got -1");
  EXPECT_EQ(message("auto", {{"--auto-window", "0"}}), "--auto-window must be in [1, 10000000], got 0");
  EXPECT_EQ(message("auto", {{"--auto-trial", "-0.1"}}), "--auto-trial must be in [0, 10] (0: no trials), got -0.1");
  EXPECT_EQ(message("auto", {{"--auto-window-seconds", "-1"}}), "--auto-window-seconds must be in [0, 3600], got -1");
  EXPECT_EQ(message("auto", {{"--auto-trial-seconds", "61"}}), "--auto-trial-seconds must be in [0, 60], got 61");
  EXPECT_EQ(message("auto:any", {{"--codec", "int8"}, {"--staleness-k", "3"}}), "no error");
  EXPECT_EQ(message("auto", {{"--compensation", "dc"}}),
            "--compensation dc is the sapipe candidate's, which auto:sync does not have: use auto:stale or auto:any");
  EXPECT_EQ(message("auto:stale", {{"--compensation", "wp9"}}),
            "unknown --compensation 'wp9' (expected none, dc, wp1, wp2, wp3)");
  EXPECT_EQ(message("auto:any", {{"--compensation", "dc"}}), "no error");
}

// The sapipe candidate's compensation: wp3 by default; with the caller's optimizer (the API's
// "external") dc, since weight prediction needs the optimizer's own rule, and wp3 given is refused.
TEST(AutoOptionsErrors, SapipeCompensationFollowsTheOptimizer) {
  auto sapipe_label = [](const OptionValues& flags, bool external) {
    const MethodSelection selection = select_for_test("auto:stale", flags);
    CommonOptions common = selection.common;
    if (external) common.optimizer.name = "external";
    for (const AutoCandidate& c : auto_candidates(options_as<AutoOptions>(*selection.options), common)) {
      if (c.label.starts_with("sapipe")) return c.label + " / " + c.accuracy_trade;
    }
    return std::string("none");
  };
  EXPECT_EQ(sapipe_label({}, false), "sapipe / partial staleness: the first k layers 1 step stale, compensated by wp3");
  EXPECT_EQ(sapipe_label({}, true), "sapipe+dc / partial staleness: the first k layers 1 step stale, compensated by dc");
  EXPECT_EQ(sapipe_label({{"--compensation", "none"}}, true), "sapipe+none / partial staleness: the first k layers 1 step stale");
  try {
    sapipe_label({{"--compensation", "wp3"}}, true);
    ADD_FAILURE() << "wp3 with the caller's optimizer was accepted";
  } catch (const UsageError& error) {
    EXPECT_EQ(std::string(error.what()),
              "auto:stale --compensation wp3: SAPipe's weight prediction computes the next update with the optimizer's "
              "own rule, so it cannot hand its gradients to your optimizer: use --compensation dc or none");
  }
}

// Runs `selection` on 2 ranks of a LocalFabric with `network` for `iterations`, rank 1's link
// slowed 10x from `slowed_at` on, each iteration sleeping `compute` before the forward (the profile
// counts it as forward). Returns summary.json's auto phases and rank 0's announced lines.
struct DriftRun {
  nlohmann::json phases;
  std::vector<std::string> announced;
};
DriftRun run_slowed_link(const MethodSelection& selection, const NetworkSpec& network, std::int64_t iterations,
                         std::int64_t slowed_at, std::chrono::milliseconds compute, std::uint64_t data_seed) {
  LocalFabric fabric(2, network);
  const SoftmaxBatches data = make_softmax_batches(data_seed, 2, iterations, kFeatures, kClasses, kBatch);
  DriftRun run;
  std::mutex announced_mutex;
  run_ranks_on(fabric, [&](int rank, Transport& transport) {
    SoftmaxRegression model(kFeatures, kClasses, kSeed);
    std::function<void(const std::string&)> announce;
    if (rank == 0) {
      announce = [&](const std::string& line) {
        std::lock_guard lock(announced_mutex);
        run.announced.push_back(line);
      };
    }
    auto method = make_method(selection, transport, model, 0, network, {}, announce);
    for (std::int64_t t = 0; t < iterations; ++t) {
      if (rank == 1 && t == slowed_at) fabric.slow_link(1, 10);
      IterationTimes times;
      const std::span<float> gradients = method->begin_iteration(t, times);
      if (compute.count() > 0) std::this_thread::sleep_for(compute);
      const SegmentReadyFn* ready = method->segment_ready();
      model.forward_backward(data.at(rank, t, 2), gradients, ready != nullptr ? *ready : SegmentReadyFn{});
      method->end_iteration(t, times);
    }
    IterationTimes times;
    method->finish(times);
    if (rank == 0) {
      nlohmann::json summary;
      method->report()->add_json(summary, RunFigures{});
      run.phases = summary["auto"]["phases"];
    }
  });
  return run;
}

// Drift: rank 1's link slowed 10x at iteration 100 of 200 (an emulated link: the iteration is
// mostly sleeping on the wire, so the machine's load hardly moves it) makes auto profile and choose
// once more, and only once: the phases are profiling, chosen, profiling (after the slow-down),
// chosen. The threshold (3x) is far above the iteration's noise and far below the slow-down. (No
// trials: AutoTrialRun tries them.)
TEST(AutoDrift, ALinkSlowedMidRunMakesAutoChooseOnceMore) {
  NetworkSpec network;
  network.bits_per_second = 1e6;
  network.latency_seconds = 0.1e-3;
  network.name = "bw=1Mbit,lat=100us";
  const MethodSelection selection = select_for_test(
      "auto:stale", {{"--profile-iters", "4"}, {"--auto-drift", "2"}, {"--auto-window", "20"}, {"--auto-min-interval", "60"},
                     {"--auto-trial", "0"}, {"--auto-window-seconds", "0"}});
  const std::int64_t iterations = 200, slowed_at = 100;
  const DriftRun run = run_slowed_link(selection, network, iterations, slowed_at, std::chrono::milliseconds(0), 3);
  const nlohmann::json& phases = run.phases;
  const std::vector<std::string>& announced = run.announced;
  std::vector<std::string> kinds;
  for (const auto& phase : phases) kinds.push_back(phase["kind"].get<std::string>());
  ASSERT_EQ(kinds, (std::vector<std::string>{"profiling", "chosen", "profiling", "chosen"})) << phases.dump();
  EXPECT_EQ(phases[1]["start_iteration"], kAutoProfileWarmupIterations + 4);
  const std::int64_t again = phases[2]["start_iteration"].get<std::int64_t>();
  EXPECT_GT(again, slowed_at) << phases.dump();
  EXPECT_LE(again, slowed_at + 2 * 20 + 20) << phases.dump();
  EXPECT_EQ(phases[3]["start_iteration"].get<std::int64_t>(), again + 4);
  EXPECT_NE(phases[2]["why"].get<std::string>().find("the measured iteration moved from"), std::string::npos);
  ASSERT_EQ(announced.size(), 3u) << "rank 0 says each choice and the drift";
}

// A decision boundary crossed: each iteration computes 30 ms (a sleep before the forward, which the
// profile counts as forward) and allreduces 84 bytes over a 1 Mbit/s link (~1 ms): compute-bound,
// so auto:stale picks a synchronous method (pipe would gain ~3%, below --auto-min-gain 0.05). Rank 1's
// link slowed 10x at iteration 50 makes the allreduce ~9 ms: the iteration moves x1.3, inside the
// band (--auto-drift 1: x0.5 to x2), but the comm/compute ratio moves x10 and the profile scaled by
// it predicts pipe (or sapipe) ~30% faster. Two such windows make auto profile again, saying so,
// and choose a method that hides the allreduce.
TEST(AutoDrift, ACommComputeRatioAcrossADecisionBoundaryMakesAutoChooseAgain) {
  NetworkSpec network;
  network.bits_per_second = 1e6;
  network.latency_seconds = 0.1e-3;
  network.name = "bw=1Mbit,lat=100us";
  const MethodSelection selection =
      select_for_test("auto:stale", {{"--profile-iters", "4"}, {"--auto-drift", "1"}, {"--auto-window", "10"},
                                     {"--auto-min-interval", "30"}, {"--auto-trial", "0"}, {"--auto-window-seconds", "0"},
                                     {"--compensation", "none"}, {"--auto-min-gain", "0.05"}});
  const std::int64_t iterations = 110, slowed_at = 50;
  const nlohmann::json phases =
      run_slowed_link(selection, network, iterations, slowed_at, std::chrono::milliseconds(30), 5).phases;
  std::vector<std::string> kinds;
  for (const auto& phase : phases) kinds.push_back(phase["kind"].get<std::string>());
  ASSERT_EQ(kinds, (std::vector<std::string>{"profiling", "chosen", "profiling", "chosen"})) << phases.dump();
  const std::string first = phases[1]["method"];
  EXPECT_EQ(first.find("pipe"), std::string::npos) << "compute-bound: a synchronous method, not " << first;
  const std::string again = phases[2]["why"];
  EXPECT_NE(again.find("the link probe (an allreduce of 84 bytes) moved from"), std::string::npos) << again;
  EXPECT_NE(again.find("with them the profile predicts "), std::string::npos) << again;
  EXPECT_GT(phases[2]["start_iteration"].get<std::int64_t>(), slowed_at) << phases.dump();
  const std::string last = phases[3]["method"];
  EXPECT_TRUE(last.starts_with("pipe") || last.starts_with("sapipe")) << "comm-bound: a method that hides it, not "
                                                                      << last;
}

}  // namespace
}  // namespace pipesgd
