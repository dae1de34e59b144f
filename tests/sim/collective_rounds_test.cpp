// The modelled collectives (sim/collective_rounds.h): an allreduce's rounds played on the simulated
// network. On a flat switch with the ideal model they are MG-WFBP Table II; on a contended network
// they agree with the message-level simulation of the runtime's own algorithm, where Table II does
// not. Every time here is simulated time (deterministic), not this machine's clock.
#include "pipesgd/sim/collective_rounds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <set>
#include <string>

#include "pipesgd/collective/allreduce_algorithms.h"
#include "pipesgd/collective/allreduce_rounds.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/sim/collective_simulation.h"
#include "pipesgd/timing/allreduce_cost_model.h"

namespace pipesgd {
namespace {

constexpr double kBandwidth = 1.25e9;  // bytes/s: 10 Gbit/s
constexpr double kLatency = 20e-6;     // s, one way

SimPlatformSpec flat(int hosts) {
  SimPlatformSpec platform;
  platform.hosts = hosts;
  platform.link = parse_network_spec("bw=10Gbit,lat=20us");
  platform.model = SimNetworkModel::kIdeal;
  return platform;
}

struct RoundsCase {
  std::string algorithm;
  int ranks;
};
std::ostream& operator<<(std::ostream& out, const RoundsCase& c) { return out << c.algorithm << ", " << c.ranks << " ranks"; }

std::vector<RoundsCase> rounds_cases() {
  std::vector<RoundsCase> cases;
  for (const std::string& algorithm : allreduce_algorithm_names()) {
    for (int ranks : {1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 33, 64}) cases.push_back({std::string(algorithm), ranks});
  }
  return cases;
}

class AllreduceRoundsTest : public ::testing::TestWithParam<RoundsCase> {};

// Summed over the rounds: the messages on the critical path, the bytes the busiest rank sends and
// the bytes reduced are allreduce_coefficients()'s (direct's messages of a round travel at once).
TEST_P(AllreduceRoundsTest, SumToTableTwoCoefficients) {
  const RoundsCase& c = GetParam();
  const std::vector<AllreduceRound> rounds = allreduce_rounds(c.algorithm, c.ranks);
  const AllreduceCoefficients expected = allreduce_coefficients(c.algorithm, c.ranks);
  double messages = 0, reduced = 0, sent = 0;
  for (const AllreduceRound& round : rounds) {
    ASSERT_FALSE(round.flows.empty());
    ASSERT_TRUE(std::is_sorted(round.flows.begin(), round.flows.end()));
    std::vector<int> out(static_cast<std::size_t>(c.ranks), 0);
    for (const AllreduceFlow& flow : round.flows) {
      ASSERT_TRUE(flow.from >= 0 && flow.from < c.ranks && flow.to >= 0 && flow.to < c.ranks && flow.from != flow.to);
      ++out[static_cast<std::size_t>(flow.from)];
    }
    messages += round.repeat;
    reduced += round.repeat * round.reduced;
    sent += round.repeat * round.fraction * *std::max_element(out.begin(), out.end());
  }
  if (c.algorithm == "direct") {
    EXPECT_EQ(messages, c.ranks > 1 ? 2 : 0);
  } else {
    EXPECT_DOUBLE_EQ(messages, expected.messages);
  }
  EXPECT_NEAR(reduced, expected.reduced, 1e-12);
  // The tree's busiest rank sends to two children; Table II counts one message per level.
  if (c.algorithm != "tree") {
    EXPECT_NEAR(sent, expected.transferred, 1e-12);
  }
}

// Every rank takes part in the pattern (sends or receives in some round).
TEST_P(AllreduceRoundsTest, EveryRankTakesPart) {
  const RoundsCase& c = GetParam();
  std::set<int> seen;
  for (const AllreduceRound& round : allreduce_rounds(c.algorithm, c.ranks)) {
    for (const AllreduceFlow& flow : round.flows) {
      seen.insert(flow.from);
      seen.insert(flow.to);
    }
  }
  EXPECT_EQ(seen.size(), c.ranks > 1 ? static_cast<std::size_t>(c.ranks) : 0u);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllreduceRoundsTest, ::testing::ValuesIn(rounds_cases()),
                         [](const auto& info) {
                           std::string name = info.param.algorithm + "_" + std::to_string(info.param.ranks);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(AllreduceRounds, BadInputIsAUsageError) {
  EXPECT_THROW(allreduce_rounds("butterfly", 4), UsageError);
  EXPECT_THROW(allreduce_rounds("ring", 0), UsageError);
  EXPECT_THROW(model_allreduce("butterfly", flat(4)), UsageError);
}

// Flat switch, ideal model, no contention: the rounds are Table II's a + b·M exactly.
TEST(ModelledAllreduce, FlatIdealIsTableTwo) {
  LinkParameters link;
  link.alpha = kLatency;
  link.beta = 1.0 / kBandwidth;
  for (const std::string algorithm : {"ring", "recursive-doubling", "halving-doubling"}) {
    for (int p : {2, 3, 4, 8, 13, 64}) {
      const ModelledAllreduce model = model_allreduce(algorithm, flat(p));
      const LinearCost expected = allreduce_cost(algorithm, p, link);
      EXPECT_NEAR(model.latency_seconds, expected.a, 1e-9 * expected.a) << algorithm << ", " << p << " ranks";
      EXPECT_NEAR(model.seconds_per_byte, expected.b, 1e-9 * expected.b) << algorithm << ", " << p << " ranks";
      EXPECT_DOUBLE_EQ(model.reduced_bytes_per_byte, allreduce_coefficients(algorithm, p).reduced);
    }
  }
  EXPECT_EQ(model_allreduce("ring", flat(64)).distinct_rounds, 1);
  EXPECT_EQ(model_allreduce("ring", flat(1)).rounds, 0);
}

// Direct's all-to-all above 64 workers is played as its permutations one after another (bytes
// add up, one latency; sim/collective_rounds.cpp): on a flat switch that is the concurrent round,
// i.e. one latency per round and Table II's bytes.
TEST(ModelledAllreduce, LargeAllToAllIsPlayedAsPermutations) {
  for (int p : {64, 65, 300}) {
    const ModelledAllreduce model = model_allreduce("direct", flat(p));
    const double per_byte = 2.0 * (p - 1) / p / kBandwidth;
    EXPECT_NEAR(model.latency_seconds, 2 * kLatency, 1e-9 * kLatency) << p << " ranks";
    EXPECT_NEAR(model.seconds_per_byte, per_byte, 1e-9 * per_byte) << p << " ranks";
  }
}

// The tree's parent receives from two children at once on one link: the rounds see it, Table II
// does not (one message time per level).
TEST(ModelledAllreduce, TreeChildrenShareTheirParentsLink) {
  const ModelledAllreduce model = model_allreduce("tree", flat(7));  // depth 2, every parent has 2 children
  // Up: 2 levels, each 2 messages into a parent's link; down: 2 levels, 2 messages out of it.
  EXPECT_NEAR(model.seconds_per_byte, 8.0 / kBandwidth, 1e-9 * 8.0 / kBandwidth);
  EXPECT_NEAR(model.latency_seconds, 4 * kLatency, 1e-9 * 4 * kLatency);
}

struct AgreementCase {
  std::string algorithm;
  int ranks;
  std::string topology;
  SimNetworkModel model;
  double tolerance;  // relative
};
std::ostream& operator<<(std::ostream& out, const AgreementCase& c) {
  return out << c.algorithm << ", " << c.ranks << " ranks, " << c.topology << ", " << sim_network_model_name(c.model)
             << ", within " << c.tolerance * 100 << "%";
}

class ModelledAgreesWithMessages : public ::testing::TestWithParam<AgreementCase> {};

// The modelled allreduce against the message-level simulation of the runtime's algorithm, whole
// vector in one message per step (segmenting is a cache measure of the runtime, not the network's).
TEST_P(ModelledAgreesWithMessages, WithinTolerance) {
  const AgreementCase& c = GetParam();
  SimPlatformSpec platform = flat(c.ranks);
  platform.topology = parse_sim_topology(c.topology);
  platform.model = c.model;
  for (std::size_t count : {std::size_t{1024}, std::size_t{2621440}}) {
    CollectiveScenario scenario;
    scenario.algorithm = c.algorithm;
    scenario.count = count / static_cast<std::size_t>(c.ranks) * static_cast<std::size_t>(c.ranks);
    scenario.segment_bytes = kUnsegmented;
    scenario.platform = platform;
    const double messages = simulate_allreduce(scenario).simulated_seconds;
    const double modelled = model_allreduce(c.algorithm, platform).seconds(4.0 * static_cast<double>(scenario.count));
    EXPECT_NEAR(modelled, messages, c.tolerance * messages) << scenario.count << " elements";
  }
}

std::vector<AgreementCase> agreement_cases() {
  std::vector<AgreementCase> cases;
  // 16 hosts, 4 per leaf switch on 1 uplink (4:1): the ring's and the exchanges' flows that leave a
  // leaf share its uplink.
  const std::string oversubscribed = "fat-tree:2;4,4;1,1;1,1";
  const auto ideal = SimNetworkModel::kIdeal;
  const auto lv08 = SimNetworkModel::kSimGrid;
  for (const std::string algorithm : {"ring", "recursive-doubling", "halving-doubling", "direct"}) {
    for (int ranks : {2, 4, 16}) {
      cases.push_back({algorithm, ranks, "flat", ideal, 0.01});
      // direct's p-1 flows of a round leave the leaf at slightly different times in the message-level
      // simulation (latency-bound vectors differ by 2.3% at 5 ranks).
      cases.push_back({algorithm, ranks, oversubscribed, ideal, algorithm == "direct" ? 0.03 : 0.01});
    }
    cases.push_back({algorithm, 16, "flat", lv08, 0.01});
    // LV08 on the oversubscribed tree: the message-level ring's ranks drift apart by steps, so its
    // flows (and their acknowledgements' cross-traffic) share the uplinks differently: the rounds
    // are 11% short for 10 MB.
    cases.push_back({algorithm, 16, oversubscribed, lv08, 0.15});
  }
  cases.push_back({"ring", 5, "flat", ideal, 0.01});
  cases.push_back({"ring", 5, oversubscribed, ideal, 0.07});
  cases.push_back({"direct", 5, oversubscribed, ideal, 0.03});
  return cases;
}

// Beyond a power of two, recursive-doubling and halving-doubling fold the extra ranks in. The
// runtime sends eagerly: the first exchange's message to a paired rank arrives while the fold's
// message still does, on the same link. The synchronised rounds do not see that overlap, so they
// are short there (18-27% at 5 ranks, 10 MB), and never long.
TEST(ModelledAllreduce, FoldOverlapIsMissedInOneDirection) {
  for (const std::string algorithm : {"recursive-doubling", "halving-doubling"}) {
    CollectiveScenario scenario;
    scenario.algorithm = algorithm;
    scenario.count = 2621440;
    scenario.segment_bytes = kUnsegmented;
    scenario.platform = flat(5);
    const double messages = simulate_allreduce(scenario).simulated_seconds;
    const double modelled = model_allreduce(algorithm, scenario.platform).seconds(4.0 * 2621440);
    EXPECT_LE(modelled, messages) << algorithm;
    EXPECT_GE(modelled, 0.7 * messages) << algorithm;
  }
}

INSTANTIATE_TEST_SUITE_P(Networks, ModelledAgreesWithMessages, ::testing::ValuesIn(agreement_cases()),
                         [](const auto& info) {
                           std::string name = info.param.algorithm + "_" + std::to_string(info.param.ranks) + "_" +
                                              (info.param.topology == "flat" ? "flat" : "fattree") + "_" +
                                              sim_network_model_name(info.param.model);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The oversubscribed fat-tree is where Table II's closed form misses: the test above can fail.
TEST(ModelledAllreduce, OversubscriptionSlowsTheRingBeyondTableTwo) {
  SimPlatformSpec platform = flat(16);
  platform.topology = parse_sim_topology("fat-tree:2;4,4;1,1;1,1");
  LinkParameters link;
  link.alpha = kLatency;
  link.beta = 1.0 / kBandwidth;
  const double bytes = 1e8;
  const double table_two = allreduce_cost("halving-doubling", 16, link).time(bytes);
  EXPECT_GT(model_allreduce("halving-doubling", platform).seconds(bytes), 1.5 * table_two);
}

}  // namespace
}  // namespace pipesgd
