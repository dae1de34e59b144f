// CommWorker (comm/comm_worker.h): order, tickets, failures, timeouts, shutdown.
#include "pipesgd/comm/comm_worker.h"

#include <gtest/gtest.h>

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/comm/local_transport.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

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

TEST(CommWorker, RunsJobsInSubmissionOrderAndNumbersTickets) {
  LocalFabric fabric(1);
  std::vector<std::int64_t> ran;  // written by the comm thread; read after the waits
  std::vector<float> data(4, 0.0f);
  CommWorker worker(fabric.endpoint(0), "test", 3, 5000ms, [&](const CommWorker::Job& job) {
    ran.push_back(job.iteration);
    job.data[job.index] += static_cast<float>(job.sequence);
  });
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

TEST(CommWorker, CompletedTicketIsDoneWithoutRunningAnything) {
  LocalFabric fabric(1);
  std::atomic<int> runs{0};
  CommWorker worker(fabric.endpoint(0), "test", 2, 5000ms, [&](const CommWorker::Job&) { ++runs; });
  const CommWorker::Ticket restored = worker.completed_ticket();
  EXPECT_EQ(restored, 0u);
  EXPECT_EQ(worker.wait(restored, "a restored job", 0), 0.0);
  const CommWorker::Ticket next = worker.submit({});
  EXPECT_EQ(next, 1u);
  worker.wait(next, "a job", 1);
  EXPECT_EQ(runs.load(), 1);
}

TEST(CommWorker, AFailureIsRethrownByEveryLaterWaitAndReportedToThePeers) {
  LocalFabric fabric(2);
  std::atomic<int> runs{0};
  CommWorker worker(fabric.endpoint(0), "test", 4, 5000ms, [&](const CommWorker::Job& job) {
    ++runs;
    if (job.iteration == 1) throw CommError("peer 1 vanished");
  });
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
  EXPECT_THROW(receive.wait(5000ms), PeerFailedError);
}

TEST(CommWorker, ASilentDeathIsRethrownButReportedToNoOne) {
  struct SilentDeath {};
  LocalFabric fabric(2);
  CommWorker worker(fabric.endpoint(0), "test", 2, 5000ms, [](const CommWorker::Job&) { throw SilentDeath{}; });
  EXPECT_THROW(worker.wait(worker.submit({}), "job 0", 0), SilentDeath);
  // Rank 1 is not told: its receive times out instead of failing with PeerFailedError.
  std::vector<std::byte> buffer(4);
  Request receive = fabric.endpoint(1).recv(0, collective_tag(Channel::kGradients, 0), buffer, "test recv");
  EXPECT_THROW(receive.wait(50ms), CommTimeoutError);
}

TEST(CommWorker, AWaitOnAStoppedCommThreadTimesOutNamingOwnerWhatAndIteration) {
  LocalFabric fabric(1);
  Gate gate;
  // comm_thread_wait(1 ms) = 1.002 s.
  CommWorker worker(fabric.endpoint(0), "pipe-sgd", 2, 1ms, [&](const CommWorker::Job&) { gate.wait(); });
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

// The state letter of thread `tid` of this process ('R' running, 'S' sleeping, ...), from
// /proc/self/task/TID/stat: the field after the parenthesised command name.
char thread_state(pid_t tid) {
  std::ifstream file("/proc/self/task/" + std::to_string(tid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const std::size_t name_end = stat.rfind(')');
  return name_end == std::string::npos || name_end + 2 >= stat.size() ? '?' : stat[name_end + 2];
}

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
    CommWorker worker(fabric.endpoint(0), "test", 3, 5000ms, [&](const CommWorker::Job&) {
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

}  // namespace
}  // namespace pipesgd
