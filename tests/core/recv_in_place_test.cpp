// Transport::recv_in_place and Request::wait_in_place (comm/transport.h): LocalTransport lends the
// sender's own bytes to a matched recv_in_place (no copy) and completes the send only when the
// receiver's Request lets them go; empty and oversized messages are not lent; a transport that does
// not override recv_in_place (the default) copies into the posted buffer and wait_in_place returns
// its filled prefix. The ring allreduce, whose reduce-scatter reads lent bytes, sums alike over both.
#include <gtest/gtest.h>

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "allreduce_test_support.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/comm/local_transport.h"
#include "thread_state.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/rank_subset_transport.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "int32_bytes.h"
#include "test_world.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

// Never reached: a broken transport hangs until ctest's timeout, which fails the test; no test
// bounds how long a wait may take.
constexpr Timeout long_timeout = std::chrono::hours(1);
constexpr const char* test_operation = "recv_in_place test";

std::vector<std::int32_t> values_in(std::span<const std::byte> message) {
  std::vector<std::int32_t> values(message.size() / sizeof(std::int32_t));
  if (!message.empty()) std::memcpy(values.data(), message.data(), values.size() * sizeof(std::int32_t));
  return values;
}

// The state letter of thread `tid` of this process ('R' running, 'S' sleeping, ...), from
// /proc/self/task/TID/stat: the field after the parenthesised command name.
// A transport that forwards send and recv only: recv_in_place and wait_in_place are the defaults.
class ForwardingTransport final : public Transport {
 public:
  explicit ForwardingTransport(Transport& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Request send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) override {
    return inner_.send(peer, tag, bytes, operation);
  }
  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    return inner_.recv(peer, tag, buffer, operation);
  }
  void report_failure(const std::string& reason) override { inner_.report_failure(reason); }
  std::uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  std::string describe() const override { return "forwarding " + inner_.describe(); }

 private:
  Transport& inner_;
};

// ---------------------------------------------------------------------------------------------
// LocalTransport lends.

struct OrderCase {
  bool send_first;
};
void PrintTo(const OrderCase& c, std::ostream* out) { *out << (c.send_first ? "send posted first" : "recv posted first"); }

class LocalRecvInPlaceEitherOrder : public ::testing::TestWithParam<OrderCase> {
 protected:
  // Rank 0's send of `message` to rank 1 and rank 1's recv_in_place into `buffer`, both with `tag`,
  // posted in the case's order.
  struct Pair {
    Request send;
    Request receive;
  };
  Pair post(LocalFabric& fabric, Tag tag, std::span<const std::byte> message, std::span<std::byte> buffer) const {
    Pair pair;
    if (GetParam().send_first) pair.send = fabric.endpoint(0).send(1, tag, message, test_operation);
    pair.receive = fabric.endpoint(1).recv_in_place(0, tag, buffer, test_operation);
    if (!GetParam().send_first) pair.send = fabric.endpoint(0).send(1, tag, message, test_operation);
    return pair;
  }
};

TEST_P(LocalRecvInPlaceEitherOrder, ReadsTheSendersOwnBytesAndTheSendCompletesWhenTheyAreReturned) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {11, -22, 33, -44, 55};
  std::vector<std::int32_t> buffer(8, -1);  // larger than the message
  auto [send, receive] = post(fabric, 4, bytes_of(message), bytes_of(buffer));
  const std::span<const std::byte> lent = receive.wait_in_place(long_timeout, bytes_of(buffer));
  EXPECT_EQ(lent.data(), bytes_of(message).data()) << "not the sender's bytes";
  EXPECT_EQ(lent.size(), message.size() * sizeof(std::int32_t));
  EXPECT_EQ(values_in(lent), message);
  EXPECT_EQ(buffer, std::vector<std::int32_t>(8, -1)) << "the lent message was also copied";
  EXPECT_TRUE(receive.valid()) << "the handle that holds the lent bytes was released";
  EXPECT_FALSE(send.test()) << "the send completed while its bytes are lent";
  EXPECT_FALSE(send.test()) << "the send completed while its bytes are lent (asked again)";

  receive = Request();  // returns the bytes
  EXPECT_TRUE(send.test()) << "the send did not complete when its bytes were returned";
  EXPECT_EQ(send.wait(long_timeout), message.size() * sizeof(std::int32_t));
}

TEST_P(LocalRecvInPlaceEitherOrder, DestroyingTheReceiveReturnsTheBytesToo) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {7, 8};
  std::vector<std::int32_t> buffer(2, -1);
  Request send;
  {
    Pair pair = post(fabric, 1, bytes_of(message), bytes_of(buffer));
    send = std::move(pair.send);
    Request receive = std::move(pair.receive);
    EXPECT_EQ(values_in(receive.wait_in_place(long_timeout, bytes_of(buffer))), message);
    EXPECT_FALSE(send.test());
  }
  EXPECT_TRUE(send.test());
  EXPECT_EQ(send.wait(long_timeout), 8u);
}

// A matched recv_in_place that is dropped without a wait returns the bytes as well.
TEST_P(LocalRecvInPlaceEitherOrder, AMatchedReceiveDroppedUnreadReturnsTheBytes) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {1, 2, 3};
  std::vector<std::int32_t> buffer(3, -1);
  Request send;
  {
    Pair pair = post(fabric, 2, bytes_of(message), bytes_of(buffer));
    send = std::move(pair.send);
    Request receive = std::move(pair.receive);
    EXPECT_FALSE(send.test());
  }
  EXPECT_EQ(send.wait(long_timeout), 12u);
  EXPECT_EQ(buffer, std::vector<std::int32_t>(3, -1));
}

TEST_P(LocalRecvInPlaceEitherOrder, AnEmptyMessageIsNotLent) {
  LocalFabric fabric(2);
  std::vector<std::int32_t> buffer(4, -1);
  auto [send, receive] = post(fabric, 3, std::span<const std::byte>{}, bytes_of(buffer));
  EXPECT_TRUE(send.test()) << "an empty send waits for a return";
  const std::span<const std::byte> message = receive.wait_in_place(long_timeout, bytes_of(buffer));
  EXPECT_TRUE(message.empty());
  EXPECT_EQ(message.data(), bytes_of(buffer).data()) << "not the posted buffer's empty prefix";
  EXPECT_FALSE(receive.valid()) << "nothing was lent, yet the handle was kept";
  EXPECT_EQ(send.wait(long_timeout), 0u);
  EXPECT_EQ(buffer, std::vector<std::int32_t>(4, -1));
}

TEST_P(LocalRecvInPlaceEitherOrder, AMessageLargerThanTheBufferFailsBothSidesWithCommErrorAndIsNotLent) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {1, 2, 3};
  std::vector<std::int32_t> buffer(2, -1);
  auto [send, receive] = post(fabric, 6, bytes_of(message), bytes_of(buffer));
  // Not lent: the send is already done (failed), before the receive is waited for or dropped.
  EXPECT_TRUE(send.test());
  try {
    receive.wait_in_place(long_timeout, bytes_of(buffer));
    FAIL() << "recv_in_place of a too-large message succeeded";
  } catch (const CommTimeoutError& error) {
    FAIL() << "timed out instead of failing: " << error.what();
  } catch (const CommError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("12"), std::string::npos) << text;  // the message size
    EXPECT_NE(text.find("8"), std::string::npos) << text;   // the buffer size
  }
  try {
    send.wait(long_timeout);
    FAIL() << "the send of a too-large message succeeded";
  } catch (const CommTimeoutError& error) {
    FAIL() << "the send waited for a return: " << error.what();
  } catch (const CommError&) {
  }
  EXPECT_EQ(buffer, std::vector<std::int32_t>(2, -1)) << "the buffer was overrun";
}

INSTANTIATE_TEST_SUITE_P(BothOrders, LocalRecvInPlaceEitherOrder, ::testing::Values(OrderCase{true}, OrderCase{false}),
                         [](const ::testing::TestParamInfo<OrderCase>& info) {
                           return info.param.send_first ? std::string("SendFirst") : std::string("RecvFirst");
                         });

TEST(LocalRecvInPlace, MatchesByPeerAndTagAndLendsEachMessageItsOwnBytes) {
  LocalFabric fabric(3);
  const std::vector<std::int32_t> from_zero_tag_one = {101}, from_zero_tag_two = {102, 102}, from_one = {201};
  std::vector<std::int32_t> buffer_a(4), buffer_b(4), buffer_c(4);
  Request receive_a = fabric.endpoint(2).recv_in_place(0, 2, bytes_of(buffer_a), test_operation);
  Request receive_b = fabric.endpoint(2).recv_in_place(1, 1, bytes_of(buffer_b), test_operation);
  Request receive_c = fabric.endpoint(2).recv_in_place(0, 1, bytes_of(buffer_c), test_operation);
  Request send_a = fabric.endpoint(0).send(2, 1, bytes_of(from_zero_tag_one), test_operation);
  Request send_b = fabric.endpoint(1).send(2, 1, bytes_of(from_one), test_operation);
  Request send_c = fabric.endpoint(0).send(2, 2, bytes_of(from_zero_tag_two), test_operation);
  EXPECT_EQ(receive_a.wait_in_place(long_timeout, bytes_of(buffer_a)).data(), bytes_of(from_zero_tag_two).data());
  EXPECT_EQ(receive_b.wait_in_place(long_timeout, bytes_of(buffer_b)).data(), bytes_of(from_one).data());
  EXPECT_EQ(receive_c.wait_in_place(long_timeout, bytes_of(buffer_c)).data(), bytes_of(from_zero_tag_one).data());
  receive_b = Request();
  EXPECT_TRUE(send_b.test());
  EXPECT_FALSE(send_a.test());
  EXPECT_FALSE(send_c.test());
  receive_a = Request();
  receive_c = Request();
  EXPECT_EQ(send_a.wait(long_timeout), 4u);
  EXPECT_EQ(send_b.wait(long_timeout), 4u);
  EXPECT_EQ(send_c.wait(long_timeout), 8u);
}

// Across threads: a sender blocked in its send's wait wakes up when the receiver returns the bytes.
TEST(LocalRecvInPlace, ASenderBlockedInWaitWakesWhenTheBytesAreReturned) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message(1000, 9);
  std::vector<std::int32_t> buffer(1000);
  std::atomic<pid_t> sender_tid{0};
  std::atomic<bool> returned{false};
  std::size_t sent = 0;
  bool returned_before_the_send_completed = false;
  Request send = fabric.endpoint(0).send(1, 0, bytes_of(message), test_operation);
  Request receive = fabric.endpoint(1).recv_in_place(0, 0, bytes_of(buffer), test_operation);
  EXPECT_EQ(values_in(receive.wait_in_place(long_timeout, bytes_of(buffer))), message);
  std::thread sender([&] {
    sender_tid = ::gettid();
    sent = send.wait(long_timeout);
    returned_before_the_send_completed = returned.load();
  });
  while (sender_tid.load() == 0) std::this_thread::sleep_for(1ms);
  testing_support::wait_until_asleep(sender_tid.load());  // the sender blocks in its wait
  returned = true;
  receive = Request();
  sender.join();
  EXPECT_EQ(sent, 4000u);
  EXPECT_TRUE(returned_before_the_send_completed);
}

// A send whose Request is dropped while its bytes are lent does not return before the receiver let
// them go: the caller may free the buffer right after.
TEST(LocalRecvInPlace, DroppingALentSendWaitsForItsBytes) {
  LocalFabric fabric(2);
  auto message = std::make_unique<std::vector<std::int32_t>>(std::vector<std::int32_t>{5, 6, 7});
  std::vector<std::int32_t> buffer(3);
  Request send = fabric.endpoint(0).send(1, 0, bytes_of(*message), test_operation);
  Request receive = fabric.endpoint(1).recv_in_place(0, 0, bytes_of(buffer), test_operation);
  const std::span<const std::byte> lent = receive.wait_in_place(long_timeout, bytes_of(buffer));
  std::atomic<pid_t> dropper_tid{0};
  std::atomic<bool> returned{false};
  bool dropped_after_the_return = false;
  std::thread dropper([&] {
    dropper_tid = ::gettid();
    send = Request();
    dropped_after_the_return = returned.load();
    message.reset();
  });
  while (dropper_tid.load() == 0) std::this_thread::sleep_for(1ms);
  testing_support::wait_until_asleep(dropper_tid.load());  // dropping a lent send waits for its bytes
  EXPECT_EQ(values_in(lent), (std::vector<std::int32_t>{5, 6, 7})) << "the lent bytes changed while held";
  returned = true;
  receive = Request();
  dropper.join();
  EXPECT_TRUE(dropped_after_the_return);
}

TEST(LocalRecvInPlace, WithLinkEmulationTheMessageIsLentAfterItsWireTime) {
  const NetworkSpec network = parse_network_spec("bw=80Mbit,lat=2ms");  // 10 MB/s
  LocalFabric fabric(2, network);
  std::vector<std::int32_t> message(25000);  // 100 kB: 10 ms on the wire
  for (std::size_t i = 0; i < message.size(); ++i) message[i] = static_cast<std::int32_t>(i * 3 + 1);
  std::vector<std::int32_t> buffer(message.size(), -1);
  const double wire_seconds = 100000 / network.bytes_per_second();

  const Stopwatch stopwatch;
  Request send = fabric.endpoint(0).send(1, 0, bytes_of(message), test_operation);
  Request receive = fabric.endpoint(1).recv_in_place(0, 0, bytes_of(buffer), test_operation);
  const std::span<const std::byte> lent = receive.wait_in_place(long_timeout, bytes_of(buffer));
  EXPECT_GE(stopwatch.seconds(), wire_seconds + network.latency_seconds);  // a lower bound only
  EXPECT_EQ(lent.data(), bytes_of(message).data());
  EXPECT_EQ(values_in(lent), message);
  EXPECT_FALSE(send.test());
  receive = Request();
  EXPECT_EQ(send.wait(long_timeout), 100000u);
}

// A plain recv still copies, whatever recv_in_place does, and wait_in_place on it returns the
// filled prefix of the buffer.
TEST(LocalRecvInPlace, APlainRecvIsNeverLent) {
  LocalFabric fabric(2);
  const std::vector<std::int32_t> message = {4, 5};
  std::vector<std::int32_t> buffer(3, -1);
  Request send = fabric.endpoint(0).send(1, 0, bytes_of(message), test_operation);
  Request receive = fabric.endpoint(1).recv(0, 0, bytes_of(buffer), test_operation);
  EXPECT_TRUE(send.test());
  const std::span<const std::byte> got = receive.wait_in_place(long_timeout, bytes_of(buffer));
  EXPECT_EQ(got.data(), bytes_of(buffer).data());
  EXPECT_EQ(values_in(got), message);
  EXPECT_FALSE(receive.valid());
  EXPECT_EQ(buffer, (std::vector<std::int32_t>{4, 5, -1}));
  EXPECT_EQ(send.wait(long_timeout), 8u);
}

// RankSubsetTransport forwards recv_in_place: the view lends as its transport does.
TEST(LocalRecvInPlace, ARankSubsetViewLendsAsItsTransportDoes) {
  LocalFabric fabric(3);
  RankSubsetTransport view = first_ranks(fabric.endpoint(1), 2);
  const std::vector<std::int32_t> message = {3, 1, 4};
  std::vector<std::int32_t> buffer(3, -1);
  Request send = fabric.endpoint(0).send(1, 0, bytes_of(message), test_operation);
  Request receive = view.recv_in_place(0, 0, bytes_of(buffer), test_operation);
  EXPECT_EQ(receive.wait_in_place(long_timeout, bytes_of(buffer)).data(), bytes_of(message).data());
  EXPECT_FALSE(send.test());
  receive = Request();
  EXPECT_EQ(send.wait(long_timeout), 12u);
}

// ---------------------------------------------------------------------------------------------
// The default: a transport that does not override recv_in_place.

TEST(DefaultRecvInPlace, CopiesIntoTheBufferAndReturnsItsFilledPrefix) {
  for (const bool send_first : {true, false}) {
    SCOPED_TRACE(send_first ? "send posted first" : "recv posted first");
    LocalFabric fabric(2);
    ForwardingTransport sender(fabric.endpoint(0)), receiver(fabric.endpoint(1));
    const std::vector<std::int32_t> message = {10, 20, 30};
    std::vector<std::int32_t> buffer(5, -1);
    Request send, receive;
    if (send_first) {
      send = sender.send(1, 0, bytes_of(message), test_operation);
      receive = receiver.recv_in_place(0, 0, bytes_of(buffer), test_operation);
    } else {
      receive = receiver.recv_in_place(0, 0, bytes_of(buffer), test_operation);
      send = sender.send(1, 0, bytes_of(message), test_operation);
    }
    EXPECT_TRUE(send.test()) << "a copied message's send must not wait for the receiver";
    const std::span<const std::byte> got = receive.wait_in_place(long_timeout, bytes_of(buffer));
    EXPECT_EQ(got.data(), bytes_of(buffer).data()) << "not the posted buffer";
    EXPECT_EQ(got.size(), 12u);
    EXPECT_EQ(values_in(got), message);
    EXPECT_EQ(buffer, (std::vector<std::int32_t>{10, 20, 30, -1, -1}));
    EXPECT_FALSE(receive.valid()) << "the handle was kept although nothing was lent";
    EXPECT_EQ(send.wait(long_timeout), 12u);
  }
}

TEST(DefaultRecvInPlace, AnEmptyMessageGivesAnEmptyPrefix) {
  LocalFabric fabric(2);
  ForwardingTransport sender(fabric.endpoint(0)), receiver(fabric.endpoint(1));
  std::vector<std::int32_t> buffer(2, -1);
  Request receive = receiver.recv_in_place(0, 0, bytes_of(buffer), test_operation);
  Request send = sender.send(1, 0, std::span<const std::byte>{}, test_operation);
  const std::span<const std::byte> got = receive.wait_in_place(long_timeout, bytes_of(buffer));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(got.data(), bytes_of(buffer).data());
  EXPECT_EQ(send.wait(long_timeout), 0u);
}

// ---------------------------------------------------------------------------------------------
// The ring allreduce reads its reduce-scatter steps with wait_in_place: over LocalTransport (lent
// bytes) and over a transport that copies (the default) the results must be the same bit for bit,
// and exact with `none`.

struct RingPathCase {
  int world_size;
  std::size_t count;
  std::string codec;
  std::size_t segment_bytes;
};
void PrintTo(const RingPathCase& c, std::ostream* out) {
  *out << c.world_size << " ranks, " << c.count << " elements, " << c.codec << ", segments "
       << describe_segment_bytes(c.segment_bytes);
}

std::vector<std::vector<float>> ring_results(const RingPathCase& c, bool copying) {
  const std::unique_ptr<Codec> codec = make_codec(c.codec);
  AllreduceOptions options = patient_options;
  options.segment_bytes = c.segment_bytes;
  std::vector<std::vector<float>> results(static_cast<std::size_t>(c.world_size));
  run_ranks(c.world_size, [&](int rank, Transport& local) {
    ForwardingTransport forwarding(local);
    Transport& transport = copying ? static_cast<Transport&>(forwarding) : local;
    std::vector<float> data = values_of_rank(c.codec, rank, c.count);
    RingAllreduce allreduce(transport, c.count, *codec, options);
    for (Tag tag : {Tag{3}, Tag{4}}) {  // twice: the second run reuses the buffers and requests
      data = values_of_rank(c.codec, rank, c.count);
      allreduce.run(data, tag);
    }
    results[static_cast<std::size_t>(rank)] = std::move(data);
  });
  return results;
}

class RingOverBothReceivePaths : public ::testing::TestWithParam<RingPathCase> {};

TEST_P(RingOverBothReceivePaths, LentAndCopiedMessagesGiveTheSameSum) {
  const RingPathCase& c = GetParam();
  const std::vector<std::vector<float>> lent = ring_results(c, false);
  const std::vector<std::vector<float>> copied = ring_results(c, true);
  expect_bit_identical_across_ranks(lent);
  expect_bit_identical_across_ranks(copied);
  ASSERT_EQ(lent[0].size(), c.count);
  ASSERT_EQ(copied[0].size(), c.count);
  if (c.count > 0) {
    EXPECT_EQ(std::memcmp(lent[0].data(), copied[0].data(), c.count * sizeof(float)), 0)
        << "lent and copied receives reduce differently";
  }
  const std::unique_ptr<Codec> codec = make_codec(c.codec);
  const bool exact = c.codec == "none";
  const double bound = exact ? 0.0 : ring_error_bound(*codec, c.world_size, largest_mixed_magnitude);
  expect_close_to_sum(lent[0], expected_sum(c.codec, c.world_size, c.count), bound, exact);
}

std::vector<RingPathCase> ring_path_cases() {
  std::vector<RingPathCase> cases;
  for (int world_size : {1, 2, 3, 5}) {
    std::vector<std::size_t> counts = {0, 1000, 100003};
    if (world_size > 1) counts.push_back(static_cast<std::size_t>(world_size - 1));  // fewer elements than ranks
    for (std::size_t count : counts) {
      for (const char* codec : {"none", "int8"}) cases.push_back({world_size, count, codec, kAutoSegmentBytes});
    }
    cases.push_back({world_size, 1000, "bf16", 64});  // many segments per chunk
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(WorldSizesCountsCodecs, RingOverBothReceivePaths, ::testing::ValuesIn(ring_path_cases()),
                         [](const ::testing::TestParamInfo<RingPathCase>& info) {
                           const RingPathCase& c = info.param;
                           return "Ranks" + std::to_string(c.world_size) + "_Count" + std::to_string(c.count) + "_" +
                                  c.codec + (c.segment_bytes == kAutoSegmentBytes ? "" : "_SmallSegments");
                         });

}  // namespace
}  // namespace pipesgd
