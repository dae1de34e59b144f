// comm/message_matching.h and comm/operation_pool.h, the matching and pooling LocalTransport and
// SharedMemoryTransport share: FIFO per (sender, tag), tags matched out of posting order, claims that
// drop withdrawn entries, a bounded queue in zero-filled memory; the pool's reuse, bound and refusal.
#include "pipesgd/comm/message_matching.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "pipesgd/comm/operation_pool.h"

namespace pipesgd {
namespace {

struct TestEntry {
  int sender;
  Tag tag;
  int id;  // which message
};

std::vector<int> ids_taken(MatchQueue<TestEntry>& queue, int sender, Tag tag) {
  std::vector<int> ids;
  while (const std::optional<TestEntry> entry = queue.take(sender, tag)) ids.push_back(entry->id);
  return ids;
}

TEST(MessageMatching, SameSenderAndTagAreFirstInFirstOut) {
  MatchQueue<TestEntry> queue;
  for (int id = 0; id < 5; ++id) ASSERT_TRUE(queue.push({1, 7, id}));
  EXPECT_EQ(ids_taken(queue, 1, 7), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(queue.size(), 0u);
}

// Every (sender, tag) is its own FIFO, whatever the interleaving: a take never returns another
// sender's message, nor another tag's, and leaves the others in their order.
TEST(MessageMatching, SendersAndTagsAreMatchedApart) {
  MatchQueue<TestEntry> queue;
  queue.push({1, 7, 0});
  queue.push({2, 7, 1});
  queue.push({1, 8, 2});
  queue.push({1, 7, 3});
  queue.push({2, 7, 4});
  EXPECT_EQ(ids_taken(queue, 2, 7), (std::vector<int>{1, 4}));
  EXPECT_FALSE(queue.take(3, 7).has_value());
  EXPECT_FALSE(queue.take(1, 9).has_value());
  EXPECT_EQ(ids_taken(queue, 1, 7), (std::vector<int>{0, 3}));
  EXPECT_EQ(ids_taken(queue, 1, 8), (std::vector<int>{2}));
}

// Tags taken in another order than they were posted (a ring's steps, a reduce-scatter's segments).
TEST(MessageMatching, TagsPostedOutOfOrderMatchTheirOwn) {
  MatchQueue<TestEntry> queue;
  const std::vector<Tag> posted = {5, 3, 9, 1, 7};
  for (std::size_t i = 0; i < posted.size(); ++i) queue.push({0, posted[i], static_cast<int>(i)});
  for (const Tag tag : {Tag{1}, Tag{3}, Tag{5}, Tag{7}, Tag{9}}) {
    const std::optional<TestEntry> entry = queue.take(0, tag);
    ASSERT_TRUE(entry.has_value()) << tag;
    EXPECT_EQ(entry->tag, tag);
    EXPECT_EQ(posted[static_cast<std::size_t>(entry->id)], tag);
  }
  EXPECT_EQ(queue.size(), 0u);
}

// An entry its claim refuses (its owner withdrew it) is dropped, and the next one is taken.
TEST(MessageMatching, ARefusedEntryIsDroppedAndTheNextTaken) {
  MatchQueue<TestEntry> queue;
  queue.push({1, 7, 0});
  queue.push({1, 7, 1});
  queue.push({1, 7, 2});
  const std::optional<TestEntry> entry = queue.take(1, 7, [](const TestEntry& e) { return e.id != 0; });
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->id, 1);
  EXPECT_EQ(ids_taken(queue, 1, 7), (std::vector<int>{2}));
  queue.push({1, 7, 3});
  EXPECT_FALSE(queue.take(1, 7, [](const TestEntry&) { return false; }).has_value());
  EXPECT_EQ(queue.size(), 0u);  // refused entries are gone
}

TEST(MessageMatching, RemoveFirstWithdrawsTheOldestMatch) {
  MatchQueue<TestEntry> queue;
  queue.push({1, 7, 0});
  queue.push({2, 7, 1});
  queue.push({2, 7, 2});
  EXPECT_TRUE(queue.remove_first([](const TestEntry& e) { return e.sender == 2; }));
  EXPECT_FALSE(queue.remove_first([](const TestEntry& e) { return e.sender == 3; }));
  EXPECT_EQ(ids_taken(queue, 2, 7), (std::vector<int>{2}));
  EXPECT_EQ(ids_taken(queue, 1, 7), (std::vector<int>{0}));
}

// The bounded queue lives in memory nobody constructs (shared memory): zero bytes are an empty queue,
// and a full one refuses more.
TEST(MessageMatching, ABoundedQueueInZeroedMemoryIsEmptyAndRefusesWhenFull) {
  using Queue = MatchQueue<TestEntry, 4>;
  static_assert(std::is_trivially_default_constructible_v<Queue>);
  alignas(Queue) unsigned char memory[sizeof(Queue)];
  std::memset(memory, 0, sizeof memory);
  Queue& queue = *reinterpret_cast<Queue*>(memory);
  EXPECT_EQ(queue.size(), 0u);
  for (int id = 0; id < 4; ++id) EXPECT_TRUE(queue.push({0, Tag(id % 2), id}));
  EXPECT_TRUE(queue.full());
  EXPECT_FALSE(queue.push({0, 0, 4}));
  const std::optional<TestEntry> odd = queue.take(0, 1);
  ASSERT_TRUE(odd.has_value());
  EXPECT_EQ(odd->id, 1);
  EXPECT_TRUE(queue.push({0, 1, 5}));
  std::vector<int> even, rest;
  while (const auto entry = queue.take(0, 0)) even.push_back(entry->id);
  while (const auto entry = queue.take(0, 1)) rest.push_back(entry->id);
  EXPECT_EQ(even, (std::vector<int>{0, 2}));
  EXPECT_EQ(rest, (std::vector<int>{3, 5}));
}

// A mailbox matches a send against its recvs and a recv against its sends, else queues it.
TEST(MessageMatching, AMailboxMatchesEachDirectionAgainstTheOther) {
  MatchingMailbox<TestEntry> mailbox;
  EXPECT_FALSE(mailbox.match(true, 1, 7).has_value());  // a send from rank 1: no recv yet
  mailbox.queue(true, {1, 7, 0});
  EXPECT_FALSE(mailbox.match(true, 1, 7).has_value());  // another send does not match a send
  mailbox.queue(true, {1, 7, 1});
  std::optional<TestEntry> send = mailbox.match(false, 1, 7);  // a recv from rank 1 finds the oldest
  ASSERT_TRUE(send.has_value());
  EXPECT_EQ(send->id, 0);
  EXPECT_FALSE(mailbox.match(false, 2, 7).has_value());
  mailbox.queue(false, {2, 7, 2});
  std::optional<TestEntry> recv = mailbox.match(true, 2, 7);
  ASSERT_TRUE(recv.has_value());
  EXPECT_EQ(recv->id, 2);
  EXPECT_TRUE(mailbox.withdraw(true, [](const TestEntry& e) { return e.id == 1; }));
  EXPECT_EQ(mailbox.sends.size() + mailbox.recvs.size(), 0u);
}

// ---------------------------------------------------------------------------------------------
// The operation pool.

struct PooledOperation {
  explicit PooledOperation(std::size_t index) : index(index) {}
  std::size_t index;
  bool reusable = true;
};

std::shared_ptr<PooledOperation> make(std::size_t index) { return std::make_shared<PooledOperation>(index); }

TEST(OperationPool, ReusesAnOperationOnceNobodyHoldsIt) {
  OperationPool<PooledOperation> pool;
  std::shared_ptr<PooledOperation> a = pool.acquire(make);
  std::shared_ptr<PooledOperation> b = pool.acquire(make);
  EXPECT_NE(a, b);  // a is held: b is new
  PooledOperation* first = a.get();
  a.reset();
  std::shared_ptr<PooledOperation> c = pool.acquire(make);
  EXPECT_EQ(c.get(), first);
  EXPECT_EQ(pool.acquire(make)->index, 2u);  // b and c are held
}

TEST(OperationPool, HandsOutFreeOperationsRoundRobin) {
  OperationPool<PooledOperation> pool;
  {
    std::vector<std::shared_ptr<PooledOperation>> held;
    for (int i = 0; i < 3; ++i) held.push_back(pool.acquire(make));  // makes 0, 1, 2
  }  // all free again
  std::vector<std::size_t> order;
  for (int i = 0; i < 6; ++i) order.push_back(pool.acquire(make)->index);
  EXPECT_EQ(order, (std::vector<std::size_t>{0, 1, 2, 0, 1, 2}));
}

TEST(OperationPool, RefusesBeyondItsCapacityAndSkipsWhatMayNotBeReused) {
  OperationPool<PooledOperation> pool(2);
  const auto reusable = [](const PooledOperation& op) { return op.reusable; };
  std::shared_ptr<PooledOperation> a = pool.acquire(make, reusable);
  std::shared_ptr<PooledOperation> b = pool.acquire(make, reusable);
  EXPECT_EQ(pool.acquire(make, reusable), nullptr);  // both held, and no more may be made
  a->reusable = false;  // e.g. a peer may still copy into it
  a.reset();
  EXPECT_EQ(pool.acquire(make, reusable), nullptr);
  PooledOperation* second = b.get();
  b.reset();
  EXPECT_EQ(pool.acquire(make, reusable).get(), second);
}

}  // namespace
}  // namespace pipesgd
