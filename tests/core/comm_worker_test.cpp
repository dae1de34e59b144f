// CommWorker (comm/comm_worker.h): order, tickets, failures, timeouts, shutdown, with and without the
// compute thread's spin before it blocks; wait_spin_for (algo/common_options.h), which sets the spin.
#include "pipesgd/comm/comm_worker.h"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/algo/common_options.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/core/error.h"
#include "thread_state.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

// The timeout of waits that must not time out: never reached here. A wait that would never end
// hangs until ctest's timeout, which fails the test; no test bounds how long a wait may take.
constexpr Timeout kNoTimeout = std::chrono::hours(1);

// A handler that blocks until released (for the tests that need a job in flight).
class Gate {
 public:
  void wait() {
    std::unique_lock lock(mutex_);
    opened_.wait(lock, [&] { return open_; });
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_ = false;
};

// The tests below run without spinning and with the trainer's spin (kWaitSpin): wait() polls the
// job's completion for that long before it blocks; nothing else may change.
struct SpinCase {
  std::chrono::microseconds spin;
};
void PrintTo(const SpinCase& c, std::ostream* out) { *out << "spin " << c.spin.count() << " us"; }

class CommWorkerSpinning : public ::testing::TestWithParam<SpinCase> {};

TEST_P(CommWorkerSpinning, RunsJobsInSubmissionOrderAndNumbersTickets) {
  LocalFabric fabric(1);
  std::vector<std::int64_t> ran;  // written by the comm thread; read after the waits
  std::vector<float> data(4, 0.0f);
  CommWorker worker(
      fabric.endpoint(0), "test", 3, kNoTimeout,
      [&](const CommWorker::Job& job) {
        ran.push_back(job.iteration);
        job.data[job.index] += static_cast<float>(job.sequence);
      },
      GetParam().spin);
  std::vector<CommWorker::Ticket> tickets;
  for (std::int64_t t = 0; t < 10; ++t) {
    EXPECT_EQ(worker.next_ticket(), static_cast<CommWorker::Ticket>(t));
    tickets.push_back(worker.submit({data, static_cast<std::uint64_t>(t), t, static_cast<std::size_t>(t % 4)}));
    EXPECT_EQ(tickets.back(), static_cast<CommWorker::Ticket>(t));
    if (t >= 2) {
      EXPECT_NO_THROW(worker.wait(tickets[t - 2], "a job", t - 2));
    }
  }
  worker.drain("every job");
  EXPECT_EQ(ran, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  // Slot s received the sequences t with t % 4 == s.
  EXPECT_EQ(data, (std::vector<float>{0 + 4 + 8, 1 + 5 + 9, 2 + 6, 3 + 7}));
}

TEST_P(CommWorkerSpinning, CompletedTicketIsDoneWithoutRunningAnything) {
  LocalFabric fabric(1);
  std::atomic<int> runs{0};
  CommWorker worker(fabric.endpoint(0), "test", 2, kNoTimeout, [&](const CommWorker::Job&) { ++runs; }, GetParam().spin);
  const CommWorker::Ticket restored = worker.completed_ticket();
  EXPECT_EQ(restored, 0u);
  EXPECT_EQ(worker.wait(restored, "a restored job", 0), 0.0);
  const CommWorker::Ticket next = worker.submit({});
  EXPECT_EQ(next, 1u);
  worker.wait(next, "a job", 1);
  EXPECT_EQ(runs.load(), 1);
}

TEST_P(CommWorkerSpinning, AFailureIsRethrownByEveryLaterWaitAndReportedToThePeers) {
  LocalFabric fabric(2);
  std::atomic<int> runs{0};
  CommWorker worker(
      fabric.endpoint(0), "test", 4, kNoTimeout,
      [&](const CommWorker::Job& job) {
        ++runs;
        if (job.iteration == 1) throw CommError("peer 1 vanished");
      },
      GetParam().spin);
  worker.wait(worker.submit({{}, 0, 0, 0}), "job 0", 0);
  const CommWorker::Ticket failing = worker.submit({{}, 0, 1, 0});
  const CommWorker::Ticket after = worker.submit({{}, 0, 2, 0});
  EXPECT_THROW(worker.wait(failing, "job 1", 1), CommError);
  try {
    worker.wait(after, "job 2", 2);
    FAIL() << "the stored failure was not rethrown";
  } catch (const CommError& error) {
    EXPECT_STREQ(error.what(), "peer 1 vanished");
  }
  EXPECT_THROW(worker.drain("every job"), CommError);
  EXPECT_EQ(runs.load(), 2) << "no job runs after a failure";
  // Rank 1 learns of it at once: its receive from rank 0 fails with PeerFailedError.
  std::vector<std::byte> buffer(4);
  Request receive = fabric.endpoint(1).recv(0, collective_tag(Channel::kGradients, 0), buffer, "test recv");
  EXPECT_THROW(receive.wait(kNoTimeout), PeerFailedError);
}

TEST_P(CommWorkerSpinning, ASilentDeathIsRethrownButReportedToNoOne) {
  struct SilentDeath {};
  LocalFabric fabric(2);
  CommWorker worker(
      fabric.endpoint(0), "test", 2, kNoTimeout, [](const CommWorker::Job&) { throw SilentDeath{}; }, GetParam().spin);
  EXPECT_THROW(worker.wait(worker.submit({}), "job 0", 0), SilentDeath);
  // Rank 1 is not told: its receive times out instead of failing with PeerFailedError.
  std::vector<std::byte> buffer(4);
  Request receive = fabric.endpoint(1).recv(0, collective_tag(Channel::kGradients, 0), buffer, "test recv");
  EXPECT_THROW(receive.wait(50ms), CommTimeoutError);
}

TEST_P(CommWorkerSpinning, AWaitOnAStoppedCommThreadTimesOutNamingOwnerWhatAndIteration) {
  LocalFabric fabric(1);
  Gate gate;
  // comm_thread_wait(1 ms) = 1.002 s (after the spin, if any: the message is the same).
  CommWorker worker(
      fabric.endpoint(0), "pipe-sgd", 2, 1ms, [&](const CommWorker::Job&) { gate.wait(); }, GetParam().spin);
  const CommWorker::Ticket ticket = worker.submit({{}, 0, 7, 0});
  try {
    worker.wait(ticket, "the aggregated gradient", 7);
    FAIL() << "no timeout";
  } catch (const CommTimeoutError& error) {
    EXPECT_EQ(std::string(error.what()), "pipe-sgd: rank 0 waited more than 1.002 s for the aggregated gradient of iteration 7");
  }
  try {
    worker.drain("its allreduces in flight before a checkpoint");
    FAIL() << "no timeout";
  } catch (const CommTimeoutError& error) {
    EXPECT_EQ(std::string(error.what()),
              "pipe-sgd: rank 0 waited more than 1.002 s for its allreduces in flight before a checkpoint");
  }
  gate.open();
  EXPECT_NO_THROW(worker.wait(ticket, "the aggregated gradient", 7));
}

using testing_support::thread_state;

// The gate opens only once the destructor has set its stop flag, so the comm thread, when the
// running job returns, finds it set and starts none of the two queued jobs. The opener waits for
// the main thread to reach the end of the worker's scope, then to fall asleep: from there on it runs
// only ~CommWorker, whose one blocking call, joining the comm thread (which is parked at the gate,
// holding none of the worker's locks), comes after it set the flag. No sleep stands in for an order.
TEST(CommWorker, DestructionAbandonsQueuedJobsAndWaitsForTheRunningOne) {
  LocalFabric fabric(1);
  Gate gate;
  std::atomic<int> started{0}, finished{0};
  std::atomic<bool> destroying{false};
  const pid_t main_thread = ::gettid();
  std::thread opener;
  {
    CommWorker worker(fabric.endpoint(0), "test", 3, kNoTimeout, [&](const CommWorker::Job&) {
      ++started;
      gate.wait();
      ++finished;
    });
    for (int k = 0; k < 3; ++k) worker.submit({});
    while (started.load() == 0) std::this_thread::sleep_for(1ms);
    opener = std::thread([&] {
      while (!destroying.load()) std::this_thread::sleep_for(1ms);
      while (thread_state(main_thread) != 'S') std::this_thread::sleep_for(1ms);
      gate.open();
    });
    destroying.store(true);
  }  // the destructor returns once the running job finished
  opener.join();
  EXPECT_EQ(started.load(), 1);
  EXPECT_EQ(finished.load(), 1);
}


// With a spin, a job that outlasts it is still waited for: wait() goes on to block (the compute
// thread is seen asleep before the job is let finish) and returns its result.
TEST_P(CommWorkerSpinning, AJobThatOutlastsTheSpinIsWaitedForAsleep) {
  LocalFabric fabric(1);
  Gate gate;
  std::vector<float> data(1, 0.0f);
  CommWorker worker(
      fabric.endpoint(0), "test", 2, kNoTimeout,
      [&](const CommWorker::Job& job) {
        gate.wait();
        job.data[0] = 42.0f;
      },
      GetParam().spin);
  const pid_t main_thread = ::gettid();
  std::atomic<bool> waiting{false};
  std::atomic<bool> seen_asleep{false};
  std::thread opener([&] {
    while (!waiting.load()) std::this_thread::sleep_for(1ms);
    testing_support::wait_until_asleep(main_thread);  // a wait that never blocks hangs: ctest's timeout fails it
    seen_asleep = true;
    gate.open();
  });
  const CommWorker::Ticket ticket = worker.submit({data, 0, 0, 0});
  waiting.store(true);
  EXPECT_NO_THROW(worker.wait(ticket, "a long job", 0));
  opener.join();
  EXPECT_TRUE(seen_asleep.load()) << "wait() never blocked";
  EXPECT_EQ(data[0], 42.0f);
}

INSTANTIATE_TEST_SUITE_P(WithoutAndWithSpin, CommWorkerSpinning,
                         ::testing::Values(SpinCase{std::chrono::microseconds(0)}, SpinCase{kWaitSpin}),
                         [](const ::testing::TestParamInfo<SpinCase>& info) {
                           return "Spin" + std::to_string(info.param.spin.count()) + "us";
                         });

// A spin far longer than any test ends as soon as the job is done, or has failed (a failed job
// counts as done): a wait that polled to its bound would hang the test (ctest's timeout fails it).
TEST(CommWorkerLongSpin, EndsWhenTheJobIsDoneOrFailed) {
  LocalFabric fabric(1);
  const std::chrono::microseconds hour = std::chrono::hours(1);
  std::vector<float> data(3, 0.0f);
  CommWorker worker(
      fabric.endpoint(0), "test", 2, kNoTimeout,
      [&](const CommWorker::Job& job) {
        if (job.iteration == 2) throw CommError("the third job fails");
        job.data[job.index] = static_cast<float>(job.iteration + 1);
      },
      hour);
  for (std::int64_t t = 0; t < 2; ++t) {
    worker.wait(worker.submit({data, 0, t, static_cast<std::size_t>(t)}), "a job", t);
    EXPECT_EQ(data[static_cast<std::size_t>(t)], static_cast<float>(t + 1));
  }
  const CommWorker::Ticket failing = worker.submit({data, 0, 2, 2});
  try {
    worker.wait(failing, "the failing job", 2);
    FAIL() << "the failure was not rethrown";
  } catch (const CommError& error) {
    EXPECT_STREQ(error.what(), "the third job fails");
  }
  EXPECT_EQ(data[2], 0.0f);
}

// A ticket marked done by completed_ticket() (a restored job) ends a spinning wait() at once too,
// before and after real jobs ran.
TEST(CommWorkerLongSpin, EndsAtOnceForACompletedTicket) {
  LocalFabric fabric(1);
  std::atomic<int> runs{0};
  CommWorker worker(fabric.endpoint(0), "test", 3, kNoTimeout, [&](const CommWorker::Job&) { ++runs; }, std::chrono::hours(1));
  const CommWorker::Ticket restored = worker.completed_ticket();
  EXPECT_EQ(worker.wait(restored, "a restored job", 0), 0.0);
  worker.wait(worker.submit({}), "a job", 1);
  const CommWorker::Ticket restored_later = worker.completed_ticket();
  EXPECT_EQ(worker.wait(restored_later, "a restored job", 2), 0.0);
  EXPECT_EQ(runs.load(), 1);
}

// ---------------------------------------------------------------------------------------------
// wait_spin_for (algo/common_options.h): kWaitSpin when every worker has a processor of its own,
// else 0. Oracle: the processors the calling thread may run on (sched_getaffinity).

int processors_allowed() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return -1;
  return CPU_COUNT(&allowed);
}

TEST(WaitSpinFor, SpinsOnlyWhenEveryWorkerHasAProcessor) {
  const int processors = processors_allowed();
  ASSERT_GE(processors, 1);
  EXPECT_EQ(kWaitSpin, std::chrono::microseconds(2000));
  EXPECT_EQ(wait_spin_for(1), kWaitSpin);
  EXPECT_EQ(wait_spin_for(processors), kWaitSpin);
  EXPECT_EQ(wait_spin_for(processors + 1), std::chrono::microseconds(0));
  EXPECT_EQ(wait_spin_for(4 * processors + 3), std::chrono::microseconds(0));
  EXPECT_EQ(wait_spin_for(0), std::chrono::microseconds(0));
  EXPECT_EQ(wait_spin_for(-1), std::chrono::microseconds(0));
}

// On a thread confined to one processor: one worker spins, two do not, whatever the machine has.
TEST(WaitSpinFor, FollowsTheAffinityMask) {
  std::chrono::microseconds one{-1}, two{-1};
  int confined_to = 0;
  std::thread confined([&] {
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
    int first = 0;
    while (first < CPU_SETSIZE && !CPU_ISSET(first, &allowed)) ++first;
    cpu_set_t only;
    CPU_ZERO(&only);
    CPU_SET(first, &only);
    if (sched_setaffinity(0, sizeof only, &only) != 0) return;
    confined_to = processors_allowed();
    one = wait_spin_for(1);
    two = wait_spin_for(2);
  });
  confined.join();
  ASSERT_EQ(confined_to, 1) << "could not confine a thread to one processor";
  EXPECT_EQ(one, kWaitSpin);
  EXPECT_EQ(two, std::chrono::microseconds(0));
}

}  // namespace
}  // namespace pipesgd
