// Methods simulated on hand-built profiles against the papers' closed forms: D-Sync is Pipe-SGD's
// Eq. 2, Pipe-SGD K >= 2 its Eq. 4, WFBP MG-WFBP's Eq. 11-13 (classify_wfbp), any bucket plan
// simulate_plan's timeline. Every iteration time here is simulated (deterministic) time, compared
// with closed forms of the model, never this machine's clock.
#include "pipesgd/sim/method_simulation.h"

#include <gtest/gtest.h>

#include "pipesgd/timing/allreduce_cost_model.h"

#include <cctype>
#include <cmath>
#include <ostream>

#include "pipesgd/algo/registry.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/timing/bucket_plan.h"

namespace pipesgd {
namespace {

constexpr double kAlpha = 20e-6;       // one-way latency, s
constexpr double kBandwidth = 1.25e9;  // bytes/s

// Layers in forward order: {parameters, forward s, backward s}.
ModelProfile hand_profile(std::vector<ProfiledLayer> layers, double data = 1e-3, double update = 0.5e-3) {
  ModelProfile profile;
  profile.model = "hand-built";
  profile.batch = 32;
  profile.data_seconds = data;
  profile.update_seconds = update;
  profile.layers = std::move(layers);
  return profile;
}

MethodSelection select(const std::string& spec, OptionValues flags = {}) {
  return select_method(spec, flags, FlagPolicy::kReject, CommonOptions{});
}

MethodSimulationOptions options(int workers, CollectiveSimulation collectives = CollectiveSimulation::kMessages) {
  MethodSimulationOptions o;
  o.workers = workers;
  o.link = parse_network_spec("bw=10Gbit,lat=20us");
  o.iterations = 6;
  o.collectives = collectives;
  return o;
}

// Pipe-SGD Eq. 5's communication term: an unsegmented ring of `bytes` (divisible by 4p).
double ring_seconds(int p, double bytes) { return p <= 1 ? 0 : 2.0 * (p - 1) * (kAlpha + bytes / p / kBandwidth); }

const OptionValues kUnsegmented{{"--segment-bytes", "none"}};

struct ClosedFormCase {
  int workers;
  CollectiveSimulation collectives;
  double backward;  // seconds: small = communication-bound pipe, large = compute-bound
};

std::ostream& operator<<(std::ostream& out, const ClosedFormCase& c) {
  return out << c.workers << " workers, " << collective_simulation_name(c.collectives) << " collectives, backward "
             << c.backward << " s";
}

class ClosedForms : public testing::TestWithParam<ClosedFormCase> {};

TEST_P(ClosedForms, DsyncIsEquation2AndPipeIsEquation4) {
  const ClosedFormCase& c = GetParam();
  const std::size_t parameters = 1 << 20;  // 4 MiB of gradient, divisible by 4p for p in {1, 2, 4, 8}
  const ModelProfile profile = hand_profile({{"fc", parameters, 2e-3, c.backward}});
  const double compute = profile.compute_seconds();
  const double comm = ring_seconds(c.workers, 4.0 * parameters);

  const MethodSimulationResult dsync = simulate_method(select("dsync", kUnsegmented), profile, options(c.workers, c.collectives));
  EXPECT_NEAR(dsync.iteration_seconds, compute + comm, 1e-9) << "Eq. 2";
  EXPECT_NEAR(dsync.compute_seconds, compute, 1e-9);
  EXPECT_NEAR(dsync.allreduce_seconds, comm, 1e-9);
  EXPECT_NEAR(dsync.samples_per_second, c.workers * 32 / (compute + comm), 1e-6 * dsync.samples_per_second);

  // Eq. 4's communication term is the unsegmented ring (Pipe-SGD's own default segments chunks of
  // more than 640 KiB, as these 2 MiB ones at 2 workers).
  for (int k : {2, 3}) {
    const MethodSimulationResult pipe =
        simulate_method(select("pipe", {{"--staleness-k", std::to_string(k)}, {"--segment-bytes", "none"}}), profile,
                        options(c.workers, c.collectives));
    EXPECT_NEAR(pipe.iteration_seconds, std::max(compute, comm), 1e-9) << "Eq. 4, K = " << k;
  }
  const MethodSimulationResult k1 = simulate_method(
      select("pipe", {{"--staleness-k", "1"}, {"--segment-bytes", "none"}}), profile, options(c.workers, c.collectives));
  EXPECT_NEAR(k1.iteration_seconds, compute + comm, 1e-9) << "K = 1 is D-Sync";
}

INSTANTIATE_TEST_SUITE_P(Simulated, ClosedForms,
                         testing::Values(ClosedFormCase{1, CollectiveSimulation::kMessages, 3e-3},
                                         ClosedFormCase{2, CollectiveSimulation::kMessages, 3e-3},
                                         ClosedFormCase{4, CollectiveSimulation::kMessages, 1e-3},
                                         ClosedFormCase{4, CollectiveSimulation::kMessages, 20e-3},
                                         ClosedFormCase{8, CollectiveSimulation::kModel, 1e-3},
                                         ClosedFormCase{8, CollectiveSimulation::kModel, 20e-3}));

// Ten layers whose sizes are multiples of 4 x 8 x 4 elements, so every bucket's ring has equal chunks
// (the a + b·M cost is then exact for the message-level simulation).
ModelProfile layered_profile(std::vector<double> backward, double parameter_scale) {
  std::vector<ProfiledLayer> layers;
  for (std::size_t i = 0; i < backward.size(); ++i) {
    const std::size_t parameters = static_cast<std::size_t>(parameter_scale * (1 + i % 3)) * 128;
    layers.push_back({concat("layer", i), parameters, 0.2e-3, backward[i]});
  }
  return hand_profile(std::move(layers), 0.5e-3, 0.3e-3);
}

struct WfbpCaseParam {
  const char* name;
  std::vector<double> backward;
  double parameter_scale;
  int expected_case;
};

std::ostream& operator<<(std::ostream& out, const WfbpCaseParam& c) { return out << c.name; }

class WfbpCases : public testing::TestWithParam<WfbpCaseParam> {};

TEST_P(WfbpCases, WfbpIsMgWfbpEquations11To13) {
  const WfbpCaseParam& c = GetParam();
  const int p = 4;
  const ModelProfile profile = layered_profile(c.backward, c.parameter_scale);
  const LinearCost cost = allreduce_cost("ring", p, LinkParameters{kAlpha, 1 / kBandwidth, 0});
  const WfbpCase wfbp = classify_wfbp(layer_profile(profile, "none"), cost);
  ASSERT_EQ(wfbp.number, c.expected_case) << "the hand-built profile is not the case it is meant to be";
  const MethodSimulationResult result = simulate_method(select("wfbp", kUnsegmented), profile, options(p));
  EXPECT_NEAR(result.iteration_seconds, wfbp.iteration, 1e-9) << "Eq. " << 10 + wfbp.number;
}

INSTANTIATE_TEST_SUITE_P(
    Simulated, WfbpCases,
    testing::Values(
        // 1: each layer's allreduce (0.15-0.24 ms) hides behind the next layer's backward (1 ms).
        WfbpCaseParam{"case1", std::vector<double>(10, 1e-3), 64, 1},
        // 2: a slow allreduce does not hide behind a fast layer, but all end before layer 1 is ready.
        // (segment 0, paper layer 1, is computed last: its 20 ms leave time for all of them).
        WfbpCaseParam{"case2", {20e-3, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-5, 1e-3}, 1024, 2},
        // 3: communication-bound: allreduces of 0.27-0.58 ms against 0.1 ms layers.
        WfbpCaseParam{"case3", std::vector<double>(10, 1e-4), 256, 3}),
    [](const testing::TestParamInfo<WfbpCaseParam>& info) { return std::string(info.param.name); });

class BucketPlanTimelines : public testing::TestWithParam<double> {};

// With kappa (the profile's bucket_launch_seconds, as `profile --in-run` measures it) too: each
// bucket launched during backward delays the layers after it, in the schedule and in the planners.
TEST_P(BucketPlanTimelines, EveryBucketPlanIsItsTimeline) {
  const int p = 4;
  ModelProfile profile = layered_profile({1e-4, 3e-4, 1e-3, 2e-4, 5e-4, 1e-4, 2e-3, 1e-4, 4e-4, 1e-3}, 512);
  profile.bucket_launch_seconds = GetParam();
  const LinearCost cost = allreduce_cost("ring", p, LinkParameters{kAlpha, 1 / kBandwidth, 0});
  if (GetParam() > 0) {
    // wfbp's 10 buckets: 9 launched during backward, each kappa later than without.
    const double without = [&] {
      ModelProfile plain = profile;
      plain.bucket_launch_seconds = 0;
      return simulate_method(select("wfbp", kUnsegmented), plain, options(p)).compute_seconds;
    }();
    EXPECT_NEAR(simulate_method(select("wfbp", kUnsegmented), profile, options(p)).compute_seconds,
                without + 9 * GetParam(), 1e-9);
  }
  for (const std::string spec : {"wfbp", "synceasgd", "mgwfbp", "dsync+optimal", "dsync+fixed:0.01"}) {
    const MethodSelection selection = select(spec, kUnsegmented);
    const std::string plan_name = spec == "wfbp" ? "wfbp" : spec == "synceasgd" ? "single" : spec == "mgwfbp" ? "mgwfbp"
                                  : spec == "dsync+optimal" ? "optimal" : "fixed:0.01";
    const LayerProfile layers = layer_profile(profile, "none");
    const PlanTimeline timeline = simulate_plan(layers, cost, make_bucket_plan(plan_name, layers, cost));
    const MethodSimulationResult result = simulate_method(selection, profile, options(p));
    EXPECT_NEAR(result.iteration_seconds, timeline.iteration, 1e-9) << spec;
    EXPECT_NE(result.schedule.find(plan_name), std::string::npos) << spec << ": " << result.schedule;
  }
}

INSTANTIATE_TEST_SUITE_P(Simulated, BucketPlanTimelines, testing::Values(0.0, 50e-6),
                         [](const testing::TestParamInfo<double>& info) {
                           return info.param > 0 ? std::string("kappa50us") : std::string("kappa0");
                         });

TEST(MethodSimulation, IsDeterministicAndJitterSlowsTheSynchronousMethods) {
  const ModelProfile profile = hand_profile({{"a", 65536, 1e-3, 2e-3}, {"b", 65536, 1e-3, 2e-3}});
  MethodSimulationOptions o = options(4);
  const double plain = simulate_method(select("dsync"), profile, o).iteration_seconds;
  o.compute_jitter = 0.5;
  o.seed = 7;
  const double jittered = simulate_method(select("dsync"), profile, o).iteration_seconds;
  EXPECT_EQ(jittered, simulate_method(select("dsync"), profile, o).iteration_seconds);
  // Every iteration waits for the slowest of 4 workers: more than the mean factor 1.25 of one.
  EXPECT_GT(jittered, plain);
  o.seed = 8;
  EXPECT_NE(jittered, simulate_method(select("dsync"), profile, o).iteration_seconds);
}

TEST(MethodSimulation, LargeWorldsWithModelledCollectives) {
  const ModelProfile profile = hand_profile({{"a", 1 << 16, 1e-3, 2e-3}, {"b", 1 << 18, 1e-3, 2e-3}});
  for (const std::string spec : {"dsync", "pipe", "wfbp", "mgwfbp", "dsync+optimal"}) {
    for (int workers : {64, 1024}) {
      MethodSimulationOptions o = options(workers, CollectiveSimulation::kAuto);
      o.iterations = 3;
      const MethodSimulationResult result = simulate_method(select(spec), profile, o);
      EXPECT_EQ(result.collectives, "model");
      EXPECT_GE(result.iteration_seconds, profile.compute_seconds() * (1 - 1e-9)) << spec << " " << workers;
    }
  }
}

// The modelled collectives (rounds played on the platform, sim/collective_rounds.h) give the
// message-level simulation's iteration time on a 4:1 oversubscribed fat-tree too, for a method with
// one allreduce and ones with many small ones.
TEST(MethodSimulation, ModelledCollectivesAgreeWithMessagesOnAFatTree) {
  const ModelProfile profile = hand_profile({{"a", 1 << 16, 1e-3, 2e-3}, {"b", 1 << 18, 1e-3, 2e-3}});
  // Halving-doubling's exchanges at distance 4 and 8 all leave their leaf on its one uplink: Table
  // II's closed form (what the model took before) misses that by far more than the tolerance.
  LinkParameters link;
  link.alpha = 20e-6;
  link.beta = 1.0 / kBandwidth;
  const double table_two = allreduce_cost("halving-doubling", 16, link).time(4.0 * ((1 << 16) + (1 << 18)));
  for (const std::string spec : {"dsync", "pipe", "wfbp"}) {
    for (const std::string algorithm : {"ring", "halving-doubling"}) {
      const MethodSelection selection = select(spec, {{"--allreduce", algorithm}});
      MethodSimulationOptions o = options(16, CollectiveSimulation::kMessages);
      o.topology = parse_sim_topology("fat-tree:2;4,4;1,1;1,1");
      o.iterations = 4;
      const MethodSimulationResult messages = simulate_method(selection, profile, o);
      o.collectives = CollectiveSimulation::kModel;
      const MethodSimulationResult modelled = simulate_method(selection, profile, o);
      EXPECT_EQ(modelled.allreduce, algorithm);
      EXPECT_NEAR(modelled.iteration_seconds, messages.iteration_seconds, 0.01 * messages.iteration_seconds)
          << spec << ", " << algorithm;
      if (spec == "dsync" && algorithm == "halving-doubling") {
        EXPECT_GT(messages.allreduce_seconds, 1.5 * table_two);
      }
    }
  }
}

TEST(MethodSimulation, BadInputIsAUsageError) {
  const ModelProfile profile = hand_profile({{"a", 10, 1e-3, 1e-3}});
  EXPECT_THROW(simulate_method(select("dsync"), profile, options(0)), UsageError);
  MethodSimulationOptions no_network = options(2);
  no_network.link = parse_network_spec("none");
  EXPECT_THROW(simulate_method(select("dsync"), profile, no_network), UsageError);
  MethodSimulationOptions jitter = options(2);
  jitter.compute_jitter = -0.1;
  EXPECT_THROW(simulate_method(select("dsync"), profile, jitter), UsageError);
  EXPECT_THROW(parse_collective_simulation("exact"), UsageError);
}

}  // namespace
}  // namespace pipesgd

namespace pipesgd {
namespace {

TEST(MethodSimulation, PsSyncIsIncastAtTheServer) {
  // M workers push P + 32 bytes each through the server's one NIC (max-min fair sharing: the last
  // push lands after alpha + M (P + 32 + 32) / B with the pull requests), the server updates, the M
  // replies of 8 + 4n bytes
  // leave through the same NIC.
  const int workers = 3;
  const std::size_t n = 1 << 18;
  const ModelProfile profile = hand_profile({{"fc", n, 2e-3, 4e-3}}, 1e-3, 0.6e-3);
  const MethodSimulationResult result = simulate_method(select("pssync"), profile, options(workers));
  const double push = kAlpha + workers * (4.0 * n + 32 + 32) / kBandwidth;  // and the 32-byte pull requests
  const double reply = kAlpha + workers * (4.0 * n + 8) / kBandwidth;
  const double compute = profile.data_seconds + profile.forward_seconds() + profile.backward_seconds();
  EXPECT_NEAR(result.iteration_seconds, compute + push + profile.update_seconds + reply, 1e-9);
  EXPECT_NEAR(result.compute_seconds, compute, 1e-12);  // the update runs on the server
}

TEST(MethodSimulation, OdSgdOverlapsTheRoundTripWithCompute) {
  const int workers = 2;
  const std::size_t n = 1 << 18;
  for (double backward : {1e-3, 40e-3}) {  // round trip longer, then shorter than the computation
    const ModelProfile profile = hand_profile({{"fc", n, 2e-3, backward}}, 1e-3, 0.6e-3);
    const double round_trip = kAlpha + workers * (4.0 * n + 32) / kBandwidth + profile.update_seconds + kAlpha +
                              workers * (4.0 * n + 8) / kBandwidth;
    const double compute = profile.compute_seconds();  // data, forward, backward and the local update
    const MethodSimulationResult result = simulate_method(select("odsgd"), profile, options(workers));
    EXPECT_NEAR(result.iteration_seconds, std::max(compute, round_trip), 1e-9) << "backward " << backward;
  }
}

TEST(MethodSimulation, SapipeEndsAreDsyncAndPipe) {
  // All layers stale without compensation: Pipe-SGD K = 2. No stale layer, one synchronous bucket:
  // D-Sync, but for where the update happens (below).
  const int p = 4;
  const ModelProfile profile = layered_profile({1e-4, 3e-4, 1e-3, 2e-4}, 512);
  const MethodSimulationOptions o = options(p);
  const OptionValues flags{{"--segment-bytes", "none"}};
  const double pipe = simulate_method(select("pipe", flags), profile, o).iteration_seconds;
  const double dsync = simulate_method(select("dsync", flags), profile, o).iteration_seconds;
  OptionValues all_stale = flags;
  all_stale.set("--stale-layers", "4");
  all_stale.set("--compensation", "none");
  EXPECT_NEAR(simulate_method(select("sapipe", all_stale), profile, o).iteration_seconds, pipe, 1e-9);
  OptionValues none_stale = flags;
  none_stale.set("--stale-layers", "0");
  none_stale.set("--buckets", "single");
  const MethodSimulationResult sync = simulate_method(select("sapipe", none_stale), profile, o);
  // The bucket is applied just before layer 0's forward, after the next batch is loaded: its
  // allreduce (longer than the loading here) hides the loading, so D-Sync minus the data time.
  EXPECT_NEAR(sync.iteration_seconds, dsync - profile.data_seconds, 1e-9) << sync.schedule;
  // auto: the least k whose timeline does not stall.
  const MethodSimulationResult automatic = simulate_method(select("sapipe"), profile, o);
  EXPECT_NE(automatic.schedule.find("(auto)"), std::string::npos) << automatic.schedule;
  EXPECT_LE(automatic.iteration_seconds, dsync * (1 + 1e-9));
}

// With the profile's measured cost of a compensation (method_costs "sapipe:wp3": seconds per element
// of the stale range), each pipelined iteration's compensation stage is that cost x the stale
// elements; without it the estimate (two more SGD updates of the stale range) is charged.
TEST(MethodSimulation, SapipeChargesTheProfilesCompensationCost) {
  ModelProfile profile = layered_profile({1e-4, 3e-4, 1e-3, 2e-4}, 512);
  OptionValues flags{{"--segment-bytes", "none"}};
  flags.set("--stale-layers", "2");
  flags.set("--compensation", "wp3");
  MethodSimulationOptions o = options(3);
  o.iterations = 8;
  const MethodSelection selection = select("sapipe", flags);
  std::size_t stale = 0;
  for (std::size_t l = 0; l < 2; ++l) stale += profile.layers[l].parameters;
  const MethodSimulationResult estimated = simulate_method(selection, profile, o);
  EXPECT_NEAR(estimated.stages.compensation, 2 * profile.update_seconds_of(stale), 1e-12);
  profile.method_costs["sapipe:wp3"] = 2e-7;
  const MethodSimulationResult measured = simulate_method(selection, profile, o);
  EXPECT_NEAR(measured.stages.compensation, 2e-7 * static_cast<double>(stale), 1e-12);
  EXPECT_GT(measured.iteration_seconds, estimated.iteration_seconds);
}

struct SpecCase {
  std::string spec;
  int workers;
  std::string allreduce = "";  // --allreduce, if given
};

std::ostream& operator<<(std::ostream& out, const SpecCase& c) {
  return out << c.spec << (c.allreduce.empty() ? "" : " --allreduce " + c.allreduce) << ", " << c.workers << " workers";
}

class EveryMethod : public testing::TestWithParam<SpecCase> {};

TEST_P(EveryMethod, Simulates) {
  const SpecCase& c = GetParam();
  const ModelProfile profile = hand_profile({{"conv", 4096, 1e-3, 2e-3}, {"bn", 128, 1e-4, 2e-4}, {"fc", 65536, 5e-4, 1e-3}});
  MethodSimulationOptions o = options(c.workers, CollectiveSimulation::kAuto);
  o.iterations = 3;
  OptionValues flags;
  if (!c.allreduce.empty()) flags.set("--allreduce", c.allreduce);
  const MethodSelection selection = select(c.spec, flags);
  const MethodSimulationResult result = simulate_method(selection, profile, o);
  EXPECT_GT(result.iteration_seconds, 0);
  EXPECT_GE(result.iteration_seconds, result.compute_seconds * (1 - 1e-9));
  EXPECT_NEAR(result.samples_per_second, c.workers * profile.batch / result.iteration_seconds, 1e-6 * result.samples_per_second);
  EXPECT_EQ(result.collectives, c.workers <= kMessageLevelWorkers ? "messages" : "model");
}

std::vector<SpecCase> every_method_cases() {
  std::vector<SpecCase> cases;
  for (const std::string spec : {"dsync", "dsync+int8", "dsync+bf16", "pipe", "pipe+int8", "wfbp", "synceasgd", "mgwfbp",
                                 "dsync+optimal", "dsync+fixed:1", "sapipe", "sapipe+wp3", "sapipe+dc", "pssync", "asgd",
                                 "dcasgd", "odsgd"}) {
    for (int workers : {1, 2, 3, 64, 1024}) cases.push_back({spec, workers});
  }
  for (const std::string algorithm : {"recursive-doubling", "halving-doubling", "tree", "direct", "auto"}) {
    for (int workers : {1, 2, 3, 64, 1024}) cases.push_back({"dsync", workers, algorithm});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Simulated, EveryMethod, testing::ValuesIn(every_method_cases()),
                         [](const testing::TestParamInfo<SpecCase>& info) {
                           std::string name = info.param.spec + "_" + info.param.allreduce + "_" +
                                              std::to_string(info.param.workers) + "_workers";
                           for (char& ch : name) if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

}  // namespace
}  // namespace pipesgd
