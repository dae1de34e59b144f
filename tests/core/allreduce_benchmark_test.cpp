// Tests of the allreduce benchmark's timing (tools/allreduce_benchmark.h): a row measures its own
// algorithm from a common start, whatever ran before it, and a failing rank stops the others.
#include "pipesgd/tools/allreduce_benchmark.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/comm/local_transport.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

// A 1 ms latency: far above what a 4 KiB message costs in software.
NetworkSpec slow_link() { return parse_network_spec("bw=10Gbit,lat=1ms"); }

AllreduceBenchmarkConfig small_config() {
  AllreduceBenchmarkConfig config;
  config.sizes_bytes = {4096};
  config.repeats = 3;
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

// The oracle: the bytes rank 0 sends in one run of `candidate` alone, on a fabric of its own.
std::uint64_t rank0_bytes_of_one_run(const AllreduceCandidate& candidate, int ranks, std::size_t bytes) {
  LocalFabric fabric(ranks);
  const std::unique_ptr<Codec> codec = make_codec(candidate.codec);
  std::vector<std::uint64_t> sent(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      Transport& transport = fabric.endpoint(rank);
      std::vector<float> data(bytes / sizeof(float), 1.0f);
      candidate.build(transport, data.size(), *codec)->run(data, collective_tag(Channel::kBenchmark, 0));
      sent[static_cast<std::size_t>(rank)] = transport.bytes_sent();
    });
  }
  for (auto& thread : threads) thread.join();
  return sent[0];
}

// A row must not depend on what ran before it. It did when the ranks met at a barrier that was
// itself an allreduce over the emulated links: ranks left it up to one latency apart (the tree's
// root finishes a latency before its leaf), and the next run paid for the skew (recursive doubling
// measured two latencies after tree, one alone). The ranks now meet outside the measured links: over
// every run, barriers included, rank 0 sends exactly what the algorithm alone sends, whatever ran
// before it. (Times are printed, not asserted beyond the latencies each algorithm must wait.)
class AllreduceBenchmarkOrder : public ::testing::TestWithParam<int> {};

TEST_P(AllreduceBenchmarkOrder, RanksMeetOutsideTheMeasuredLinks) {
  const int ranks = GetParam();
  const std::vector<AllreduceCandidate> candidates =
      our_allreduce_candidates({"tree", "recursive-doubling", "ring"}, {"none", "int8"}, {});
  const auto rows = run_local_allreduce_benchmark(ranks, slow_link(), candidates, small_config(), nullptr);
  ASSERT_EQ(rows.size(), candidates.size());
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    const AllreduceBenchmarkRow& row = rows[c];
    SCOPED_TRACE(row.algorithm + " " + row.codec);
    std::printf("%d ranks, %s %s: %.2f ms\n", ranks, row.algorithm.c_str(), row.codec.c_str(),
                row.median_seconds * 1e3);
    EXPECT_TRUE(row.correct);
    EXPECT_EQ(row.rank0_bytes_sent_per_run, rank0_bytes_of_one_run(candidates[c], ranks, 4096));
    // Lower bounds are safe: the emulator delivers no message before its latency.
    if (ranks > 1) {
      EXPECT_GE(row.median_seconds, 1e-3);
    }
  }
  // Recursive doubling at 2 ranks is one exchange: one latency; the tree two (leaf -> root -> leaf).
  if (ranks == 2) {
    EXPECT_GE(row_of(rows, "tree").median_seconds, 2e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllreduceBenchmarkOrder, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

// A rank that fails stops the others at the barrier at once (not after the timeout, which would
// end them with a CommTimeoutError), and the benchmark rethrows its error rather than their
// PeerFailedError.
TEST(AllreduceBenchmark, FailingRankStopsTheOthersWithItsError) {
  std::vector<AllreduceCandidate> candidates = our_allreduce_candidates({"ring"}, {"none"}, {});
  const auto build_ring = candidates[0].build;
  candidates[0].build = [build_ring](Transport& transport, std::size_t count, const Codec& codec) {
    if (transport.rank() == 1) throw CommError("rank 1 cannot build its allreduce");
    return build_ring(transport, count, codec);
  };
  AllreduceBenchmarkConfig config = small_config();
  config.timeout = 30s;
  try {
    run_local_allreduce_benchmark(3, NetworkSpec{}, candidates, config, nullptr);
    FAIL() << "expected the failing rank's error";
  } catch (const PeerFailedError& error) {
    FAIL() << "rethrew a peer's error instead of the root cause: " << error.what();
  } catch (const CommTimeoutError& error) {
    // A barrier timeout names no peer, so it would be the root cause: the others waited for it.
    FAIL() << "the others were not released by the failure: " << error.what();
  } catch (const CommError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot build"), std::string::npos) << error.what();
  }
}


// A row's CPU time per byte: the mean over ranks and timed runs of the running thread's CPU time,
// per fp32 byte. A ring over 1 MiB costs some; a candidate that keeps each rank's processor busy for
// at least 2 ms per run costs at least 2 ms / bytes, however many ranks and repeats there are.
class SpinningAllreduce final : public Allreduce {
 public:
  std::string_view name() const override { return "spinning"; }
  void run(std::span<float>, Tag) override {
    const double start = thread_cpu_seconds();
    volatile std::uint64_t turns = 0;
    while (thread_cpu_seconds() - start < kSpinSeconds) turns = turns + 1;
  }
  static constexpr double kSpinSeconds = 0.002;
};

TEST(AllreduceBenchmarkCpu, EveryRowHasItsCpuTimePerByte) {
  constexpr std::size_t kBytes = std::size_t{1} << 20;
  std::vector<AllreduceCandidate> candidates = our_allreduce_candidates({"ring"}, {"none", "int8"}, {});
  AllreduceCandidate spinning;
  spinning.algorithm = "spinning";
  spinning.codec = "none";
  spinning.build = [](Transport&, std::size_t, const Codec&) { return std::make_unique<SpinningAllreduce>(); };
  candidates.push_back(spinning);
  AllreduceBenchmarkConfig config = small_config();
  config.sizes_bytes = {kBytes};
  for (int ranks : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << ranks << " ranks");
    const auto rows = run_local_allreduce_benchmark(ranks, NetworkSpec{}, candidates, config, nullptr);
    ASSERT_EQ(rows.size(), candidates.size());
    for (const AllreduceBenchmarkRow& row : rows) {
      SCOPED_TRACE(row.algorithm + " " + row.codec);
      EXPECT_TRUE(std::isfinite(row.cpu_seconds_per_byte));
      EXPECT_GT(row.cpu_seconds_per_byte, 0.0);
      if (row.algorithm == "ring") {
        EXPECT_TRUE(row.correct);
      }
    }
    EXPECT_GE(row_of(rows, "spinning").cpu_seconds_per_byte, SpinningAllreduce::kSpinSeconds / kBytes);
  }
}

}  // namespace
}  // namespace pipesgd
