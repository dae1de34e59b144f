// The sharded parameter server's core: ShardPlan balancing, synchronous and asynchronous serving
// over LocalFabric (workers are ranks 0..M-1, servers ranks M..M+S-1), and timeouts.
#include "pipesgd/ps/parameter_server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <limits>
#include <ostream>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "pipesgd/comm/local_transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/layout.h"
#include "pipesgd/optim/delay_compensation.h"
#include "pipesgd/optim/sgd.h"
#include "pipesgd/ps/shard_plan.h"
#include "test_world.h"

namespace pipesgd {
namespace {

// gmock is not linked: a substring check with a readable failure.
#define EXPECT_CONTAINS(text, part)                          \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "\"" << (text) << "\" lacks \"" << (part) << "\""
constexpr Timeout kWait{10000};

Layout make_layout(const std::vector<std::size_t>& counts) {
  Layout layout;
  for (std::size_t i = 0; i < counts.size(); ++i) layout.add("seg" + std::to_string(i), counts[i]);
  return layout;
}

// Odd segment sizes; 18 elements.
Layout small_layout() { return make_layout({3, 5, 1, 7, 2}); }

// Smallest possible largest shard over every split of `counts` into `servers` contiguous non-empty
// runs, by enumerating all cut positions.
std::size_t brute_force_largest(const std::vector<std::size_t>& counts, int servers) {
  std::size_t best = std::numeric_limits<std::size_t>::max();
  std::function<void(std::size_t, int, std::size_t)> go = [&](std::size_t start, int left,
                                                              std::size_t largest) {
    const std::size_t n = counts.size();
    if (left == 1) {
      std::size_t sum = 0;
      for (std::size_t i = start; i < n; ++i) sum += counts[i];
      best = std::min(best, std::max(largest, sum));
      return;
    }
    std::size_t sum = 0;
    for (std::size_t end = start + 1; end + static_cast<std::size_t>(left - 1) <= n; ++end) {
      sum += counts[end - 1];
      go(end, left - 1, std::max(largest, sum));
    }
  };
  go(0, servers, 0);
  return best;
}

void expect_valid_plan(const ShardPlan& plan, const Layout& layout, int servers) {
  ASSERT_EQ(plan.servers(), servers);
  EXPECT_EQ(plan.total(), layout.total());
  std::size_t segment = 0, element = 0;
  for (const Shard& shard : plan.shards()) {
    EXPECT_EQ(shard.first_segment, segment);
    EXPECT_LT(shard.first_segment, shard.end_segment);  // at least one whole segment
    EXPECT_EQ(shard.begin, element);
    EXPECT_EQ(shard.begin, layout.segment(shard.first_segment).offset);
    const Segment& last = layout.segment(shard.end_segment - 1);
    EXPECT_EQ(shard.end, last.offset + last.count);
    segment = shard.end_segment;
    element = shard.end;
  }
  EXPECT_EQ(segment, layout.segment_count());
  EXPECT_EQ(element, layout.total());
}

TEST(ShardPlan, OneServerOwnsEverything) {
  const Layout layout = small_layout();
  const ShardPlan plan(layout, 1);
  expect_valid_plan(plan, layout, 1);
  EXPECT_EQ(plan.shard(0).begin, 0u);
  EXPECT_EQ(plan.shard(0).end, 18u);
  EXPECT_EQ(plan.largest(), 18u);
}

TEST(ShardPlan, ThreeServersBalanceOddSegments) {
  const Layout layout =
      small_layout();  // 3 5 1 7 2: the only split with largest 8 is [3 5] [1 7] [2]
  const ShardPlan plan(layout, 3);
  expect_valid_plan(plan, layout, 3);
  EXPECT_EQ(plan.largest(), 8u);
  EXPECT_EQ(plan.shard(0).end_segment, 2u);
  EXPECT_EQ(plan.shard(1).end_segment, 4u);
  EXPECT_EQ(plan.shard(2).begin, 16u);
  EXPECT_EQ(plan.shard(2).end, 18u);
  EXPECT_EQ(plan.largest(), brute_force_largest({3, 5, 1, 7, 2}, 3));
}

TEST(ShardPlan, MatchesBruteForceOnSmallLayouts) {
  const std::vector<std::vector<std::size_t>> layouts = {{1},
                                                         {7, 1},
                                                         {1, 7},
                                                         {3, 5, 1, 7, 2},
                                                         {9, 1, 1, 1, 1, 9},
                                                         {5, 5, 5, 5},
                                                         {1, 2, 3, 4, 5, 6, 7},
                                                         {13, 3, 11, 1, 1, 17, 5, 2},
                                                         {0, 4, 0, 4, 1},
                                                         {100, 1, 1, 1, 1, 1, 1, 100}};
  for (const auto& counts : layouts) {
    const Layout layout = make_layout(counts);
    for (int servers = 1; servers <= static_cast<int>(counts.size()); ++servers) {
      SCOPED_TRACE(testing::Message()
                   << "layout of " << counts.size() << " segments, " << servers << " servers");
      const ShardPlan plan(layout, servers);
      expect_valid_plan(plan, layout, servers);
      EXPECT_EQ(plan.largest(), brute_force_largest(counts, servers));
    }
  }
}

TEST(ShardPlan, RejectsBadServerCounts) {
  const Layout layout = small_layout();
  EXPECT_THROW(ShardPlan(layout, 0), UsageError);
  try {
    ShardPlan(layout, 6);
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_CONTAINS(error.what(), "parameter server: 6 servers exceed the model's 5 parameter segments");
  }
  try {
    ShardPlan(Layout{}, 1);
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_CONTAINS(error.what(), "no parameter segments");
  }
}

TEST(ParameterServer, RejectsWrongRanksAndSizes) {
  const Layout layout = small_layout();
  const ShardPlan plan(layout, 1);
  LocalFabric fabric(3);
  const std::vector<float> weights(layout.total(), 0.0f);
  EXPECT_THROW(ParameterServerShard(fabric.endpoint(0), plan, 2, weights, {}),
               UsageError);  // worker
  EXPECT_THROW(ParameterServerShard(fabric.endpoint(2), plan, 1, weights, {}), UsageError);  // size
  EXPECT_THROW(ParameterServerShard(fabric.endpoint(2), plan, 2, std::vector<float>(3), {}),
               UsageError);
  EXPECT_THROW(ParameterClient(fabric.endpoint(2), plan, 2), UsageError);  // a server rank
  EXPECT_THROW(ParameterClient(fabric.endpoint(0), plan, 1), UsageError);  // size
}

// Dyadic values: sums, means over 1, 2 or 4 workers and lr 0.5 steps are exact in fp32.
float initial_weight(std::size_t i) { return static_cast<float>(i) * 0.25f - 2.0f; }
float gradient(int worker, int t, std::size_t i) {
  return static_cast<float>((worker + 1) * (t + 1) + static_cast<int>(i % 5)) / 16.0f - 0.5f;
}

struct RunResult {
  // pulled[m][t]: worker m's weights after iteration t (t = 0: the initial pull); versions
  // likewise.
  std::vector<std::vector<std::vector<float>>> pulled;
  std::vector<std::vector<std::uint64_t>> versions;
  std::vector<float> server_weights;  // assembled from the shards after serve()
  std::vector<std::uint64_t> server_versions;
};

// M workers, S servers: each worker pulls the initial weights, then for t < iterations pushes
// gradient(m, t) with version t and pulls (at least version t + 1 when synchronous), then closes.
RunResult run_ps(int workers, int servers, int iterations, ServerMode mode, SgdOptions sgd,
                 float async_scale = 1.0f) {
  const Layout layout = small_layout();
  const ShardPlan plan(layout, servers);
  std::vector<float> w0(layout.total());
  for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = initial_weight(i);
  RunResult result;
  result.pulled.resize(static_cast<std::size_t>(workers));
  result.versions.resize(static_cast<std::size_t>(workers));
  result.server_weights.assign(layout.total(), 0.0f);
  result.server_versions.assign(static_cast<std::size_t>(servers), 0);
  const bool synchronous = mode == ServerMode::kSynchronous;
  run_ranks(workers + servers, [&](int rank, Transport& transport) {
    if (rank >= workers) {
      ParameterServerShard shard(transport, plan, workers, w0, sgd);
      shard.serve(ServeOptions{.mode = mode, .async_scale = async_scale, .timeout = kWait});
      std::copy(shard.weights().begin(), shard.weights().end(),
                result.server_weights.begin() + static_cast<std::ptrdiff_t>(shard.shard().begin));
      result.server_versions[static_cast<std::size_t>(shard.shard_index())] = shard.version();
      return;
    }
    ParameterClient client(transport, plan, workers, kWait);
    auto& pulled = result.pulled[static_cast<std::size_t>(rank)];
    auto& versions = result.versions[static_cast<std::size_t>(rank)];
    std::vector<float> weights(layout.total(), -1.0f), gradients(layout.total());
    versions.push_back(client.pull(weights).wait(kWait));
    pulled.push_back(weights);
    for (int t = 0; t < iterations; ++t) {
      for (std::size_t i = 0; i < gradients.size(); ++i) gradients[i] = gradient(rank, t, i);
      PushHandle push = client.push(gradients, static_cast<std::uint64_t>(t), t);
      // Both in flight at once: the pull is answered after this worker's push was applied.
      PullHandle pull = client.pull(weights, synchronous ? static_cast<std::uint64_t>(t + 1) : 0);
      EXPECT_EQ(push.wait(kWait), static_cast<std::uint64_t>(t));
      versions.push_back(pull.wait(kWait));
      pulled.push_back(weights);
    }
    client.close();
  });
  return result;
}

TEST(ParameterServer, SynchronousPlainSgdMatchesClosedForm) {
  constexpr int kIterations = 5;
  const float lr = 0.5f;
  for (int servers : {1, 3}) {
    for (int workers : {1, 2, 4}) {
      SCOPED_TRACE(testing::Message() << workers << " workers, " << servers << " servers");
      const RunResult result =
          run_ps(workers, servers, kIterations, ServerMode::kSynchronous, {lr, 0.0f, 0.0f});
      const std::size_t n = 18;
      // Closed form w_t = w0 - lr * sum_{u < t} mean_m g_m(u), in double (exact here).
      std::vector<std::vector<double>> expected(kIterations + 1, std::vector<double>(n));
      for (std::size_t i = 0; i < n; ++i) expected[0][i] = initial_weight(i);
      for (int t = 0; t < kIterations; ++t) {
        for (std::size_t i = 0; i < n; ++i) {
          double mean = 0;
          for (int m = 0; m < workers; ++m) mean += gradient(m, t, i);
          mean /= workers;
          expected[static_cast<std::size_t>(t + 1)][i] =
              expected[static_cast<std::size_t>(t)][i] - lr * mean;
        }
      }
      for (int m = 0; m < workers; ++m) {
        for (int t = 0; t <= kIterations; ++t) {
          const auto tm = static_cast<std::size_t>(t);
          EXPECT_EQ(result.versions[static_cast<std::size_t>(m)][tm],
                    static_cast<std::uint64_t>(t));
          for (std::size_t i = 0; i < n; ++i) {
            EXPECT_EQ(static_cast<double>(result.pulled[static_cast<std::size_t>(m)][tm][i]),
                      expected[tm][i])
                << "worker " << m << " iteration " << t << " element " << i;
          }
        }
      }
      for (std::uint64_t version : result.server_versions) EXPECT_EQ(version, kIterations);
    }
  }
}

TEST(ParameterServer, SynchronousMomentumMatchesOneSgdOnTheFullVector) {
  constexpr int kIterations = 6;
  const SgdOptions options{0.1f, 0.9f, 0.01f};
  for (int servers : {1, 3}) {
    for (int workers : {1, 2, 4}) {
      SCOPED_TRACE(testing::Message() << workers << " workers, " << servers << " servers");
      const RunResult result =
          run_ps(workers, servers, kIterations, ServerMode::kSynchronous, options);
      // Oracle: one Sgd over the whole vector, fed the gradients summed in worker order.
      const std::size_t n = 18;
      Sgd oracle(n, options);
      std::vector<float> w(n), sum(n);
      for (std::size_t i = 0; i < n; ++i) w[i] = initial_weight(i);
      for (int t = 0; t < kIterations; ++t) {
        for (std::size_t i = 0; i < n; ++i) {
          sum[i] = gradient(0, t, i);
          for (int m = 1; m < workers; ++m) sum[i] += gradient(m, t, i);
        }
        oracle.step(w, sum, 1.0f / static_cast<float>(workers));
        for (int m = 0; m < workers; ++m) {
          const auto& pulled =
              result.pulled[static_cast<std::size_t>(m)][static_cast<std::size_t>(t + 1)];
          EXPECT_EQ(result.versions[static_cast<std::size_t>(m)][static_cast<std::size_t>(t + 1)],
                    static_cast<std::uint64_t>(t + 1));
          for (std::size_t i = 0; i < n; ++i) {
            EXPECT_EQ(pulled[i], w[i]) << "worker " << m << " iteration " << t << " element " << i;
          }
        }
      }
      EXPECT_EQ(result.server_weights, w);
    }
  }
}

TEST(ParameterServer, AsynchronousOneWorkerEqualsSequentialSgd) {
  constexpr int kIterations = 6;
  const SgdOptions options{0.1f, 0.9f, 0.01f};
  const float scale = 0.5f;
  for (int servers : {1, 3}) {
    SCOPED_TRACE(testing::Message() << servers << " servers");
    const RunResult result =
        run_ps(1, servers, kIterations, ServerMode::kAsynchronous, options, scale);
    const std::size_t n = 18;
    Sgd oracle(n, options);
    std::vector<float> w(n), g(n);
    for (std::size_t i = 0; i < n; ++i) w[i] = initial_weight(i);
    EXPECT_EQ(result.pulled[0][0], w);
    for (int t = 0; t < kIterations; ++t) {
      for (std::size_t i = 0; i < n; ++i) g[i] = gradient(0, t, i);
      oracle.step(w, g, scale);
      EXPECT_EQ(result.versions[0][static_cast<std::size_t>(t + 1)],
                static_cast<std::uint64_t>(t + 1));
      EXPECT_EQ(result.pulled[0][static_cast<std::size_t>(t + 1)], w) << "iteration " << t;
    }
  }
}

TEST(ParameterServer, AsynchronousManyWorkersApplyEveryPushOnce) {
  // Plain SGD with dyadic values: the final weights do not depend on the arrival order.
  constexpr int kIterations = 5;
  const float lr = 0.5f, scale = 0.25f;
  for (int servers : {1, 3}) {
    for (int workers : {2, 4}) {
      SCOPED_TRACE(testing::Message() << workers << " workers, " << servers << " servers");
      const RunResult result =
          run_ps(workers, servers, kIterations, ServerMode::kAsynchronous, {lr, 0.0f, 0.0f}, scale);
      for (std::uint64_t version : result.server_versions) {
        EXPECT_EQ(version, static_cast<std::uint64_t>(workers * kIterations));
      }
      for (std::size_t i = 0; i < 18; ++i) {
        double expected = initial_weight(i);
        for (int m = 0; m < workers; ++m) {
          for (int t = 0; t < kIterations; ++t) expected -= lr * scale * gradient(m, t, i);
        }
        EXPECT_EQ(static_cast<double>(result.server_weights[i]), expected) << "element " << i;
      }
      for (int m = 0; m < workers; ++m) {
        const auto& versions = result.versions[static_cast<std::size_t>(m)];
        for (int t = 1; t <= kIterations; ++t) {
          // This worker's own t pushes were applied before its pull; versions never go back.
          EXPECT_GE(versions[static_cast<std::size_t>(t)], static_cast<std::uint64_t>(t));
          EXPECT_GE(versions[static_cast<std::size_t>(t)],
                    versions[static_cast<std::size_t>(t - 1)]);
        }
      }
    }
  }
}

// DC-ASGD on the server (OD-SGD paper Eq. 4-6), two workers in a fixed order, by hand. Layout {1, 2}
// (so 2 servers split it), w0 = {1, -2, 0.5}, lr 0.5, scale 1/2, lambda 0.25:
//   worker 0 pushes g0 = {2, 1, -4} computed on w0 (its backup: it has not pulled, so w0):
//     w1 = w0 - 0.25 * (g0 + 0) = {0.5, -2.25, 1.5}
//   worker 1 then pushes g1 = {1, -3, 2}, also computed on w0 (its backup is still w0):
//     w1 - w0 = {-0.5, -0.25, 1}
//     c: g1~ = g1 + 0.25 g1^2 (w1 - w0) = {0.875, -3.5625, 3}
//        w2  = w1 - 0.25 g1~          = {0.28125, -1.359375, 0.75}
//     a (m = 0.5): MeanSquare = {2, 0.5, 8} after g0, {1.5, 4.75, 6} after g1;
//        g1~ = {0.8979379, -3.2580927, 2.4082483}, w2 = {0.2755155, -1.4354768, 0.8979379}
//   worker 0 then pushes g0 again, computed on w1 (which it pulled): w_now - backup_0 = w2 - w1.
struct CompensationCase {
  DelayCompensationVariant variant;
  std::vector<float> w2;
  double tolerance;
};

void PrintTo(const CompensationCase& c, std::ostream* out) {
  *out << (c.variant == DelayCompensationVariant::kConstant ? "constant" : "adaptive") << " compensation, w2 {";
  for (std::size_t i = 0; i < c.w2.size(); ++i) *out << (i ? ", " : "") << c.w2[i];
  *out << "}, tolerance " << c.tolerance;
}

class ServerDelayCompensation : public testing::TestWithParam<std::tuple<CompensationCase, int>> {};

TEST_P(ServerDelayCompensation, CompensatesEachWorkerWithItsBackupByHand) {
  const auto& [expected, servers] = GetParam();
  const Layout layout = make_layout({1, 2});
  const ShardPlan plan(layout, servers);
  const std::vector<float> w0 = {1.0f, -2.0f, 0.5f};
  const std::vector<float> g0 = {2.0f, 1.0f, -4.0f}, g1 = {1.0f, -3.0f, 2.0f};
  ServeOptions options{.mode = ServerMode::kAsynchronous, .async_scale = 0.5f, .timeout = kWait};
  DelayCompensationOptions compensation;
  compensation.variant = expected.variant;
  compensation.lambda = 0.25f;
  compensation.mean_square_decay = 0.5f;
  options.delay_compensation = compensation;

  std::vector<float> w1(3), w2(3), w3(3);
  std::promise<void> first_applied;
  std::future<void> first_applied_seen = first_applied.get_future();
  std::promise<void> second_applied;
  std::future<void> second_applied_seen = second_applied.get_future();
  run_ranks(2 + servers, [&](int rank, Transport& transport) {
    if (rank >= 2) {
      ParameterServerShard shard(transport, plan, 2, w0, SgdOptions{0.5f, 0.0f, 0.0f});
      shard.serve(options);
      return;
    }
    ParameterClient client(transport, plan, 2, kWait);
    if (rank == 0) {
      client.push(g0, 0, 0).wait(kWait);
      EXPECT_EQ(client.pull(w1, 1).wait(kWait), 1u);  // also makes w1 this worker's backup
      first_applied.set_value();
      if (second_applied_seen.wait_for(kWait) != std::future_status::ready) {
        throw std::runtime_error("worker 1 never pushed");
      }
      client.push(g0, 2, 1).wait(kWait);
      EXPECT_EQ(client.pull(w3, 3).wait(kWait), 3u);
    } else {
      if (first_applied_seen.wait_for(kWait) != std::future_status::ready) {
        throw std::runtime_error("worker 0 never pushed");
      }
      client.push(g1, 0, 0).wait(kWait);
      EXPECT_EQ(client.pull(w2, 2).wait(kWait), 2u);
      second_applied.set_value();
    }
    client.close();
  });
  EXPECT_EQ(w1, (std::vector<float>{0.5f, -2.25f, 1.5f}));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(w2[i], expected.w2[i], expected.tolerance) << i;
  // Worker 0's second push was computed on w1 (its backup), so it is compensated with w2 - w1.
  DelayCompensation oracle(3, compensation);
  std::vector<float> compensated(3);
  oracle.compensate(g0, w0, w0, compensated);  // the adaptive MeanSquare's history: g0, g1, g0
  oracle.compensate(g1, w1, w0, compensated);
  oracle.compensate(g0, w2, w1, compensated);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_FLOAT_EQ(w3[i], w2[i] - 0.25f * compensated[i]) << i;
    EXPECT_NE(compensated[i], g0[i]) << "the second push of worker 0 was not compensated, " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ServerDelayCompensation,
    testing::Combine(testing::Values(CompensationCase{DelayCompensationVariant::kConstant,
                                                      {0.28125f, -1.359375f, 0.75f}, 0.0},
                                     CompensationCase{DelayCompensationVariant::kAdaptive,
                                                      {0.2755155f, -1.4354768f, 0.8979379f}, 1e-6}),
                     testing::Values(1, 2)));

TEST(ParameterServer, DelayCompensationNeedsAsynchronousMode) {
  const Layout layout = make_layout({3});
  const ShardPlan plan(layout, 1);
  const std::vector<float> w0(3, 0.0f);
  try {
    run_ranks(2, [&](int rank, Transport& transport) {
      if (rank == 0) return;
      ParameterServerShard shard(transport, plan, 1, w0, {});
      ServeOptions options{.mode = ServerMode::kSynchronous, .timeout = kWait};
      options.delay_compensation = DelayCompensationOptions{};
      shard.serve(options);
    });
    FAIL() << "no error";
  } catch (const UsageError& error) {
    EXPECT_STREQ(error.what(),
                 "parameter server shard 0 on rank 1: delay compensation applies to asynchronous "
                 "serving only");
  }
}

TEST(ParameterClient, ServerThatNeverStartsTimesOut) {
  const Layout layout = small_layout();
  const ShardPlan plan(layout, 1);
  const Timeout timeout{200};
  std::string message;
  run_ranks(2, [&](int rank, Transport& transport) {
    if (rank == 1) return;  // the server never starts
    ParameterClient client(transport, plan, 1, timeout);
    const std::vector<float> gradients(layout.total(), 1.0f);
    try {
      client.push(gradients, 0, 0).wait(timeout);
    } catch (const CommTimeoutError& error) {
      message = error.what();
    }
  });
  EXPECT_CONTAINS(message, "ps push");
  EXPECT_CONTAINS(message, "rank 1");
  EXPECT_CONTAINS(message, "tag ps:0 step 0 segment 0");
  EXPECT_CONTAINS(message, "timed out after 0.2 s");  // the given timeout, not a longer one
}

TEST(ParameterServer, WorkerThatNeverPushesTimesOut) {
  const Layout layout = small_layout();
  const ShardPlan plan(layout, 1);
  const std::vector<float> w0(layout.total(), 0.5f);
  try {
    run_ranks(3, [&](int rank, Transport& transport) {
      if (rank == 1) return;  // worker 1 never pushes
      if (rank == 2) {
        ParameterServerShard shard(transport, plan, 2, w0, {});
        shard.serve(ServeOptions{.mode = ServerMode::kSynchronous, .timeout = Timeout{200}});
        return;
      }
      ParameterClient client(transport, plan, 2, kWait);
      const std::vector<float> gradients(layout.total(), 1.0f);
      std::vector<float> weights(layout.total());
      client.push(gradients, 0, 0).wait(kWait);
      client.pull(weights, 1).wait(kWait);  // aborted by the server's failure
    });
    FAIL() << "expected CommTimeoutError";
  } catch (const CommTimeoutError& error) {
    const std::string message = error.what();
    EXPECT_CONTAINS(message, "ps serve: recv from rank 1");
    EXPECT_CONTAINS(message, "tag ps:0 step 0 segment 0");
    EXPECT_CONTAINS(message, "on rank 2");
    EXPECT_CONTAINS(message, "push of version 0");
    EXPECT_CONTAINS(message, "timed out after 0.2 s");  // the server's timeout, not the client's
  }
}

}  // namespace
}  // namespace pipesgd
