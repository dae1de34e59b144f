// comm/wait.h, the one wait policy of the transports and CommWorker: its phases (spin, yield, block)
// and when it looks at the failure state; a wait that completes, one that times out and one that is
// aborted, with the exact errors every transport reports; the failure state (first failure wins).
#include "pipesgd/comm/wait.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

constexpr Timeout never = std::chrono::hours(1);  // a wait that must not time out

// A site that is ready after `ready_after` calls of ready(), counting what the policy asks of it.
struct CountingSite {
  int ready_after = 1 << 30;
  bool pays = true;
  bool failure = false;
  int ready_calls = 0, failed_calls = 0, blocks = 0;
  Clock::duration longest_block{};

  bool ready() { return ++ready_calls >= ready_after; }
  bool polling_pays() const { return pays; }
  bool failed() {
    ++failed_calls;
    return failure;
  }
  std::string failure_message() const { return "rank 3 failed: out of memory"; }
  void block(Clock::time_point now, Clock::time_point until) {
    ++blocks;
    longest_block = std::max(longest_block, until - now);
    std::this_thread::sleep_until(until);
  }
};

// A site completed or failed by another thread: it blocks on a condition variable.
struct SignalledSite {
  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;
  FailureState failures;

  bool ready() {
    std::lock_guard lock(mutex);
    return done;
  }
  bool polling_pays() const { return false; }
  bool failed() const { return failures.failed(); }
  std::string failure_message() const { return failures.message(); }
  void block(Clock::time_point, Clock::time_point until) {
    std::unique_lock lock(mutex);
    changed.wait_until(lock, until, [&] { return done || failures.failed(); });
  }
  void complete() {
    {
      std::lock_guard lock(mutex);
      done = true;
    }
    changed.notify_all();
  }
  void fail(int rank, const std::string& reason) {
    {
      std::lock_guard lock(mutex);
      failures.report(rank, reason);
    }
    changed.notify_all();
  }
};

const std::string kWait = "ring allreduce: recv from rank 1 (tag gradients:17 step 3 segment 0) on rank 0";

std::string describe() { return describe_message_wait("ring allreduce", false, 1, step_tag(collective_tag(Channel::kGradients, 17), 3, 0), 0); }

TEST(Wait, DescribesTheWaitAsEveryTransportDoes) { EXPECT_EQ(describe(), kWait); }

// Phase 1: what completes within the spin polls costs no clock read, failure check or block.
TEST(Wait, CompletesWithinTheSpinPollsWithoutBlocking) {
  CountingSite site;
  site.ready_after = 3;
  EXPECT_EQ(wait_for(WaitPolicy{.spin_polls = 64, .polls_per_check = 1}, never, site), WaitOutcome::kDone);
  EXPECT_EQ(site.ready_calls, 3);
  EXPECT_EQ(site.failed_calls, 0);
  EXPECT_EQ(site.blocks, 0);
}

// Phase 2: polls, looking at the failure state every polls_per_check polls, until yield_for passed.
TEST(Wait, YieldingPollsLookAtTheFailureStateEveryFewPolls) {
  CountingSite site;
  site.ready_after = 1 + 200;  // one spin poll, then 200 yielding polls (yield_for is far off)
  EXPECT_EQ(wait_for(WaitPolicy{.spin_polls = 1, .yield_for = 1h, .polls_per_check = 64}, never, site),
            WaitOutcome::kDone);
  EXPECT_EQ(site.failed_calls, 3);  // after polls 64, 128 and 192
  EXPECT_EQ(site.blocks, 0);
}

// Phase 3: blocks in slices of at most block_slice, and looks at the failure state every
// blocks_per_check turns; the whole wait ends at its deadline.
TEST(Wait, BlocksInSlicesUntilTheDeadline) {
  CountingSite site;
  const Clock::time_point start = Clock::now();
  EXPECT_EQ(wait_for(WaitPolicy{.block_slice = 10ms, .blocks_per_check = 2}, 100ms, site), WaitOutcome::kTimedOut);
  EXPECT_GE(Clock::now() - start, 100ms);
  EXPECT_LE(site.longest_block, Clock::duration(10ms));
  EXPECT_GE(site.blocks, 5);  // the machine may be slow, never fast: at least 100 ms of 10 ms slices / 2
  EXPECT_GE(site.failed_calls, site.blocks / 2);  // every other turn, and once more at the deadline
  EXPECT_LE(site.failed_calls, site.blocks / 2 + 2);
}

// A site where polling cannot help (e.g. its operation is not posted yet) goes straight to blocking.
TEST(Wait, ASiteWherePollingDoesNotPaySkipsThePolls) {
  CountingSite site;
  site.pays = false;
  site.ready_after = 2;
  EXPECT_EQ(wait_for(WaitPolicy{.spin_polls = 64, .yield_for = 1h, .block_slice = 1ms}, never, site), WaitOutcome::kDone);
  EXPECT_EQ(site.ready_calls, 2);
  EXPECT_EQ(site.blocks, 1);
}

TEST(Wait, AWaitThatIsCompletedByAnotherThreadReturns) {
  SignalledSite site;
  std::thread completer([&] {
    std::this_thread::sleep_for(20ms);
    site.complete();
  });
  EXPECT_NO_THROW(wait_or_throw(WaitPolicy{}, never, 1, site, describe));
  completer.join();
}

// The timeout: CommTimeoutError with the exact text every transport uses, naming the peer.
TEST(Wait, AWaitThatOutlastsItsTimeoutThrowsTheTimeoutError) {
  SignalledSite site;
  try {
    wait_or_throw(WaitPolicy{.spin_polls = 8, .yield_for = 1ms, .polls_per_check = 64, .block_slice = 20ms}, 200ms, 1,
                  site, describe);
    ADD_FAILURE() << "the wait returned";
  } catch (const CommTimeoutError& error) {
    EXPECT_EQ(std::string(error.what()), kWait + " timed out after 0.2 s");
    EXPECT_EQ(error.peer(), 1);
  }
}

TEST(Wait, TheTimeoutErrorNamesItsSecondsAndSuffix) {
  try {
    throw_wait_timed_out("x: send to rank 2 (tag control:0 step 0 segment 0) on rank 1", 1500ms, 2, " (simulated)");
  } catch (const CommTimeoutError& error) {
    EXPECT_EQ(std::string(error.what()), "x: send to rank 2 (tag control:0 step 0 segment 0) on rank 1 timed out after 1.5 s (simulated)");
    EXPECT_EQ(error.peer(), 2);
  }
}

// The abort: a failure reported while the wait sleeps wakes it with PeerFailedError naming the rank
// that failed and its reason.
TEST(Wait, AWaitAbortedByAFailureThrowsTheAbortError) {
  SignalledSite site;
  std::thread reporter([&] {
    std::this_thread::sleep_for(20ms);
    site.fail(2, "disk full");
  });
  try {
    wait_or_throw(WaitPolicy{}, never, 1, site, describe);
    ADD_FAILURE() << "the wait returned";
  } catch (const PeerFailedError& error) {
    EXPECT_EQ(std::string(error.what()), kWait + " aborted: rank 2 failed: disk full");
  }
  reporter.join();
}

// At the deadline a failure wins over the timeout: the root cause is the failure.
TEST(Wait, AtTheDeadlineAFailureWinsOverTheTimeout) {
  CountingSite site;
  site.failure = true;
  EXPECT_EQ(wait_for(WaitPolicy{.blocks_per_check = 1000}, 10ms, site), WaitOutcome::kFailed);
  try {
    wait_or_throw(WaitPolicy{.blocks_per_check = 1000}, 10ms, 1, site, describe);
    ADD_FAILURE() << "the wait returned";
  } catch (const PeerFailedError& error) {
    EXPECT_EQ(std::string(error.what()), kWait + " aborted: rank 3 failed: out of memory");
  }
}

// A wait that is done is done, even if the run failed meanwhile (the caller decides what that means).
TEST(Wait, ADoneWaitIsDoneEvenAfterAFailure) {
  CountingSite site;
  site.ready_after = 1;
  site.failure = true;
  EXPECT_EQ(wait_for(WaitPolicy{}, never, site), WaitOutcome::kDone);
}

// ---------------------------------------------------------------------------------------------
// The failure state.

TEST(FailureState, TheFirstFailureWins) {
  FailureState failures;
  EXPECT_FALSE(failures.failed());
  EXPECT_EQ(failures.message(), "");
  EXPECT_TRUE(failures.report(1, "disk full"));
  EXPECT_TRUE(failures.failed());
  EXPECT_FALSE(failures.report(2, "interrupted by SIGTERM"));
  EXPECT_FALSE(failures.record("rank 0 failed: late"));
  EXPECT_EQ(failures.message(), "rank 1 failed: disk full");
}

TEST(FailureState, RecordsAMessageFromElsewhereAsIs) {
  FailureState failures;
  EXPECT_TRUE(failures.record(rank_failure_message(4, "a notice")));
  EXPECT_EQ(failures.message(), "rank 4 failed: a notice");
}

// Reports from many threads at once: exactly one wins, and every reader sees its whole message.
TEST(FailureState, OneOfManyConcurrentReportsWins) {
  for (int round = 0; round < 20; ++round) {
    FailureState failures;
    std::atomic<int> winners{0};
    std::vector<std::thread> reporters;
    for (int rank = 0; rank < 8; ++rank) {
      reporters.emplace_back([&, rank] {
        if (failures.report(rank, "reason " + std::to_string(rank))) winners.fetch_add(1);
        const std::string seen = failures.message();
        EXPECT_EQ(seen.rfind("rank ", 0), 0u) << seen;
      });
    }
    for (std::thread& reporter : reporters) reporter.join();
    EXPECT_EQ(winners.load(), 1);
    const std::string message = failures.message();
    const char rank = message[5];
    EXPECT_EQ(message, std::string("rank ") + rank + " failed: reason " + rank);
  }
}


// WaitNoteScope / current_waits: what a thread waits on, read from another thread (mpi/'s
// LauncherWatch names it when the launcher ends the job).
TEST(WaitNotes, AThreadsOpenWaitIsListedUntilItCloses) {
  std::mutex mutex;
  std::condition_variable changed;
  int stage = 0;  // 1: the other thread's scope is open; 2: it may close it
  std::thread waiter([&] {
    const WaitNoteScope note({"ring allreduce", true, 3, Tag{77}, 1, 1000});
    std::unique_lock lock(mutex);
    stage = 1;
    changed.notify_all();
    changed.wait(lock, [&] { return stage == 2; });
  });
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return stage == 1; });
  }
  const std::vector<WaitNote> open = current_waits();
  {
    std::lock_guard lock(mutex);
    stage = 2;
  }
  changed.notify_all();
  waiter.join();
  ASSERT_EQ(open.size(), 1u);
  EXPECT_STREQ(open[0].operation, "ring allreduce");
  EXPECT_TRUE(open[0].is_send);
  EXPECT_EQ(open[0].peer, 3);
  EXPECT_EQ(open[0].tag, Tag{77});
  EXPECT_EQ(open[0].rank, 1);
  EXPECT_EQ(open[0].since_ns, 1000);
  EXPECT_TRUE(current_waits().empty());
}

TEST(WaitNotes, OpenWaitsOfSeveralThreadsComeOldestFirst) {
  const WaitNoteScope mine({"barrier", false, -1, Tag{0}, 0, 500});
  std::atomic<bool> opened{false}, release{false};
  std::thread other([&] {
    const WaitNoteScope note({"recv", false, 2, Tag{5}, 0, 100});
    opened = true;
    while (!release) std::this_thread::yield();
  });
  while (!opened) std::this_thread::yield();
  const std::vector<WaitNote> open = current_waits();
  release = true;
  other.join();
  ASSERT_EQ(open.size(), 2u);
  EXPECT_EQ(open[0].since_ns, 100);
  EXPECT_EQ(open[1].since_ns, 500);
  ASSERT_EQ(current_waits().size(), 1u);
  EXPECT_EQ(current_waits()[0].peer, -1);
}

}  // namespace
}  // namespace pipesgd
