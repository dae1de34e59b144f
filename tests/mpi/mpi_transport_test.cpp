// MpiTransport under mpirun: point-to-point messages by (peer, tag), the tag mapping onto MPI,
// timeouts and failure notices that name the operation, peer and tag.
#include "pipesgd/mpi/mpi_transport.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <numeric>
#include <vector>

#include "mpi_test_world.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

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
  EXPECT_EQ(r1.wait(10s), 40u);
  EXPECT_EQ(r2.wait(10s), 80u);
  EXPECT_EQ(r3.wait(10s), 4u);
  s1.wait(10s);
  s2.wait(10s);
  s3.wait(10s);
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
  EXPECT_THROW(receive.wait(10s), CommError);
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
      never.wait(60s);
      ADD_FAILURE() << "expected PeerFailedError";  // not FAIL(): the barrier below must be reached
    } catch (const PeerFailedError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("rank 1 failed: disk on fire"), std::string::npos) << message;
      EXPECT_NE(message.find("test receive: recv from rank 1"), std::string::npos) << message;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace pipesgd
