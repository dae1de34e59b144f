// EarlyStop (train/early_stop.h): the workers of one process agree on one stop iteration S, past
// every worker's current one, through shared memory; each completes exactly [0, S).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/early_stop.h"

namespace pipesgd {
namespace {

constexpr Timeout kTimeout = std::chrono::seconds(30);

// What one worker did: the iterations it ran, and the boundary it stopped at (-1: ran to the end).
struct WorkerTrace {
  std::int64_t ran = 0;
  std::int64_t stopped_at = -1;
};

// `workers` threads, each looping over `iterations` iterations with EarlyStop at every boundary;
// `before_iteration(w, t)` runs in worker w's thread before its iteration t (it may wait, or set
// the flag).
std::vector<WorkerTrace> run_workers(EarlyStop& stop, int workers, std::int64_t iterations,
                                     const std::function<void(int, std::int64_t)>& before_iteration) {
  std::vector<WorkerTrace> traces(static_cast<std::size_t>(workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      WorkerTrace& trace = traces[static_cast<std::size_t>(w)];
      for (std::int64_t t = 0; t < iterations; ++t) {
        if (stop.stop_before(w, t)) {
          trace.stopped_at = t;
          return;
        }
        before_iteration(w, t);
        ++trace.ran;
      }
      stop.publish(w, iterations);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return traces;
}

TEST(EarlyStop, WithoutTheFlagNobodyStops) {
  std::atomic<int> flag{0};
  EarlyStop stop(3, &flag, kTimeout);
  const auto traces = run_workers(stop, 3, 500, [](int, std::int64_t) {});
  for (const WorkerTrace& trace : traces) {
    EXPECT_EQ(trace.ran, 500);
    EXPECT_EQ(trace.stopped_at, -1);
  }
  EXPECT_EQ(stop.stop_iteration(), EarlyStop::kNever);
  EXPECT_EQ(stop.signal(), 0);
  for (int w = 0; w < 3; ++w) EXPECT_EQ(stop.completed(w), 500);
}

TEST(EarlyStop, WithoutAFlagItNeverStops) {
  EarlyStop stop(1, nullptr, kTimeout);
  for (std::int64_t t = 0; t < 100; ++t) EXPECT_FALSE(stop.stop_before(0, t));
  EXPECT_EQ(stop.completed(0), 99);
}

// One worker (a rank that is a process) stops at the very boundary where it sees the flag.
TEST(EarlyStop, OneWorkerStopsAtTheBoundaryWhereItSeesTheFlag) {
  std::atomic<int> flag{0};
  EarlyStop stop(1, &flag, kTimeout);
  EXPECT_FALSE(stop.stop_before(0, 0));
  EXPECT_FALSE(stop.stop_before(0, 1));
  flag = SIGTERM;
  EXPECT_TRUE(stop.stop_before(0, 2));
  EXPECT_EQ(stop.stop_iteration(), 2);
  EXPECT_EQ(stop.signal(), SIGTERM);
  EXPECT_EQ(stop.completed(0), 2);
  EXPECT_TRUE(stop.stop_before(0, 2));  // decided once
}

// Worker 0 sees the flag at boundary 5 while worker 1 published 7 (it may be running 7) and worker
// 2 published 3: S = 8, past every other worker's published iteration. Sequential, so exact.
TEST(EarlyStop, TheStopIsPastEveryOtherWorkersPublishedIteration) {
  std::atomic<int> flag{0};
  EarlyStop stop(3, &flag, kTimeout);
  for (std::int64_t t = 0; t <= 7; ++t) EXPECT_FALSE(stop.stop_before(1, t));
  for (std::int64_t t = 0; t <= 3; ++t) EXPECT_FALSE(stop.stop_before(2, t));
  for (std::int64_t t = 0; t < 5; ++t) EXPECT_FALSE(stop.stop_before(0, t));
  flag = SIGINT;
  EXPECT_FALSE(stop.stop_before(0, 5));
  EXPECT_EQ(stop.stop_iteration(), 8);
  EXPECT_EQ(stop.signal(), SIGINT);
  EXPECT_FALSE(stop.stop_before(0, 7));
  EXPECT_TRUE(stop.stop_before(0, 8));
  EXPECT_TRUE(stop.stop_before(1, 8));
  EXPECT_FALSE(stop.stop_before(2, 4));
}

// Workers that run independently (no collective between them), at random speeds, with the flag set
// by one of them at a random iteration: all stop at the same S, each having run exactly [0, S), and
// S is past the iteration the flag was set in. Many repetitions, to meet the races.
TEST(EarlyStop, IndependentWorkersAllStopAtTheSameIteration) {
  std::mt19937 random(7);
  for (int repetition = 0; repetition < 200; ++repetition) {
    const int workers = 2 + repetition % 4;
    const int setter = static_cast<int>(random() % static_cast<unsigned>(workers));
    const std::int64_t set_at = static_cast<std::int64_t>(random() % 50);
    std::atomic<int> flag{0};
    EarlyStop stop(workers, &flag, kTimeout);
    std::vector<unsigned> seeds;
    for (int w = 0; w < workers; ++w) seeds.push_back(static_cast<unsigned>(random()));
    const auto traces = run_workers(stop, workers, 1'000'000, [&](int w, std::int64_t t) {
      if (w == setter && t == set_at) flag = SIGINT;
      if ((seeds[static_cast<std::size_t>(w)] + static_cast<unsigned>(t)) % 3 == 0) std::this_thread::yield();
    });
    const std::int64_t s = stop.stop_iteration();
    ASSERT_NE(s, EarlyStop::kNever) << "repetition " << repetition;
    EXPECT_GT(s, set_at) << "repetition " << repetition;
    for (int w = 0; w < workers; ++w) {
      EXPECT_EQ(traces[static_cast<std::size_t>(w)].stopped_at, s) << "repetition " << repetition << ", worker " << w;
      EXPECT_EQ(traces[static_cast<std::size_t>(w)].ran, s) << "repetition " << repetition << ", worker " << w;
      EXPECT_EQ(stop.completed(w), s);
    }
    EXPECT_EQ(stop.signal(), SIGINT);
  }
}

// Workers coupled as in a ring allreduce (iteration t of worker w needs its neighbours to have
// started t: each waits for them, with a deadline): a stop that split them would leave one waiting
// for a neighbour that stopped, and fail the deadline. The flag is set from outside, at a random
// moment.
TEST(EarlyStop, CoupledWorkersNeverWaitForOneThatStopped) {
  std::mt19937 random(11);
  for (int repetition = 0; repetition < 100; ++repetition) {
    const int workers = 2 + repetition % 3;
    std::atomic<int> flag{0};
    EarlyStop stop(workers, &flag, kTimeout);
    std::vector<std::atomic<std::int64_t>> started(static_cast<std::size_t>(workers));
    for (auto& value : started) value = -1;
    std::atomic<bool> stranded{false};
    std::thread signaller([&, delay = random() % 2000] {
      std::this_thread::sleep_for(std::chrono::microseconds(delay));
      flag = SIGTERM;
    });
    const auto traces = run_workers(stop, workers, 10'000'000, [&](int w, std::int64_t t) {
      started[static_cast<std::size_t>(w)] = t;
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      for (const int neighbour : {(w + 1) % workers, (w + workers - 1) % workers}) {
        while (started[static_cast<std::size_t>(neighbour)] < t) {
          if (Clock::now() > deadline) {
            stranded = true;
            return;
          }
          std::this_thread::yield();
        }
      }
    });
    signaller.join();
    EXPECT_FALSE(stranded) << "repetition " << repetition << ": a worker waited for a neighbour that had stopped";
    const std::int64_t s = stop.stop_iteration();
    for (const WorkerTrace& trace : traces) EXPECT_EQ(trace.stopped_at, s) << "repetition " << repetition;
  }
}

// A flag set after every worker finished changes nothing: the decided boundary is past the end.
TEST(EarlyStop, AFlagAfterTheEndDecidesNoStopWithinTheRun) {
  std::atomic<int> flag{0};
  EarlyStop stop(2, &flag, kTimeout);
  EXPECT_FALSE(stop.stop_before(0, 0));
  stop.publish(1, 10);  // worker 1 ran [0, 10), the whole run
  flag = SIGINT;
  for (std::int64_t t = 1; t < 10; ++t) EXPECT_FALSE(stop.stop_before(0, t));
  EXPECT_EQ(stop.stop_iteration(), 11);
}

}  // namespace
}  // namespace pipesgd
