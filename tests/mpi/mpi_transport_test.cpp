// MpiTransport under mpirun: point-to-point messages by (peer, tag), the tag mapping onto MPI,
// timeouts and failure notices that name the operation, peer and tag; same-host ranks through shared
// memory (and, with PIPESGD_MPI_SHARED_MEMORY=0, as ctest's mpi_path runs set it, through MPI), and a
// world split into simulated hosts whose messages take both routes.
#include "pipesgd/mpi/mpi_transport.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "mpi_test_world.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

// The timeout of a wait that must not expire: no test bounds how long a wait may take on a loaded
// machine (a broken transport fails at ctest's timeout instead).
constexpr Timeout forever = std::chrono::hours(1);

TEST(MpiTransport, RankAndSizeMatchMpi) {
  MpiTransport transport(*test_mpi_runtime);
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(transport.rank(), rank);
  EXPECT_EQ(transport.size(), size);
  EXPECT_NE(transport.describe().find("mpi ("), std::string::npos);
}

// Every rank sends to its right neighbour on two tags posted in the opposite order of the receives:
// messages match by tag, not by arrival order, and byte counts are reported.
TEST(MpiTransport, MatchesByTagAcrossChannelsAndSequences) {
  MpiTransport transport(*test_mpi_runtime);
  const int p = transport.size(), rank = transport.rank();
  const int right = (rank + 1) % p, left = (rank + p - 1) % p;
  const Tag first = step_tag(collective_tag(Channel::kGradients, 5), 3, 1);
  const Tag second = step_tag(collective_tag(Channel::kControl, 5), 3, 1);  // same fields, other channel
  const Tag third = step_tag(collective_tag(Channel::kGradients, 6), 3, 1);
  std::vector<int> out1(10, rank), out2(20, rank * 2), out3(1, rank * 3);
  std::vector<int> in1(10, -1), in2(20, -1), in3(1, -1);
  Request r3 = transport.recv(left, third, std::as_writable_bytes(std::span(in3)), "test");
  Request r2 = transport.recv(left, second, std::as_writable_bytes(std::span(in2)), "test");
  Request r1 = transport.recv(left, first, std::as_writable_bytes(std::span(in1)), "test");
  Request s1 = transport.send(right, first, std::as_bytes(std::span(out1)), "test");
  Request s2 = transport.send(right, second, std::as_bytes(std::span(out2)), "test");
  Request s3 = transport.send(right, third, std::as_bytes(std::span(out3)), "test");
  EXPECT_EQ(r1.wait(forever), 40u);
  EXPECT_EQ(r2.wait(forever), 80u);
  EXPECT_EQ(r3.wait(forever), 4u);
  s1.wait(forever);
  s2.wait(forever);
  s3.wait(forever);
  EXPECT_EQ(in1, std::vector<int>(10, left));
  EXPECT_EQ(in2, std::vector<int>(20, left * 2));
  EXPECT_EQ(in3, std::vector<int>(1, left * 3));
  EXPECT_EQ(transport.bytes_sent(), 124u);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(MpiTransport, TimeoutNamesOperationPeerAndTag) {
  MpiTransport transport(*test_mpi_runtime);
  const int p = transport.size(), rank = transport.rank();
  const int left = (rank + p - 1) % p;
  std::vector<float> buffer(4);
  const Tag tag = step_tag(collective_tag(Channel::kGradients, 17), 2, 0);
  Request never = transport.recv(left, tag, std::as_writable_bytes(std::span(buffer)), "test receive");
  try {
    never.wait(200ms);
    ADD_FAILURE() << "expected CommTimeoutError";  // not FAIL(): the barrier below must be reached
  } catch (const CommTimeoutError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("test receive"), std::string::npos) << message;
    EXPECT_NE(message.find(concat("recv from rank ", left)), std::string::npos) << message;
    EXPECT_NE(message.find("tag gradients:17 step 2 segment 0"), std::string::npos) << message;
    EXPECT_NE(message.find("timed out after 0.2 s"), std::string::npos) << message;
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the cancelled receive is gone on every rank before the next test
}

TEST(MpiTransport, OversizedMessageIsACommError) {
  MpiTransport transport(*test_mpi_runtime);
  const int p = transport.size(), rank = transport.rank();
  const int right = (rank + 1) % p, left = (rank + p - 1) % p;
  std::vector<float> out(8, 1.0f), in(4);
  const Tag tag = step_tag(collective_tag(Channel::kGradients, 1), 0, 0);
  Request receive = transport.recv(left, tag, std::as_writable_bytes(std::span(in)), "test");
  Request send = transport.send(right, tag, std::as_bytes(std::span(out)), "test");
  EXPECT_THROW(receive.wait(forever), CommError);
  try {
    send.wait(2s);
  } catch (const CommError&) {
    // the sender may or may not learn of the truncation; either is fine
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 1 reports a failure; every other rank's pending wait throws PeerFailedError naming rank 1
// and its reason, well before the (long) timeout.
TEST(MpiTransport, FailureNoticeReachesEveryRank) {
  MpiTransport transport(*test_mpi_runtime);
  const int rank = transport.rank();
  if (rank == 1) {
    transport.report_failure("disk on fire");
  } else {
    std::vector<float> buffer(1);
    const Tag tag = step_tag(collective_tag(Channel::kGradients, 3), 0, 0);
    Request never = transport.recv(1, tag, std::as_writable_bytes(std::span(buffer)), "test receive");
    try {  // a PeerFailedError (not a CommTimeoutError) shows the notice ended the wait
      never.wait(forever);
      ADD_FAILURE() << "expected PeerFailedError";  // not FAIL(): the barrier below must be reached
    } catch (const PeerFailedError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("rank 1 failed: disk on fire"), std::string::npos) << message;
      EXPECT_NE(message.find("test receive: recv from rank 1"), std::string::npos) << message;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// barrier() returns on no rank before the last one has called it (rank 0, 400 ms late).
TEST(MpiTransport, BarrierWaitsForTheLastRank) {
  MpiTransport transport(*test_mpi_runtime);
  MPI_Barrier(MPI_COMM_WORLD);
  if (transport.rank() == 0) {
    std::this_thread::sleep_for(400ms);
    transport.barrier(forever, "test barrier");
  } else {
    Stopwatch waited;
    transport.barrier(forever, "test barrier");
    EXPECT_GE(waited.seconds(), 0.2);  // a lower bound only: a descheduled rank arrives late
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A rank that failed ends the others' barrier with PeerFailedError naming it, before the timeout.
TEST(MpiTransport, FailureNoticeEndsTheBarrier) {
  MpiTransport transport(*test_mpi_runtime);
  if (transport.rank() == 1) {
    transport.report_failure("disk on fire");
    MPI_Barrier(MPI_COMM_WORLD);  // the others have given up on their barrier
    try {  // joins it late, so every rank's MPI_Ibarrier completes before MPI_Finalize
      transport.barrier(forever, "test barrier");
    } catch (const PeerFailedError&) {
      // it may or may not see its own failure first; either is fine
    }
  } else {
    try {
      transport.barrier(forever, "test barrier");
      FAIL() << "expected PeerFailedError";
    } catch (const PeerFailedError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("rank 1 failed: disk on fire"), std::string::npos) << message;
      EXPECT_NE(message.find(concat("test barrier: barrier on rank ", transport.rank())),
                std::string::npos)
          << message;
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// One host (mpirun on this machine): every rank is reached through shared memory, so no wait polls;
// with PIPESGD_MPI_SHARED_MEMORY=0 none is, and the description says why.
TEST(MpiTransport, RanksOfThisHostGoThroughSharedMemory) {
  MpiTransport transport(*test_mpi_runtime);
  const int p = transport.size();
  if (shared_memory_from_environment(true)) {
    std::vector<int> everyone(static_cast<std::size_t>(p));
    std::iota(everyone.begin(), everyone.end(), 0);
    EXPECT_EQ(transport.shared_memory_peers(), everyone);
    EXPECT_TRUE(transport.waits_sleep());
    EXPECT_NE(transport.describe().find(concat("the ", p, " ranks of this host through shared memory")), std::string::npos)
        << transport.describe();
  } else {
    EXPECT_TRUE(transport.shared_memory_peers().empty());
    EXPECT_FALSE(transport.waits_sleep());
    EXPECT_NE(transport.describe().find("PIPESGD_MPI_SHARED_MEMORY=0"), std::string::npos) << transport.describe();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Ranks split into two simulated hosts by parity: messages to the own host's ranks go through shared
// memory, the others through MPI. Every rank sends every rank (itself included) a message of its own
// size and contents, receives posted in reverse order; then a ring allreduce over the mixed routes
// gives the closed-form sum.
TEST(MpiTransport, SimulatedHostsMixSharedMemoryAndMpi) {
  MpiTransportOptions options;
  options.simulated_hosts = 2;
  MpiTransport transport(*test_mpi_runtime, options);
  const int p = transport.size(), rank = transport.rank();
  std::vector<int> same_host;
  for (int r = rank % 2; r < p; r += 2) same_host.push_back(r);
  if (shared_memory_from_environment(true) && same_host.size() > 1) {
    EXPECT_EQ(transport.shared_memory_peers(), same_host);
  } else {
    EXPECT_TRUE(transport.shared_memory_peers().empty());
  }
  EXPECT_FALSE(transport.waits_sleep());  // some waits are on MPI (or every one is)

  std::vector<std::vector<int>> inbox, outbox;
  for (int peer = 0; peer < p; ++peer) {
    inbox.emplace_back(static_cast<std::size_t>(10 + peer * 1000 + rank), -1);
    outbox.emplace_back(static_cast<std::size_t>(10 + rank * 1000 + peer), rank * 100 + peer);
  }
  std::vector<Request> receives, sends;
  for (int peer = p - 1; peer >= 0; --peer) {
    receives.push_back(transport.recv(peer, step_tag(collective_tag(Channel::kGradients, 9), 0, static_cast<std::size_t>(peer)),
                                      std::as_writable_bytes(std::span(inbox[static_cast<std::size_t>(peer)])), "test"));
  }
  for (int peer = 0; peer < p; ++peer) {
    sends.push_back(transport.send(peer, step_tag(collective_tag(Channel::kGradients, 9), 0, static_cast<std::size_t>(rank)),
                                   std::as_bytes(std::span(outbox[static_cast<std::size_t>(peer)])), "test"));
  }
  for (Request& r : receives) r.wait(forever);
  for (Request& s : sends) s.wait(forever);
  for (int peer = 0; peer < p; ++peer) {
    EXPECT_EQ(inbox[static_cast<std::size_t>(peer)], std::vector<int>(static_cast<std::size_t>(10 + peer * 1000 + rank), peer * 100 + rank))
        << "from rank " << peer;
  }

  const std::unique_ptr<Codec> none = make_codec("none");
  constexpr std::size_t kCount = 100003;
  RingAllreduce ring(transport, kCount, *none, AllreduceOptions{forever, 4096});
  std::vector<float> data(kCount);
  for (std::size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>((i % 17) + static_cast<std::size_t>(rank));
  ring.run(data, collective_tag(Channel::kGradients, 10));
  for (std::size_t i = 0; i < kCount; ++i) {
    const float expected = static_cast<float>(p * static_cast<int>(i % 17) + p * (p - 1) / 2);
    if (data[i] != expected) {
      ADD_FAILURE() << "element " << i << ": " << data[i] << " != " << expected;
      break;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// With simulated hosts, a failure reaches waits on both routes: the reporter's own host through the
// shared-memory flag, the other host through MPI's notice.
TEST(MpiTransport, FailureNoticeReachesBothRoutes) {
  MpiTransportOptions options;
  options.simulated_hosts = 2;
  MpiTransport transport(*test_mpi_runtime, options);
  if (transport.rank() == 1) {
    transport.report_failure("disk on fire");
  } else {
    std::vector<float> buffer(1);
    const Tag tag = step_tag(collective_tag(Channel::kGradients, 4), 0, 0);
    Request never = transport.recv(1, tag, std::as_writable_bytes(std::span(buffer)), "test receive");
    try {
      never.wait(forever);
      ADD_FAILURE() << "expected PeerFailedError";
    } catch (const PeerFailedError& error) {
      EXPECT_NE(std::string(error.what()).find("rank 1 failed: disk on fire"), std::string::npos) << error.what();
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace pipesgd
