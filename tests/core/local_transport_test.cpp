// Tests of LocalFabric / LocalTransport: matching, ordering, errors, cancellation, link emulation,
// and of the run_ranks harness in test_world.h.
#include "pipesgd/comm/local_transport.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "int32_bytes.h"
#include "test_world.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

// Generous: only reached if the transport is broken; the test then fails instead of hanging.
constexpr Timeout long_timeout = 30s;
constexpr const char* test_operation = "transport test";

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LocalTransport, EndpointsKnowTheirRankAndTheWorldSize) {
  LocalFabric fabric(3);
  EXPECT_EQ(fabric.size(), 3);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(fabric.endpoint(rank).rank(), rank);
    EXPECT_EQ(fabric.endpoint(rank).size(), 3);
  }
  EXPECT_TRUE(contains(fabric.endpoint(0).describe(), "3 ranks")) << fabric.endpoint(0).describe();
  EXPECT_THROW(LocalFabric(0), UsageError);
}

TEST(LocalTransport, MessagesMatchByPeerAndTag) {
  LocalFabric fabric(3);
  Transport& first = fabric.endpoint(0);
  Transport& second = fabric.endpoint(1);
  Transport& receiver = fabric.endpoint(2);
  std::vector<std::int32_t> from_first_tag_one(1), from_second_tag_one(1), from_first_tag_two(1);
  // Posted in an order that differs from the sends' order.
  Request receive_a = receiver.recv(0, 1, bytes_of(from_first_tag_one), test_operation);
  Request receive_b = receiver.recv(1, 1, bytes_of(from_second_tag_one), test_operation);
  Request receive_c = receiver.recv(0, 2, bytes_of(from_first_tag_two), test_operation);

  const std::vector<std::int32_t> first_tag_two = {102}, first_tag_one = {101},
                                   second_tag_one = {201};
  Request send_a = first.send(2, 2, bytes_of(first_tag_two), test_operation);
  Request send_b = second.send(2, 1, bytes_of(second_tag_one), test_operation);
  Request send_c = first.send(2, 1, bytes_of(first_tag_one), test_operation);

  EXPECT_EQ(receive_a.wait(long_timeout), sizeof(std::int32_t));
  EXPECT_EQ(receive_b.wait(long_timeout), sizeof(std::int32_t));
  EXPECT_EQ(receive_c.wait(long_timeout), sizeof(std::int32_t));
  EXPECT_EQ(send_a.wait(long_timeout), sizeof(std::int32_t));
  send_b.wait(long_timeout);
  send_c.wait(long_timeout);
  EXPECT_EQ(from_first_tag_one[0], 101);
  EXPECT_EQ(from_second_tag_one[0], 201);
  EXPECT_EQ(from_first_tag_two[0], 102);
}

TEST(LocalTransport, LargeTagsAreDistinct) {
  LocalFabric fabric(2);
  const Tag high = Tag{1} << 63;
  std::vector<std::int32_t> high_value = {1}, low_value = {2}, received_high(1), received_low(1);
  Request send_high = fabric.endpoint(0).send(1, high, bytes_of(high_value), test_operation);
  Request send_low = fabric.endpoint(0).send(1, 0, bytes_of(low_value), test_operation);
  Request receive_low = fabric.endpoint(1).recv(0, 0, bytes_of(received_low), test_operation);
  Request receive_high = fabric.endpoint(1).recv(0, high, bytes_of(received_high), test_operation);
  receive_low.wait(long_timeout);
  receive_high.wait(long_timeout);
  send_high.wait(long_timeout);
  send_low.wait(long_timeout);
  EXPECT_EQ(received_high[0], 1);
  EXPECT_EQ(received_low[0], 2);
}

TEST(LocalTransport, SamePeerAndTagIsFirstInFirstOutWithSendsPostedFirst) {
  LocalFabric fabric(2);
  const std::vector<std::vector<std::int32_t>> messages = {{1, 1}, {2}, {3, 3, 3}};
  std::vector<Request> sends;
  for (const auto& message : messages) {
    sends.push_back(fabric.endpoint(0).send(1, 5, bytes_of(message), test_operation));
  }
  std::vector<std::vector<std::int32_t>> received(3, std::vector<std::int32_t>(3, -1));
  for (auto& buffer : received) {
    const std::size_t bytes =
        fabric.endpoint(1).recv(0, 5, bytes_of(buffer), test_operation).wait(long_timeout);
    buffer.resize(bytes / sizeof(std::int32_t));
  }
  for (Request& send : sends) send.wait(long_timeout);
  EXPECT_EQ(received, messages);
}

TEST(LocalTransport, SamePeerAndTagIsFirstInFirstOutWithRecvsPostedFirst) {
  LocalFabric fabric(2);
  std::vector<std::vector<std::int32_t>> received(4, std::vector<std::int32_t>(1, -1));
  std::vector<Request> receives;
  for (auto& buffer : received) {
    receives.push_back(fabric.endpoint(1).recv(0, 9, bytes_of(buffer), test_operation));
  }
  const std::vector<std::vector<std::int32_t>> messages = {{10}, {20}, {30}, {40}};
  std::vector<Request> sends;
  for (const auto& message : messages) {
    sends.push_back(fabric.endpoint(0).send(1, 9, bytes_of(message), test_operation));
  }
  for (Request& receive : receives) receive.wait(long_timeout);
  for (Request& send : sends) send.wait(long_timeout);
  EXPECT_EQ(received, messages);
}

TEST(LocalTransport, RecvPostedAfterTheSendOnAnotherThreadCompletes) {
  std::vector<std::int32_t> received(3, 0);
  run_ranks(2, [&](int rank, Transport& transport) {
    if (rank == 0) {
      const std::vector<std::int32_t> message = {7, 8, 9};
      transport.send(1, 3, bytes_of(message), test_operation).wait(long_timeout);
    } else {
      std::this_thread::sleep_for(20ms);  // let the send be posted first (either order must work)
      transport.recv(0, 3, bytes_of(received), test_operation).wait(long_timeout);
    }
  });
  EXPECT_EQ(received, (std::vector<std::int32_t>{7, 8, 9}));
}

TEST(LocalTransport, SendCompletesOnlyOnceTheRecvIsPosted) {
  // Rendezvous: an unmatched send is not complete.
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {5};
  Request send = fabric.endpoint(0).send(1, 0, bytes_of(message), test_operation);
  EXPECT_FALSE(send.test());
  std::vector<std::int32_t> received(1);
  Request receive = fabric.endpoint(1).recv(0, 0, bytes_of(received), test_operation);
  EXPECT_TRUE(send.test());
  EXPECT_TRUE(receive.test());
  receive.wait(long_timeout);
  send.wait(long_timeout);
  EXPECT_EQ(received[0], 5);
}

TEST(LocalTransport, ZeroByteMessagesAreDelivered) {
  LocalFabric fabric(2);
  std::vector<std::int32_t> empty, roomy(4, -1);
  Request receive_empty = fabric.endpoint(1).recv(0, 1, bytes_of(empty), test_operation);
  Request send_one = fabric.endpoint(0).send(1, 1, std::span<const std::byte>{}, test_operation);
  Request send_two = fabric.endpoint(0).send(1, 2, std::span<const std::byte>{}, test_operation);
  Request receive_roomy = fabric.endpoint(1).recv(0, 2, bytes_of(roomy), test_operation);
  EXPECT_EQ(receive_empty.wait(long_timeout), 0u);
  EXPECT_EQ(receive_roomy.wait(long_timeout), 0u);
  EXPECT_EQ(send_one.wait(long_timeout), 0u);
  EXPECT_EQ(send_two.wait(long_timeout), 0u);
  EXPECT_EQ(roomy, (std::vector<std::int32_t>(4, -1))) << "a 0-byte message writes nothing";
}

TEST(LocalTransport, SmallerMessageThanTheBufferReportsItsOwnSize) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {1, 2};
  std::vector<std::int32_t> buffer(5, -1);
  Request send = fabric.endpoint(0).send(1, 0, bytes_of(message), test_operation);
  Request receive = fabric.endpoint(1).recv(0, 0, bytes_of(buffer), test_operation);
  EXPECT_EQ(receive.wait(long_timeout), 2 * sizeof(std::int32_t));
  EXPECT_EQ(send.wait(long_timeout), 2 * sizeof(std::int32_t));
  EXPECT_EQ(buffer, (std::vector<std::int32_t>{1, 2, -1, -1, -1}));
}

TEST(LocalTransport, SelfSendIsDelivered) {
  LocalFabric fabric(2);
  Transport& transport = fabric.endpoint(1);
  const std::vector<std::int32_t> message = {42, 43};
  std::vector<std::int32_t> received(2);
  Request send = transport.send(1, 4, bytes_of(message), test_operation);
  Request receive = transport.recv(1, 4, bytes_of(received), test_operation);
  EXPECT_EQ(receive.wait(long_timeout), 8u);
  EXPECT_EQ(send.wait(long_timeout), 8u);
  EXPECT_EQ(received, message);
}

TEST(LocalTransport, MessageLargerThanTheReceiveBufferFailsBothWaitsWithCommError) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {1, 2, 3};
  std::vector<std::int32_t> buffer(2, -1);
  Request receive = fabric.endpoint(1).recv(0, 6, bytes_of(buffer), test_operation);
  Request send = fabric.endpoint(0).send(1, 6, bytes_of(message), test_operation);
  try {
    receive.wait(long_timeout);
    FAIL() << "recv of a too-large message succeeded";
  } catch (const CommTimeoutError& error) {
    FAIL() << "timed out instead of failing: " << error.what();
  } catch (const CommError& error) {
    EXPECT_TRUE(contains(error.what(), "12")) << error.what();  // the message size
    EXPECT_TRUE(contains(error.what(), "8")) << error.what();   // the buffer size
  }
  EXPECT_THROW(send.wait(long_timeout), CommError);
  EXPECT_EQ(buffer, (std::vector<std::int32_t>{-1, -1})) << "the buffer must not be overrun";
}

TEST(LocalTransport, RecvThatNobodySendsTimesOutNamingOperationPeerAndTag) {
  LocalFabric fabric(3);
  std::vector<std::int32_t> buffer(1);
  Request receive = fabric.endpoint(0).recv(2, 77, bytes_of(buffer), "gradient exchange");
  try {
    receive.wait(50ms);
    FAIL() << "wait returned without a sender";
  } catch (const CommTimeoutError& error) {
    const std::string message = error.what();
    EXPECT_TRUE(contains(message, "gradient exchange")) << message;
    EXPECT_TRUE(contains(message, "rank 2")) << message;
    EXPECT_TRUE(contains(message, "77")) << message;
  }
}

TEST(LocalTransport, SendThatNobodyReceivesTimesOut) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {1};
  Request send = fabric.endpoint(0).send(1, 31, bytes_of(message), "parameter push");
  try {
    send.wait(50ms);
    FAIL() << "an unmatched send completed";
  } catch (const CommTimeoutError& error) {
    const std::string text = error.what();
    EXPECT_TRUE(contains(text, "parameter push")) << text;
    EXPECT_TRUE(contains(text, "rank 1")) << text;
    EXPECT_TRUE(contains(text, "31")) << text;
  }
}

TEST(LocalTransport, ReportedFailureAbortsAnotherRanksPendingWait) {
  LocalFabric fabric(3);
  std::string caught_type = "nothing";
  std::string caught_message;
  std::thread waiter([&] {
    std::vector<std::int32_t> buffer(1);
    Request receive = fabric.endpoint(2).recv(0, 1, bytes_of(buffer), test_operation);
    try {
      receive.wait(long_timeout);
    } catch (const PeerFailedError& error) {
      caught_type = "PeerFailedError";
      caught_message = error.what();
    } catch (const std::exception& error) {
      caught_type = "other";
      caught_message = error.what();
    }
  });
  std::this_thread::sleep_for(30ms);  // most likely blocked in wait() by now; either way must work
  fabric.endpoint(1).report_failure("out of memory");
  waiter.join();
  EXPECT_EQ(caught_type, "PeerFailedError") << caught_message;
  EXPECT_TRUE(contains(caught_message, "rank 1")) << caught_message;
  EXPECT_TRUE(contains(caught_message, "out of memory")) << caught_message;
  EXPECT_TRUE(fabric.failed());
  EXPECT_TRUE(contains(fabric.failure_message(), "rank 1")) << fabric.failure_message();
}

TEST(LocalTransport, ReportedFailureAbortsLaterWaitsAndTheFirstReportWins) {
  LocalFabric fabric(3);
  fabric.endpoint(0).report_failure("first");
  fabric.endpoint(2).report_failure("second");  // idempotent: the first reason is kept
  std::vector<std::int32_t> buffer(1);
  try {
    fabric.endpoint(1).recv(2, 0, bytes_of(buffer), test_operation).wait(long_timeout);
    FAIL() << "wait succeeded after a failure";
  } catch (const PeerFailedError& error) {
    EXPECT_TRUE(contains(error.what(), "rank 0")) << error.what();
    EXPECT_TRUE(contains(error.what(), "first")) << error.what();
  }
  const std::vector<std::int32_t> message = {1};
  EXPECT_THROW(fabric.endpoint(2).send(1, 0, bytes_of(message), test_operation).wait(long_timeout),
               PeerFailedError);
}

TEST(LocalTransport, DroppingAnUnmatchedRecvCancelsIt) {
  LocalFabric fabric(2);
  std::vector<std::int32_t> abandoned(1, -1), fresh(1, -1);
  {
    Request dropped = fabric.endpoint(1).recv(0, 8, bytes_of(abandoned), test_operation);
  }
  const std::vector<std::int32_t> message = {99};
  Request send = fabric.endpoint(0).send(1, 8, bytes_of(message), test_operation);
  EXPECT_FALSE(send.test()) << "the send matched the cancelled recv";
  Request receive = fabric.endpoint(1).recv(0, 8, bytes_of(fresh), test_operation);
  receive.wait(long_timeout);
  send.wait(long_timeout);
  EXPECT_EQ(fresh[0], 99);
  EXPECT_EQ(abandoned[0], -1) << "the cancelled recv's buffer was written";
}

TEST(LocalTransport, DroppingAnUnmatchedSendWithdrawsIt) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> withdrawn = {1}, kept = {2};
  { Request dropped = fabric.endpoint(0).send(1, 8, bytes_of(withdrawn), test_operation); }
  Request send = fabric.endpoint(0).send(1, 8, bytes_of(kept), test_operation);
  std::vector<std::int32_t> received(1, -1);
  fabric.endpoint(1).recv(0, 8, bytes_of(received), test_operation).wait(long_timeout);
  send.wait(long_timeout);
  EXPECT_EQ(received[0], 2);
}

TEST(LocalTransport, BytesSentCountsPayloadBytes) {
  LocalFabric fabric(2);
  EXPECT_EQ(fabric.endpoint(0).bytes_sent(), 0u);
  const std::vector<std::int32_t> three = {1, 2, 3}, one = {4};
  std::vector<std::int32_t> buffer(3);
  std::vector<Request> sends;
  sends.push_back(fabric.endpoint(0).send(1, 0, bytes_of(three), test_operation));
  sends.push_back(fabric.endpoint(0).send(1, 0, std::span<const std::byte>{}, test_operation));
  sends.push_back(fabric.endpoint(0).send(1, 0, bytes_of(one), test_operation));
  for (int i = 0; i < 3; ++i) {
    fabric.endpoint(1).recv(0, 0, bytes_of(buffer), test_operation).wait(long_timeout);
  }
  for (Request& send : sends) send.wait(long_timeout);
  EXPECT_EQ(fabric.endpoint(0).bytes_sent(), 16u);
  EXPECT_EQ(fabric.endpoint(1).bytes_sent(), 0u) << "receiving does not count";
}

TEST(LocalTransport, PeerOutsideTheWorldThrowsUsageError) {
  LocalFabric fabric(3);
  const std::vector<std::int32_t> message = {1};
  std::vector<std::int32_t> buffer(1);
  Transport& transport = fabric.endpoint(1);
  EXPECT_THROW(transport.send(3, 0, bytes_of(message), test_operation), UsageError);
  EXPECT_THROW(transport.send(-1, 0, bytes_of(message), test_operation), UsageError);
  EXPECT_THROW(transport.recv(3, 0, bytes_of(buffer), test_operation), UsageError);
  EXPECT_THROW(transport.recv(-1, 0, bytes_of(buffer), test_operation), UsageError);
  try {
    transport.send(7, 0, bytes_of(message), "weight broadcast");
    FAIL() << "peer 7 of 3 accepted";
  } catch (const UsageError& error) {
    EXPECT_TRUE(contains(error.what(), "weight broadcast")) << error.what();
    EXPECT_TRUE(contains(error.what(), "7")) << error.what();
  }
}

TEST(LocalTransport, ManyConcurrentMessagesBetweenAllRanksArriveIntact) {
  constexpr int world_size = 4;
  constexpr int messages_per_pair = 50;
  std::atomic<int> corrupted{0};
  run_ranks(world_size, [&](int rank, Transport& transport) {
    // A second thread of the same rank receives while this one sends.
    std::thread receiver([&] {
      std::vector<std::int32_t> buffer(3);
      for (int round = 0; round < messages_per_pair; ++round) {
        for (int peer = 0; peer < world_size; ++peer) {
          if (peer == rank) continue;
          transport.recv(peer, static_cast<Tag>(round), bytes_of(buffer), test_operation)
              .wait(long_timeout);
          if (buffer != std::vector<std::int32_t>{peer, rank, round}) ++corrupted;
        }
      }
    });
    std::vector<std::vector<std::int32_t>> payloads;
    std::vector<Request> sends;
    payloads.reserve(messages_per_pair * world_size);
    for (int round = 0; round < messages_per_pair; ++round) {
      for (int peer = 0; peer < world_size; ++peer) {
        if (peer == rank) continue;
        payloads.push_back({rank, peer, round});
        sends.push_back(
            transport.send(peer, static_cast<Tag>(round), bytes_of(payloads.back()), test_operation));
      }
    }
    for (Request& send : sends) send.wait(long_timeout);
    receiver.join();
  });
  EXPECT_EQ(corrupted.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Link emulation. Only lower bounds on time are asserted: this machine is noisy, so a transfer
// may always take longer than the emulated wire time, never shorter.

TEST(LocalTransportLinkEmulation, TransferTakesAtLeastSizeOverBandwidthPlusLatency) {
  const NetworkSpec network = parse_network_spec("bw=80Mbit,lat=5ms");  // 10 MB/s
  LocalFabric fabric(2, network);
  const std::vector<std::int32_t> message(25000, 1);  // 100 kB: 10 ms on the wire
  std::vector<std::int32_t> buffer(message.size());
  const double wire_seconds = 100000 / network.bytes_per_second();

  const Stopwatch stopwatch;
  Request send = fabric.endpoint(0).send(1, 0, bytes_of(message), test_operation);
  Request receive = fabric.endpoint(1).recv(0, 0, bytes_of(buffer), test_operation);
  receive.wait(long_timeout);
  const double receive_seconds = stopwatch.seconds();
  send.wait(long_timeout);
  const double send_seconds = stopwatch.seconds();
  EXPECT_GE(receive_seconds, wire_seconds + network.latency_seconds);
  EXPECT_GE(send_seconds, wire_seconds);
  EXPECT_EQ(buffer, message);
}

TEST(LocalTransportLinkEmulation, LatencyAloneDelaysEvenAnEmptyMessage) {
  const NetworkSpec network = parse_network_spec("lat=20ms");
  LocalFabric fabric(2, network);
  const Stopwatch stopwatch;
  Request send = fabric.endpoint(1).send(0, 0, std::span<const std::byte>{}, test_operation);
  Request receive = fabric.endpoint(0).recv(1, 0, std::span<std::byte>{}, test_operation);
  receive.wait(long_timeout);
  EXPECT_GE(stopwatch.seconds(), 0.020);
  send.wait(long_timeout);
}

TEST(LocalTransportLinkEmulation, BackToBackMessagesShareTheSendersEgress) {
  const NetworkSpec network = parse_network_spec("bw=80Mbit,lat=1ms");
  LocalFabric fabric(3, network);
  const std::vector<std::int32_t> message(25000, 2);  // 10 ms each
  std::vector<std::int32_t> first_buffer(message.size()), second_buffer(message.size());
  const double wire_seconds = 100000 / network.bytes_per_second();

  const Stopwatch stopwatch;
  Request send_first = fabric.endpoint(0).send(1, 0, bytes_of(message), test_operation);
  Request send_second = fabric.endpoint(0).send(2, 0, bytes_of(message), test_operation);
  Request receive_first = fabric.endpoint(1).recv(0, 0, bytes_of(first_buffer), test_operation);
  Request receive_second = fabric.endpoint(2).recv(0, 0, bytes_of(second_buffer), test_operation);
  receive_second.wait(long_timeout);
  EXPECT_GE(stopwatch.seconds(), 2 * wire_seconds + network.latency_seconds);
  send_second.wait(long_timeout);
  EXPECT_GE(stopwatch.seconds(), 2 * wire_seconds);
  receive_first.wait(long_timeout);
  send_first.wait(long_timeout);
}

TEST(LocalTransportLinkEmulation, MessagesFromTwoSendersShareTheReceiversIngress) {
  const NetworkSpec network = parse_network_spec("bw=80Mbit");
  LocalFabric fabric(3, network);
  const std::vector<std::int32_t> message(25000, 3);  // 10 ms each
  std::vector<std::int32_t> first_buffer(message.size()), second_buffer(message.size());
  const double wire_seconds = 100000 / network.bytes_per_second();

  const Stopwatch stopwatch;
  Request send_first = fabric.endpoint(1).send(0, 0, bytes_of(message), test_operation);
  Request send_second = fabric.endpoint(2).send(0, 0, bytes_of(message), test_operation);
  Request receive_first = fabric.endpoint(0).recv(1, 0, bytes_of(first_buffer), test_operation);
  Request receive_second = fabric.endpoint(0).recv(2, 0, bytes_of(second_buffer), test_operation);
  receive_first.wait(long_timeout);
  receive_second.wait(long_timeout);
  EXPECT_GE(stopwatch.seconds(), 2 * wire_seconds);
  send_first.wait(long_timeout);
  send_second.wait(long_timeout);
}

// ---------------------------------------------------------------------------------------------
// The run_ranks harness itself.

TEST(LocalTransportTestWorld, RunsEveryRankOnItsOwnEndpoint) {
  std::vector<int> seen_rank(5, -1), seen_size(5, -1);
  run_ranks(5, [&](int rank, Transport& transport) {
    seen_rank[rank] = transport.rank();
    seen_size[rank] = transport.size();
  });
  EXPECT_EQ(seen_rank, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(seen_size, (std::vector<int>(5, 5)));
}

TEST(LocalTransportTestWorld, RethrowsTheRootCauseAndReleasesTheOtherRanks) {
  std::atomic<int> released_by_peer_failure{0};
  try {
    run_ranks(3, [&](int rank, Transport& transport) {
      if (rank == 1) throw std::runtime_error("rank one exploded");
      std::vector<std::int32_t> buffer(1);
      try {
        transport.recv(1, 0, bytes_of(buffer), test_operation).wait(long_timeout);
      } catch (const PeerFailedError&) {
        ++released_by_peer_failure;
        throw;
      }
    });
    FAIL() << "run_ranks did not rethrow";
  } catch (const PeerFailedError& error) {
    FAIL() << "rethrew a consequence, not the root cause: " << error.what();
  } catch (const std::runtime_error& error) {
    EXPECT_STREQ(error.what(), "rank one exploded");
  }
  EXPECT_EQ(released_by_peer_failure.load(), 2);
}

TEST(LocalTransportTestWorld, PassesTheNetworkSpecToTheFabric) {
  std::string description;
  run_ranks(
      2,
      [&](int rank, Transport& transport) {
        if (rank == 0) description = transport.describe();
      },
      parse_network_spec("bw=2.5Gbit,lat=30us"));
  EXPECT_TRUE(contains(description, "2.5 Gbit/s")) << description;
}

}  // namespace
}  // namespace pipesgd
