// `pipesgd advise`'s computation (sim/advise.h) without the simulator: the configurations it
// proposes, and the ranking and recommendation from throughputs a stand-in runner gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/sim/advise.h"

namespace pipesgd {
namespace {

AdviseRequest dsync_and_pipe(int workers = 4) {
  AdviseRequest request;
  request.workers = workers;
  request.codecs = {"none"};
  request.methods = {"dsync", "pipe"};
  return request;
}

std::vector<std::string> labels(const std::vector<AdvisedConfiguration>& configurations) {
  std::vector<std::string> result;
  for (const AdvisedConfiguration& configuration : configurations) result.push_back(job_label(configuration.job));
  return result;
}

// A runner that "simulates" each job at the throughput `by_label` gives it (100 otherwise).
SimulationRunner fixed_throughputs(std::map<std::string, double> by_label, std::vector<std::string>* ran = nullptr) {
  return [by_label, ran](const std::vector<SimulationJob>& jobs) {
    std::vector<MethodSimulationResult> results(jobs.size());
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      const auto found = by_label.find(job_label(jobs[i]));
      results[i].samples_per_second = found == by_label.end() ? 100 : found->second;
      if (ran) ran->push_back(job_label(jobs[i]));
    }
    return results;
  };
}

TEST(Advise, ConfigurationsInRegistryOrderWithTheirTrades) {
  const std::vector<AdvisedConfiguration> configurations = advised_configurations(dsync_and_pipe());
  const std::vector<std::string> names = labels(configurations);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "dsync");
  const auto pipe = std::find(names.begin(), names.end(), "pipe --staleness-k 2");
  ASSERT_NE(pipe, names.end());
  for (const AdvisedConfiguration& configuration : configurations) {
    EXPECT_EQ(configuration.job.options.workers, 4);
    EXPECT_EQ(configuration.servers, 0);
    EXPECT_TRUE(configuration.unbuildable.empty());
  }
  EXPECT_TRUE(configurations.front().costs.empty());  // plain D-Sync trades nothing
  const AdvisedConfiguration& stale = configurations[static_cast<std::size_t>(pipe - names.begin())];
  EXPECT_EQ(stale.command_flags, " --staleness-k 2");
  ASSERT_EQ(stale.costs.size(), 1u);
  EXPECT_NE(stale.costs[0].find("staleness"), std::string::npos) << stale.costs[0];
}

TEST(Advise, CodecsMultiplyTheMethodsThatTakeOne) {
  AdviseRequest request = dsync_and_pipe();
  request.codecs = {"none", "int8"};
  const std::vector<std::string> names = labels(advised_configurations(request));
  EXPECT_NE(std::find(names.begin(), names.end(), "dsync+int8"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "pipe+int8 --staleness-k 2"), names.end());
}

TEST(Advise, BadRequestsAreUsageErrors) {
  AdviseRequest request = dsync_and_pipe();
  request.codecs = {"int4"};
  EXPECT_THROW(advised_configurations(request), UsageError);
  request = dsync_and_pipe();
  request.methods = {"nope"};
  EXPECT_THROW(advised_configurations(request), UsageError);
  // Workers alone that do not fit the fat-tree: the user's to fix.
  request = dsync_and_pipe(8);
  request.simulation.topology = parse_sim_topology("fat-tree:2;2,2;1,2;1,1");
  EXPECT_THROW(advised_configurations(request), UsageError);
}

TEST(Advise, ServersThatDoNotFitAreSkippedNotSimulated) {
  AdviseRequest request = dsync_and_pipe(4);
  request.methods = {"dsync", "pssync"};
  request.simulation.topology = parse_sim_topology("fat-tree:2;2,2;1,2;1,1");  // 4 hosts
  std::vector<AdvisedConfiguration> configurations = advised_configurations(request);
  const std::size_t unbuildable = static_cast<std::size_t>(std::count_if(
      configurations.begin(), configurations.end(), [](const AdvisedConfiguration& c) { return !c.unbuildable.empty(); }));
  ASSERT_GT(unbuildable, 0u);
  std::vector<std::string> ran;
  const Advice advice = advise(request, std::move(configurations), fixed_throughputs({}, &ran));
  EXPECT_EQ(advice.skipped.size(), unbuildable);
  EXPECT_EQ(ran.size(), advice.configurations.size() - unbuildable);
  EXPECT_EQ(advice.simulated_jobs.size(), ran.size());
  for (std::size_t i : advice.skipped) {
    EXPECT_NE(advice.results[i].unbuildable.find("--topology"), std::string::npos) << advice.results[i].unbuildable;
    EXPECT_EQ(std::find(advice.ranking.begin(), advice.ranking.end(), i), advice.ranking.end());
  }
}

TEST(Advise, RanksByThroughputAndTiesKeepTheSaferOne) {
  const AdviseRequest request = dsync_and_pipe();
  const Advice advice = advise(request, advised_configurations(request),
                               fixed_throughputs({{"dsync", 50}, {"pipe --staleness-k 3", 300}}));
  const std::vector<std::string> names = labels(advice.configurations);
  ASSERT_EQ(advice.ranking.size(), names.size());
  EXPECT_EQ(names[advice.ranking.front()], "pipe --staleness-k 3");
  EXPECT_EQ(names[advice.ranking.back()], "dsync");
  // The rest run at 100: those without a trade (the layer-wise plans) before K = 2 and K = 4.
  EXPECT_TRUE(advice.configurations[advice.ranking[1]].costs.empty());
  EXPECT_EQ(names[advice.baseline], "dsync");
  EXPECT_DOUBLE_EQ(advice.speedup(advice.ranking.front()), 6.0);
}

TEST(Advise, TradesAccuracyOnlyForAtLeastTheMinimumGain) {
  AdviseRequest request = dsync_and_pipe();
  // K = 2 is 4% faster than the fastest without a trade: below the default 5%.
  const std::map<std::string, double> throughputs = {{"pipe --staleness-k 2", 104}};
  Advice advice = advise(request, advised_configurations(request), fixed_throughputs(throughputs));
  const std::vector<std::string> names = labels(advice.configurations);
  EXPECT_EQ(names[advice.fastest()], "pipe --staleness-k 2");
  ASSERT_TRUE(advice.gain.has_value());
  EXPECT_NEAR(*advice.gain, 0.04, 1e-12);
  ASSERT_TRUE(advice.fastest_without_trade.has_value());
  EXPECT_EQ(advice.recommended, *advice.fastest_without_trade);
  EXPECT_TRUE(advice.configurations[advice.recommended].costs.empty());

  request.min_gain = 0.03;
  advice = advise(request, advised_configurations(request), fixed_throughputs(throughputs));
  EXPECT_EQ(advice.recommended, advice.fastest());

  // The fastest trades nothing: no comparison to make.
  advice = advise(request, advised_configurations(request), fixed_throughputs({{"dsync", 200}}));
  EXPECT_EQ(names[advice.recommended], "dsync");
  EXPECT_FALSE(advice.gain.has_value());
}

TEST(Advise, NothingSimulatedIsAUsageError) {
  AdviseRequest request = dsync_and_pipe(4);
  request.methods = {"pssync"};
  request.simulation.topology = parse_sim_topology("fat-tree:2;2,2;1,2;1,1");
  std::vector<AdvisedConfiguration> configurations = advised_configurations(request);
  for (const AdvisedConfiguration& configuration : configurations) ASSERT_FALSE(configuration.unbuildable.empty());
  EXPECT_THROW(advise(request, std::move(configurations), fixed_throughputs({})), UsageError);
}

}  // namespace
}  // namespace pipesgd
