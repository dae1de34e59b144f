// The message-level simulation of the runtime's allreduces (sim/collective_simulation.h) against
// the closed forms of Pipe-SGD Eq. 5 and MG-WFBP Table II on the ideal network model. Every time
// here is simulated time, which SimGrid computes deterministically: bounds on it are closed forms
// of the model, not limits on how long anything takes on this machine.
#include "pipesgd/sim/collective_simulation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/sim/isolated_run.h"
#include "pipesgd/timing/allreduce_cost_model.h"

namespace pipesgd {
namespace {

constexpr double kBandwidth = 1.25e9;  // bytes/s: 10 Gbit/s
constexpr double kLatency = 20e-6;     // s, one way

CollectiveScenario scenario(const std::string& algorithm, int ranks, std::size_t count) {
  CollectiveScenario s;
  s.algorithm = algorithm;
  s.count = count;
  s.segment_bytes = kUnsegmented;
  s.platform.hosts = ranks;
  s.platform.link = parse_network_spec("bw=10Gbit,lat=20us");
  s.platform.model = SimNetworkModel::kIdeal;
  return s;
}

TEST(CollectiveSimulation, RingIsPipeSgdEquation5) {
  // Eq. 5 without the synchronisation term: 2(p-1)(alpha + (M/p) beta), M bytes per rank.
  for (int p : {2, 3, 4, 5, 8}) {
    const std::size_t count = 650000 / p * p;  // chunks of equal size
    const double bytes = 4.0 * static_cast<double>(count);
    const CollectiveResult result = simulate_allreduce(scenario("ring", p, count));
    const double expected = 2.0 * (p - 1) * (kLatency + bytes / p / kBandwidth);
    EXPECT_NEAR(result.simulated_seconds, expected, 1e-9 * expected) << p << " ranks";
    EXPECT_EQ(result.bytes_sent_per_rank, static_cast<std::uint64_t>(2.0 * (p - 1) * bytes / p)) << p << " ranks";
    EXPECT_EQ(result.max_abs_error, 0.0) << p << " ranks";
  }
}

TEST(CollectiveSimulation, ReductionCostIsMgWfbpTableTwo) {
  // Table II, ring: 2(p-1) alpha + 2(p-1)/p M beta + (p-1)/p M gamma, gamma charged per fp32 byte
  // summed (the codec's decode-add).
  const double gamma = 0.25e-9;
  for (int p : {2, 4, 8}) {
    CollectiveScenario s = scenario("ring", p, 262144);
    s.codec_cost.decode_add = gamma;
    const double bytes = 4.0 * 262144;
    const double expected = 2.0 * (p - 1) * kLatency + 2.0 * (p - 1) / p * bytes / kBandwidth +
                            (p - 1.0) / p * bytes * gamma;
    EXPECT_NEAR(simulate_allreduce(s).simulated_seconds, expected, 1e-9 * expected) << p << " ranks";
  }
}

TEST(CollectiveSimulation, PowerOfTwoAlgorithmsAreTableTwo) {
  // Recursive doubling: log2(p) (alpha + M beta + M gamma); halving-doubling:
  // 2 log2(p) alpha + 2(p-1)/p M beta + (p-1)/p M gamma.
  const double gamma = 0.25e-9;
  const double bytes = 4.0 * 65536;
  for (int p : {2, 4, 8}) {
    const double steps = std::log2(p);
    CollectiveScenario rd = scenario("recursive-doubling", p, 65536);
    rd.codec_cost.decode_add = gamma;
    const double rd_expected = steps * (kLatency + bytes / kBandwidth + bytes * gamma);
    EXPECT_NEAR(simulate_allreduce(rd).simulated_seconds, rd_expected, 1e-9 * rd_expected) << p << " ranks";
    CollectiveScenario hd = scenario("halving-doubling", p, 65536);
    hd.codec_cost.decode_add = gamma;
    const double hd_expected = 2 * steps * kLatency + 2.0 * (p - 1) / p * bytes / kBandwidth +
                               (p - 1.0) / p * bytes * gamma;
    EXPECT_NEAR(simulate_allreduce(hd).simulated_seconds, hd_expected, 1e-9 * hd_expected) << p << " ranks";
  }
}

struct AlgorithmCase {
  std::string algorithm;
  int ranks;
  std::size_t count;
  std::string codec;
};

std::ostream& operator<<(std::ostream& out, const AlgorithmCase& c) {
  return out << c.algorithm << ", " << c.ranks << " ranks, " << c.count << " elements, " << c.codec;
}

class EveryAlgorithm : public testing::TestWithParam<AlgorithmCase> {};

TEST_P(EveryAlgorithm, SumsAreRightAndTimeIsPositive) {
  const AlgorithmCase& c = GetParam();
  CollectiveScenario s = scenario(c.algorithm, c.ranks, c.count);
  s.codec = c.codec;
  s.segment_bytes = kDefaultSegmentBytes;
  s.repetitions = 2;
  const CollectiveResult result = simulate_allreduce(s);
  if (c.ranks == 1) {
    EXPECT_EQ(result.simulated_seconds, 0.0);
    EXPECT_EQ(result.bytes_sent_per_rank, 0u);
  } else if (c.count == 0) {
    // Nothing to move: the simulated time is whole message latencies of empty messages. Ring,
    // recursive and halving-doubling send every message of Table II's count in sequence; direct's
    // p-1 messages of each of its two rounds travel at once; the tree sends no empty segment, so
    // it has at most its count.
    const double latencies = result.simulated_seconds / kLatency;
    EXPECT_NEAR(latencies, std::round(latencies), 1e-6);
    const long messages = std::lround(allreduce_coefficients(c.algorithm, c.ranks).messages);
    if (c.algorithm == "direct") {
      EXPECT_EQ(std::lround(latencies), 2);
    } else if (c.algorithm == "tree") {
      EXPECT_LE(std::lround(latencies), messages);
    } else {
      EXPECT_EQ(std::lround(latencies), messages);
    }
  } else {
    EXPECT_GT(result.simulated_seconds, kLatency);
    EXPECT_GT(result.bytes_sent_per_rank, 0u);
  }
  // Inputs are multiples of 1/4 in [-2, 2]: exact sums for none; bf16 and int8 within their bounds.
  const double largest = 2.0 * c.ranks;
  const double bound = c.codec == "none" ? 0.0 : c.codec == "bf16" ? 2 * c.ranks * largest / 128 : 2 * c.ranks * largest / 127;
  EXPECT_LE(result.max_abs_error, bound);
}

std::vector<AlgorithmCase> every_algorithm_cases() {
  std::vector<AlgorithmCase> cases;
  for (const std::string& algorithm : allreduce_algorithm_names()) {
    for (int ranks : {1, 2, 3, 5}) {
      for (std::size_t count : {std::size_t{0}, std::size_t{2}, std::size_t{100003}}) {
        cases.push_back({algorithm, ranks, count, "none"});
      }
    }
    for (const char* codec : {"bf16", "int8"}) cases.push_back({algorithm, 3, 100003, codec});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Simulated, EveryAlgorithm, testing::ValuesIn(every_algorithm_cases()),
                         [](const testing::TestParamInfo<AlgorithmCase>& info) {
                           std::string name = info.param.algorithm + "_" + std::to_string(info.param.ranks) +
                                              "ranks_" + std::to_string(info.param.count) + "_" + info.param.codec;
                           for (char& ch : name) if (ch == '-') ch = '_';
                           return name;
                         });

TEST(CollectiveSimulation, IsDeterministic) {
  CollectiveScenario s = scenario("ring", 5, 300001);
  s.segment_bytes = kDefaultSegmentBytes;
  s.platform.model = SimNetworkModel::kSimGrid;
  s.codec = "int8";
  s.codec_cost = {0.3e-9, 0.2e-9, 0.4e-9};
  const CollectiveResult first = simulate_allreduce(s);
  const CollectiveResult second = simulate_allreduce(s);
  EXPECT_EQ(first.simulated_seconds, second.simulated_seconds);
  EXPECT_EQ(first.bytes_sent_per_rank, second.bytes_sent_per_rank);
}

TEST(CollectiveSimulation, SimGridModelIsSlowerThanIdeal) {
  // LV08 multiplies latency by 13.01 and bandwidth by 0.97 (documented in sim/platform.h).
  CollectiveScenario s = scenario("ring", 4, 650000);
  const double ideal = simulate_allreduce(s).simulated_seconds;
  s.platform.model = SimNetworkModel::kSimGrid;
  const double simgrid = simulate_allreduce(s).simulated_seconds;
  EXPECT_GT(simgrid, ideal * 1.02);
}

TEST(CollectiveSimulation, BadInputIsAUsageError) {
  EXPECT_THROW(simulate_allreduce(scenario("butterfly", 2, 10)), UsageError);
  CollectiveScenario codec = scenario("ring", 2, 10);
  codec.codec = "int4";
  EXPECT_THROW(simulate_allreduce(codec), UsageError);
  EXPECT_THROW(simulate_allreduce(scenario("ring", 0, 10)), UsageError);
  CollectiveScenario no_bandwidth = scenario("ring", 2, 10);
  no_bandwidth.platform.link = parse_network_spec("none");
  EXPECT_THROW(simulate_allreduce(no_bandwidth), UsageError);
}

TEST(IsolatedRun, ReturnsTheResultAndRethrowsCheckedErrors) {
  EXPECT_EQ(run_isolated("test", [] { return std::string("from the child"); }), "from the child");
  try {
    run_isolated("test", []() -> std::string { throw DataError("broken profile"); });
    FAIL() << "no exception";
  } catch (const DataError& error) {
    EXPECT_STREQ(error.what(), "broken profile");
  }
  EXPECT_THROW(run_isolated("test", []() -> std::string { throw UsageError("bad flag"); }), UsageError);
}

TEST(IsolatedRun, AChildThatDiesIsAnError) {
  try {
    run_isolated("dying simulation", []() -> std::string { std::abort(); });
    FAIL() << "no exception";
  } catch (const UsageError&) {
    FAIL() << "not a usage error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("dying simulation: the simulation process died of signal 6"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace pipesgd

namespace pipesgd {
namespace {

TEST(CollectiveSimulation, FatTreeOversubscriptionSlowsCrossLeafTraffic) {
  // 8 hosts, leaf switches of 4. Halving-doubling's first step pairs hosts 4 apart: all 4 hosts of a
  // leaf send across it at once, through 1 uplink (4:1) or 4 (non-blocking).
  CollectiveScenario s = scenario("halving-doubling", 8, 1 << 20);
  s.platform.topology = parse_sim_topology("fat-tree:2;4,2;1,4;1,1");
  const double non_blocking = simulate_allreduce(s).simulated_seconds;
  s.platform.topology = parse_sim_topology("fat-tree:2;4,2;1,1;1,1");
  const double oversubscribed = simulate_allreduce(s).simulated_seconds;
  EXPECT_GT(oversubscribed, 1.5 * non_blocking);
  // The ring's neighbours share a leaf but at two places, one flow per uplink and direction: the
  // oversubscription costs it only the extra level's latency, as on the non-blocking tree.
  CollectiveScenario ring = scenario("ring", 8, 1 << 20);
  ring.platform.topology = parse_sim_topology("fat-tree:2;4,2;1,1;1,1");
  const double ring_oversubscribed = simulate_allreduce(ring).simulated_seconds;
  ring.platform.topology = parse_sim_topology("fat-tree:2;4,2;1,4;1,1");
  EXPECT_NEAR(ring_oversubscribed, simulate_allreduce(ring).simulated_seconds, 1e-9);
}

TEST(SimTopology, ParsesFlatAndFatTreesAndRejectsTheRest) {
  EXPECT_FALSE(parse_sim_topology("flat").fat_tree);
  const SimTopology tree = parse_sim_topology("fat-tree:2;16,4;1,4;1,1");
  EXPECT_TRUE(tree.fat_tree);
  EXPECT_EQ(tree.leaves(), 64u);
  for (const char* bad : {"star", "fat-tree:", "fat-tree:2;16,4;1,4", "fat-tree:2;16;1,4;1,1", "fat-tree:2;16,0;1,4;1,1",
                          "fat-tree:x;1;1;1", "fat-tree:9;1,1,1,1,1,1,1,1,1;1,1,1,1,1,1,1,1,1;1,1,1,1,1,1,1,1,1"}) {
    EXPECT_THROW(parse_sim_topology(bad), UsageError) << bad;
  }
  CollectiveScenario too_small = scenario("ring", 8, 10);
  too_small.platform.topology = parse_sim_topology("fat-tree:1;4;1;1");
  EXPECT_THROW(simulate_allreduce(too_small), UsageError);
}

}  // namespace
}  // namespace pipesgd
