// Tests of SharedMemoryTransport across processes (fork, forked_world.h): matching by peer and tag in
// both arrival orders, FIFO per (peer, tag), sizes from 0 bytes to megabytes, eager (staged) and
// rendezvous messages and their mix, in-place reads of staged messages, a message too large for its
// buffer, timeouts and failure notices that name the wait, cancellation, deferred posting behind a
// busy mailbox lock, threads of one process at once, and every allreduce algorithm and codec over it
// against closed-form sums, every staging slot released afterwards. Every wait here that must not
// expire has an hour: no test bounds how long a wait may take (a broken transport fails at ctest's
// timeout instead).
#include "pipesgd/comm/shared_memory_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"
#include "allreduce_test_support.h"
#include "forked_world.h"
#include "int32_bytes.h"
#include "shared_memory_testing.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

constexpr Timeout never = std::chrono::hours(1);  // a wait that must not time out
constexpr const char* test_operation = "shm test";
// Small staging slots, so that the tests' small messages are eager and their large ones rendezvous,
// and two slots per pair, so that a burst of messages uses both kinds.
constexpr SharedMemoryStaging small_staging{4096, 2};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Throws std::runtime_error(what) unless `condition` (children report failures as text).
void check(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

std::vector<std::int32_t> pattern(int from, int to, std::size_t count) {
  std::vector<std::int32_t> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<std::int32_t>(from * 1000003 + to * 7919 + i);
  return values;
}

void expect_all_ok(const std::vector<std::string>& errors) {
  for (std::size_t rank = 0; rank < errors.size(); ++rank) EXPECT_EQ(errors[rank], "") << "rank " << rank;
}

// Staging: 1 MiB slots, up to 4 per pair, within a quarter of the free space and 256 MiB in all;
// none for one process or when not even one slot per pair fits.
TEST(SharedMemoryTransport, StagingFitsTheSpaceAvailable) {
  constexpr std::size_t MiB = 1 << 20;
  const auto staging = [](int members, std::size_t available) {
    const SharedMemoryStaging s = SharedMemoryTransport::staging_for(members, available);
    return std::pair<std::size_t, int>(s.slot_bytes, s.slots_per_pair);
  };
  EXPECT_EQ(staging(4, 12000 * MiB), std::make_pair(MiB, 4));  // 12 pairs x 4 slots: 48 MiB
  EXPECT_EQ(staging(16, 12000 * MiB), std::make_pair(MiB, 1));  // 240 pairs: 256 MiB / 240
  EXPECT_EQ(staging(4, 64 * MiB), std::make_pair(MiB, 1));       // 16 MiB for 12 pairs
  EXPECT_EQ(staging(4, 32 * MiB).first, 0u);                     // 8 MiB: not one slot per pair
  EXPECT_EQ(staging(64, 12000 * MiB).first, 0u);
  EXPECT_EQ(staging(1, 12000 * MiB).first, 0u);
  EXPECT_GT(SharedMemoryTransport::region_bytes(2, {MiB, 2}), SharedMemoryTransport::region_bytes(2) + 8 * MiB - 1);
}

TEST(SharedMemoryTransport, RegionHoldsEveryMember) {
  EXPECT_GT(SharedMemoryTransport::region_bytes(2), SharedMemoryTransport::region_bytes(1));
  ForkedWorld world(3, sizeof(std::int32_t) * 4);
  expect_all_ok(world.run([&](SharedMemoryTransport& transport, std::span<std::byte> output) {
    auto* out = reinterpret_cast<std::int32_t*>(output.data());
    out[0] = transport.rank();
    out[1] = transport.size();
    out[2] = transport.reaches(2) && !transport.reaches(3) && !transport.reaches(-1);
    out[3] = contains(transport.describe(), "3 processes");
  }));
  for (int rank = 0; rank < 3; ++rank) {
    const std::span<std::int32_t> out = world.output_as<std::int32_t>(rank);
    EXPECT_EQ(out[0], rank);
    EXPECT_EQ(out[1], 3);
    EXPECT_EQ(out[2], 1);
    EXPECT_EQ(out[3], 1);
  }
}

// Every rank sends every other rank (and itself) messages of several sizes, with the recv posted
// first (signal) or the send posted first; every byte arrives where its (peer, tag) says.
struct ExchangeCase {
  int ranks;
  std::size_t count;  // int32 values per message
  bool recv_first;
  bool staging;
};
std::ostream& operator<<(std::ostream& out, const ExchangeCase& c) {
  return out << c.ranks << " ranks, " << c.count << " values, " << (c.recv_first ? "recv" : "send") << " posted first, "
             << (c.staging ? "small staging" : "no staging");
}

class SharedMemoryExchange : public ::testing::TestWithParam<ExchangeCase> {};

TEST_P(SharedMemoryExchange, EveryPairExchangesByTag) {
  const ExchangeCase c = GetParam();
  ForkedWorld world(c.ranks, 0, c.staging ? small_staging : SharedMemoryStaging{});
  expect_all_ok(world.run([&](SharedMemoryTransport& transport, std::span<std::byte>) {
    const int me = transport.rank();
    std::vector<std::vector<std::int32_t>> inbox(static_cast<std::size_t>(c.ranks), std::vector<std::int32_t>(c.count, -1));
    std::vector<std::vector<std::int32_t>> outbox;
    for (int peer = 0; peer < c.ranks; ++peer) outbox.push_back(pattern(me, peer, c.count));
    std::vector<Request> receives, sends;
    auto post_receives = [&] {
      for (int peer = 0; peer < c.ranks; ++peer) {
        receives.push_back(transport.recv(peer, 40 + peer, bytes_of(inbox[static_cast<std::size_t>(peer)]), test_operation));
      }
    };
    auto post_sends = [&] {
      for (int peer = 0; peer < c.ranks; ++peer) {
        sends.push_back(transport.send(peer, 40 + me, bytes_of(outbox[static_cast<std::size_t>(peer)]), test_operation));
      }
    };
    if (c.recv_first) {
      post_receives();
      world.signal(0).fetch_add(1);
      world.await(0, c.ranks);  // every rank's receives are posted
      post_sends();
    } else {
      post_sends();
      world.signal(0).fetch_add(1);
      world.await(0, c.ranks);  // every rank's sends are posted
      post_receives();
    }
    for (Request& r : receives) check(r.wait(never) == c.count * sizeof(std::int32_t), "received size");
    for (Request& s : sends) check(s.wait(never) == c.count * sizeof(std::int32_t), "sent size");
    for (int peer = 0; peer < c.ranks; ++peer) {
      check(inbox[static_cast<std::size_t>(peer)] == pattern(peer, me, c.count), "payload from rank " + std::to_string(peer));
    }
    check(transport.bytes_sent() == static_cast<std::uint64_t>(c.ranks) * c.count * sizeof(std::int32_t), "bytes_sent");
    world.signal(1).fetch_add(1);
    world.await(1, c.ranks);  // every rank has read its messages
    check(SharedMemoryTransportTesting::busy_staging_slots(transport) == 0, "a staging slot was not released");
  }));
}

std::vector<ExchangeCase> exchange_cases() {
  std::vector<ExchangeCase> cases;
  for (const bool staging : {false, true}) {
    for (const bool recv_first : {true, false}) {
      cases.push_back({2, 0, recv_first, staging});
      cases.push_back({2, 1, recv_first, staging});
      cases.push_back({3, 1000, recv_first, staging});   // 4000 bytes: eager with staging
      cases.push_back({4, 700000, recv_first, staging});  // 2.8 MB: rendezvous
      cases.push_back({1, 50, recv_first, staging});
    }
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Cases, SharedMemoryExchange, ::testing::ValuesIn(exchange_cases()));

// Several messages with one (peer, tag) arrive in posting order, whichever side posts first.
TEST(SharedMemoryTransport, SameTagIsFifo) {
  for (const bool recv_first : {true, false}) {
   for (const SharedMemoryStaging staging : {SharedMemoryStaging{}, small_staging}) {  // with staging: 2 eager, 3 rendezvous
    ForkedWorld world(2, 0, staging);
    expect_all_ok(world.run([&](SharedMemoryTransport& transport, std::span<std::byte>) {
      constexpr int kMessages = 5;
      if (transport.rank() == 0) {
        std::vector<std::vector<std::int32_t>> values;
        for (int i = 0; i < kMessages; ++i) values.push_back({i * 11, i * 11 + 1});
        if (!recv_first) {
          std::vector<Request> sends;
          for (auto& v : values) sends.push_back(transport.send(1, 7, bytes_of(v), test_operation));
          world.signal(0).store(1);
          for (Request& s : sends) s.wait(never);
        } else {
          world.await(0, 1);
          for (auto& v : values) transport.send(1, 7, bytes_of(v), test_operation).wait(never);
        }
      } else {
        if (!recv_first) world.await(0, 1);
        std::vector<std::vector<std::int32_t>> got(kMessages, std::vector<std::int32_t>(2, -1));
        std::vector<Request> receives;
        for (auto& g : got) receives.push_back(transport.recv(0, 7, bytes_of(g), test_operation));
        if (recv_first) world.signal(0).store(1);
        for (Request& r : receives) r.wait(never);
        for (int i = 0; i < kMessages; ++i) {
          check(got[static_cast<std::size_t>(i)] == std::vector<std::int32_t>{i * 11, i * 11 + 1},
                "message " + std::to_string(i) + " out of order");
        }
      }
    }));
   }
  }
}

// A message larger than the posted buffer fails both sides of a rendezvous with a CommError naming
// sizes and peer; an eager message (staged) fails only the receiver, as MPI's eager sends do.
TEST(SharedMemoryTransport, EagerMessageTooLargeFailsTheReceiver) {
  ForkedWorld world(2, 0, small_staging);
  const std::vector<std::string> errors = world.run([&](SharedMemoryTransport& transport, std::span<std::byte>) {
    std::vector<std::int32_t> values(10, 3), small(4, 0);
    if (transport.rank() == 0) {
      transport.send(1, 9, bytes_of(values), test_operation).wait(never);
    } else {
      world.await(0, 0);
      transport.recv(0, 9, bytes_of(small), test_operation).wait(never);
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "shm test: recv from rank 0 (tag gradients:0 step 0 segment 9) on rank 1: message of 40 bytes "
                       "from rank 0 does not fit the receive buffer of 16 bytes");
}

TEST(SharedMemoryTransport, MessageTooLargeFailsBothSides) {
  ForkedWorld world(2);
  const std::vector<std::string> errors = world.run([&](SharedMemoryTransport& transport, std::span<std::byte>) {
    std::vector<std::int32_t> values(10, 3), small(4, 0);
    if (transport.rank() == 0) {
      transport.send(1, 9, bytes_of(values), test_operation).wait(never);
    } else {
      transport.recv(0, 9, bytes_of(small), test_operation).wait(never);
    }
  });
  EXPECT_TRUE(contains(errors[0], "send to rank 1") && contains(errors[0], "does not fit")) << errors[0];
  EXPECT_TRUE(contains(errors[1], "recv from rank 0") && contains(errors[1], "message of 40 bytes") &&
              contains(errors[1], "receive buffer of 16 bytes"))
      << errors[1];
}

// A wait with no peer times out with the wait named (operation, direction, peer, tag, rank).
TEST(SharedMemoryTransport, TimeoutNamesTheWait) {
  ForkedWorld world(2, sizeof(std::int32_t));
  const std::vector<std::string> errors = world.run([&](SharedMemoryTransport& transport, std::span<std::byte> output) {
    if (transport.rank() == 1) {
      world.await(0, 1);
      return;
    }
    std::vector<std::int32_t> buffer(1);
    try {
      transport.recv(1, step_tag(collective_tag(Channel::kGradients, 17), 0, 0), bytes_of(buffer), test_operation).wait(200ms);
    } catch (const CommTimeoutError& error) {
      *reinterpret_cast<std::int32_t*>(output.data()) = error.peer();
      world.signal(0).store(1);
      throw;
    }
  });
  EXPECT_EQ(errors[0], "shm test: recv from rank 1 (tag gradients:17 step 0 segment 0) on rank 0 timed out after 0.2 s");
  EXPECT_EQ(world.output_as<std::int32_t>(0)[0], 1);
  EXPECT_EQ(errors[1], "");
}

// report_failure wakes a wait sleeping in another process: PeerFailedError naming the reporter.
TEST(SharedMemoryTransport, FailureWakesSleepingWaitsOfOtherProcesses) {
  ForkedWorld world(3);
  const std::vector<std::string> errors = world.run([&](SharedMemoryTransport& transport, std::span<std::byte>) {
    std::vector<std::int32_t> buffer(1);
    if (transport.rank() == 2) {
      world.await(0, 2);  // both others are about to wait
      transport.report_failure("disk full");
      return;
    }
    Request receive = transport.recv(2, 5, bytes_of(buffer), test_operation);
    world.signal(0).fetch_add(1);
    receive.wait(never);
  });
  for (int rank : {0, 1}) {
    EXPECT_EQ(errors[static_cast<std::size_t>(rank)],
              "shm test: recv from rank 2 (tag gradients:0 step 0 segment 5) on rank " + std::to_string(rank) +
                  " aborted: rank 2 failed: disk full")
        << rank;
  }
  EXPECT_EQ(errors[2], "");
}

// The external check runs while a wait sleeps, and what it throws ends the wait.
TEST(SharedMemoryTransport, ExternalCheckEndsASleepingWait) {
  const std::size_t bytes = SharedMemoryTransport::region_bytes(1);
  SharedRegion region = SharedRegion::anonymous(bytes);
  int checks = 0;
  SharedMemoryTransport transport(std::move(region), {0}, 0, 1, SharedMemoryStaging{}, never, [&](const std::string& waiter) {
    if (++checks == 3) throw PeerFailedError(waiter + " aborted: rank 5 failed: on another host");
  });
  ASSERT_TRUE(transport.usable());
  std::vector<std::int32_t> buffer(1);
  Request receive = transport.recv(0, 3, bytes_of(buffer), test_operation);
  try {
    receive.wait(never);
    ADD_FAILURE() << "the wait returned";
  } catch (const PeerFailedError& error) {
    EXPECT_EQ(std::string(error.what()),
              "shm test: recv from rank 0 (tag gradients:0 step 0 segment 3) on rank 0 aborted: rank 5 failed: on another host");
  }
  EXPECT_EQ(checks, 3);
}

// recv_in_place of an eager message reads it in its staging slot (lent, not copied into the posted
// buffer); the slot is free again once the Request goes, so later eager messages find it.
TEST(SharedMemoryTransport, InPlaceRecvReadsAStagedMessageWhereItIs) {
  ForkedWorld world(2, sizeof(std::int32_t) * 4, small_staging);
  expect_all_ok(world.run([&](SharedMemoryTransport& transport, std::span<std::byte> output) {
    if (transport.rank() == 0) {
      for (int i = 0; i < 6; ++i) {
        const std::vector<std::int32_t> value = {100 + i};
        transport.send(1, 2, bytes_of(value), test_operation).wait(never);  // eager: done once posted
        world.await(0, i + 1);
      }
      return;
    }
    auto* out = reinterpret_cast<std::int32_t*>(output.data());
    for (int i = 0; i < 6; ++i) {
      std::vector<std::int32_t> posted = {-1};
      Request receive = transport.recv_in_place(0, 2, bytes_of(posted), test_operation);
      const std::span<const std::byte> message = receive.wait_in_place(never, bytes_of(posted));
      std::int32_t value = 0;
      std::memcpy(&value, message.data(), sizeof value);
      check(value == 100 + i, "lent message " + std::to_string(i));
      out[0] += message.data() != reinterpret_cast<const std::byte*>(posted.data()) ? 1 : 0;  // lent
      out[1] += posted[0] == -1 ? 1 : 0;                                                        // not copied
      out[2] = std::max(out[2], SharedMemoryTransportTesting::busy_staging_slots(transport));
      receive = Request();
      out[3] = SharedMemoryTransportTesting::busy_staging_slots(transport);
      world.signal(0).store(i + 1);
    }
  }));
  const std::span<std::int32_t> out = world.output_as<std::int32_t>(1);
  EXPECT_EQ(out[0], 6);  // every message lent
  EXPECT_EQ(out[1], 6);
  EXPECT_EQ(out[2], 1);  // one slot held while read
  EXPECT_EQ(out[3], 0);  // and released
}

// A dropped (cancelled) unmatched recv is never filled: the next recv with its tag gets the message.
TEST(SharedMemoryTransport, CancelledRecvIsNotMatched) {
  ForkedWorld world(2, sizeof(std::int32_t) * 2);
  expect_all_ok(world.run([&](SharedMemoryTransport& transport, std::span<std::byte> output) {
    if (transport.rank() == 0) {
      world.await(0, 1);
      const std::vector<std::int32_t> value = {42};
      transport.send(1, 8, bytes_of(value), test_operation).wait(never);
      return;
    }
    auto* out = reinterpret_cast<std::int32_t*>(output.data());
    std::vector<std::int32_t> dropped = {-1}, kept = {-1};
    { Request cancelled = transport.recv(0, 8, bytes_of(dropped), test_operation); }
    Request receive = transport.recv(0, 8, bytes_of(kept), test_operation);
    world.signal(0).store(1);
    receive.wait(never);
    out[0] = dropped[0];
    out[1] = kept[0];
  }));
  EXPECT_EQ(world.output_as<std::int32_t>(1)[0], -1);
  EXPECT_EQ(world.output_as<std::int32_t>(1)[1], 42);
}

// Posts to a member whose mailbox lock is busy are deferred, then posted in order by the sender's
// next wait; a deferred send that is cancelled never arrives.
TEST(SharedMemoryTransport, PostsBehindABusyMailboxLockAreDeferredInOrder) {
 for (const SharedMemoryStaging staging : {SharedMemoryStaging{}, small_staging}) {
  ForkedWorld world(2, 0, staging);
  expect_all_ok(world.run([&](SharedMemoryTransport& transport, std::span<std::byte>) {
    if (transport.rank() == 1) {
      std::vector<std::vector<std::int32_t>> got(3, std::vector<std::int32_t>(1, -1));
      {
        const std::shared_ptr<void> held = SharedMemoryTransportTesting::hold_mailbox_lock(transport);
        world.signal(0).store(1);
        world.await(1, 1);  // rank 0 has posted while the lock was held
      }
      std::vector<Request> receives;
      for (auto& g : got) receives.push_back(transport.recv(0, 6, bytes_of(g), test_operation));
      for (std::size_t i = 0; i < 2; ++i) receives[i].wait(never);
      check(got[0][0] == 1 && got[1][0] == 3, "deferred messages out of order or lost");
      check(!receives[2].test(), "a cancelled deferred send arrived");
      return;
    }
    world.await(0, 1);
    const std::vector<std::int32_t> one = {1}, two = {2}, three = {3};
    Request first = transport.send(1, 6, bytes_of(one), test_operation);
    { Request cancelled = transport.send(1, 6, bytes_of(two), test_operation); }
    Request third = transport.send(1, 6, bytes_of(three), test_operation);
    check(!first.test(), "a send completed while its peer's mailbox was locked");
    world.signal(1).store(1);
    first.wait(never);
    third.wait(never);
  }));
 }
}

// Two threads of each process exchange at once over one transport.
TEST(SharedMemoryTransport, ThreadsOfOneProcessShareTheTransport) {
  ForkedWorld world(2);
  expect_all_ok(world.run([&](SharedMemoryTransport& transport, std::span<std::byte>) {
    const int peer = 1 - transport.rank();
    auto exchange = [&](int thread, std::string& failure) {
      try {
        for (int round = 0; round < 200; ++round) {
          const Tag tag = static_cast<Tag>(thread * 1000 + round);
          std::vector<std::int32_t> out = pattern(transport.rank(), thread, 64), in(64, -1);
          Request receive = transport.recv(peer, tag, bytes_of(in), test_operation);
          Request send = transport.send(peer, tag, bytes_of(out), test_operation);
          receive.wait(never);
          send.wait(never);
          check(in == pattern(peer, thread, 64), "payload of thread " + std::to_string(thread));
        }
      } catch (const std::exception& error) {
        failure = error.what();
      }
    };
    std::string failure_a, failure_b;
    std::thread a(exchange, 0, std::ref(failure_a));
    exchange(1, failure_b);
    a.join();
    check(failure_a.empty() && failure_b.empty(), failure_a + failure_b);
  }));
}

// Every allreduce algorithm and codec over processes: the sum in closed form (exact for none, within
// the algorithm's bound for int8) and bit-identical on every rank.
struct ProcessAllreduceCase {
  std::string algorithm;
  std::string codec;
  int ranks;
  std::size_t count;
  bool staging;
};
std::ostream& operator<<(std::ostream& out, const ProcessAllreduceCase& c) {
  return out << c.algorithm << " " << c.codec << " " << c.ranks << " ranks " << c.count << " values"
             << (c.staging ? ", small staging" : "");
}

class SharedMemoryAllreduce : public ::testing::TestWithParam<ProcessAllreduceCase> {};

TEST_P(SharedMemoryAllreduce, SumsAcrossProcesses) {
  const ProcessAllreduceCase c = GetParam();
  ForkedWorld world(c.ranks, c.count * sizeof(float), c.staging ? small_staging : SharedMemoryStaging{});
  expect_all_ok(world.run([&](SharedMemoryTransport& transport, std::span<std::byte> output) {
    const std::unique_ptr<Codec> codec = make_codec(c.codec);
    AllreduceOptions options = patient_options;
    options.segment_bytes = 4096;  // several segments per chunk in the larger cases
    const std::unique_ptr<Allreduce> allreduce = make_allreduce(c.algorithm, transport, c.count, *codec, options);
    std::vector<float> data = values_of_rank(c.codec, transport.rank(), c.count);
    for (int round = 0; round < 2; ++round) {  // built once, run many times
      data = values_of_rank(c.codec, transport.rank(), c.count);
      allreduce->run(data, collective_tag(Channel::kGradients, static_cast<std::uint64_t>(round)));
    }
    std::memcpy(output.data(), data.data(), c.count * sizeof(float));
    world.signal(0).fetch_add(1);
    world.await(0, c.ranks);
    check(SharedMemoryTransportTesting::busy_staging_slots(transport) == 0, "a staging slot was not released");
  }));
  std::vector<std::vector<float>> results;
  for (int rank = 0; rank < c.ranks; ++rank) {
    const std::span<float> out = world.output_as<float>(rank);
    results.emplace_back(out.begin(), out.end());
  }
  expect_bit_identical_across_ranks(results);
  const std::vector<double> expected = expected_sum(c.codec, c.ranks, c.count);
  const std::unique_ptr<Codec> codec = make_codec(c.codec);
  const double bound = c.codec == "none" ? 0.0 : allreduce_error_bound(c.algorithm, *codec, c.ranks, largest_mixed_magnitude);
  for (std::size_t i = 0; i < c.count; ++i) {
    ASSERT_LE(std::abs(results[0][i] - expected[i]), bound) << "element " << i;
  }
}

std::vector<ProcessAllreduceCase> process_allreduce_cases() {
  std::vector<ProcessAllreduceCase> cases;
  for (const std::string& algorithm : allreduce_algorithm_names()) {
    for (const int ranks : {2, 3, 4}) {
      for (const std::size_t count : {std::size_t{0}, std::size_t{2}, std::size_t{20000}}) {
        cases.push_back({algorithm, "none", ranks, count, false});
        cases.push_back({algorithm, "none", ranks, count, true});
      }
      cases.push_back({algorithm, "int8", ranks, 20000, false});
      cases.push_back({algorithm, "int8", ranks, 20000, true});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Algorithms, SharedMemoryAllreduce, ::testing::ValuesIn(process_allreduce_cases()),
                         [](const ::testing::TestParamInfo<ProcessAllreduceCase>& info) {
                           std::string name = info.param.algorithm + "_" + info.param.codec + "_" +
                                              std::to_string(info.param.ranks) + "_ranks_" +
                                              std::to_string(info.param.count) +
                                              (info.param.staging ? "_staged" : "");
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace pipesgd
