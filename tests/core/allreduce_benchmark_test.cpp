// Tests of the allreduce benchmark's timing (train/allreduce_benchmark.h): a row measures its own
// algorithm from a common start, whatever ran before it, and a failing rank stops the others.
#include "pipesgd/train/allreduce_benchmark.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

// One latency dwarfs scheduler noise (runs measured up to ~10 ms long with two busy loops on two
// cores), so a skew of one latency is unmistakable.
constexpr double kLatencySeconds = 0.050;

NetworkSpec slow_link() { return parse_network_spec("bw=10Gbit,lat=50ms"); }

AllreduceBenchmarkConfig small_config() {
  AllreduceBenchmarkConfig config;
  config.sizes_bytes = {4096};
  config.repeats = 7;
  config.warmup = 1;
  config.timeout = 60s;  // only reached if the benchmark hangs
  return config;
}

const AllreduceBenchmarkRow& row_of(const std::vector<AllreduceBenchmarkRow>& rows,
                                    const std::string& algorithm) {
  for (const auto& row : rows) {
    if (row.algorithm == algorithm) return row;
  }
  throw std::runtime_error("no row for " + algorithm);
}

// Recursive doubling at 2 ranks is one exchange: one latency. The tree's root finishes about a
// latency before its leaf; a barrier over the emulated links passed that skew on to the next run
// (recursive doubling then measured two latencies after tree, one alone).
TEST(AllreduceBenchmark, RowDoesNotDependOnTheAlgorithmBeforeIt) {
  const auto alone = run_local_allreduce_benchmark(
      2, slow_link(), our_allreduce_candidates({"recursive-doubling"}, {"none"}, {}), small_config(),
      nullptr);
  const auto after_tree = run_local_allreduce_benchmark(
      2, slow_link(), our_allreduce_candidates({"tree", "recursive-doubling"}, {"none"}, {}),
      small_config(), nullptr);
  const double alone_seconds = row_of(alone, "recursive-doubling").median_seconds;
  const double after_tree_seconds = row_of(after_tree, "recursive-doubling").median_seconds;
  const double tree_seconds = row_of(after_tree, "tree").median_seconds;
  std::printf("recursive-doubling alone %.2f ms, after tree %.2f ms; tree %.2f ms (latency %.0f ms)\n",
              alone_seconds * 1e3, after_tree_seconds * 1e3, tree_seconds * 1e3, kLatencySeconds * 1e3);
  EXPECT_TRUE(row_of(alone, "recursive-doubling").correct);
  EXPECT_TRUE(row_of(after_tree, "recursive-doubling").correct);
  // Lower bounds are safe: the emulator delivers no message before its latency.
  EXPECT_GE(alone_seconds, kLatencySeconds);
  EXPECT_GE(after_tree_seconds, kLatencySeconds);
  EXPECT_GE(tree_seconds, 2 * kLatencySeconds);  // leaf -> root -> leaf
  EXPECT_LT(std::fabs(after_tree_seconds - alone_seconds), 0.5 * kLatencySeconds);
}

// A rank that fails stops the others at the barrier at once (not after the timeout), and the
// benchmark rethrows its error rather than their PeerFailedError.
TEST(AllreduceBenchmark, FailingRankStopsTheOthersWithItsError) {
  std::vector<AllreduceCandidate> candidates = our_allreduce_candidates({"ring"}, {"none"}, {});
  const auto build_ring = candidates[0].build;
  candidates[0].build = [build_ring](Transport& transport, std::size_t count, const Codec& codec) {
    if (transport.rank() == 1) throw CommError("rank 1 cannot build its allreduce");
    return build_ring(transport, count, codec);
  };
  AllreduceBenchmarkConfig config = small_config();
  config.timeout = 30s;
  Stopwatch elapsed;
  try {
    run_local_allreduce_benchmark(3, NetworkSpec{}, candidates, config, nullptr);
    FAIL() << "expected the failing rank's error";
  } catch (const PeerFailedError& error) {
    FAIL() << "rethrew a peer's error instead of the root cause: " << error.what();
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot build"), std::string::npos) << error.what();
  }
  EXPECT_LT(elapsed.seconds(), 15.0);  // half the timeout: the others did not wait for it
}

}  // namespace
}  // namespace pipesgd
