#pragma once
// Message matching as the Transport interface defines it (comm/transport.h): a send from rank A to
// rank B with tag T matches the oldest unmatched recv that B posted from A with tag T, and a recv the
// oldest unmatched send, so messages of one (peer, tag) arrive in posting order (FIFO per (peer, tag)).
// LocalTransport (threads) and SharedMemoryTransport (processes of a host, the queues in shared
// memory) both keep a MatchingMailbox per receiving rank, under a lock of their own.
//
// An Entry is trivially copyable and has `int sender` (the rank, or member, that sends the message:
// a mailbox's entries are all addressed to its rank) and `Tag tag`. MatchQueue<Entry, N> holds at
// most N entries in place, with no constructor to run: zero-filled memory is an empty queue (shared
// memory); MatchQueue<Entry> (N = 0) is unbounded, in a std::vector.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "pipesgd/comm/transport.h"

namespace pipesgd {

namespace matching_detail {

// Storage of N entries in place; trivial, so that zero bytes are an empty queue.
template <typename Entry, std::size_t Capacity>
struct Storage {
  std::uint32_t count;
  Entry entries[Capacity];

  std::size_t size() const { return count; }
  Entry* data() { return entries; }
  const Entry* data() const { return entries; }
  bool push(const Entry& entry) {
    if (count == Capacity) return false;
    entries[count++] = entry;
    return true;
  }
  void erase(std::size_t index) {
    std::memmove(entries + index, entries + index + 1, (count - index - 1) * sizeof(Entry));
    --count;
  }
};

template <typename Entry>
struct Storage<Entry, 0> {
  std::vector<Entry> entries;

  std::size_t size() const { return entries.size(); }
  Entry* data() { return entries.data(); }
  const Entry* data() const { return entries.data(); }
  bool push(const Entry& entry) {
    entries.push_back(entry);
    return true;
  }
  void erase(std::size_t index) { entries.erase(entries.begin() + static_cast<std::ptrdiff_t>(index)); }
};

}  // namespace matching_detail

// Unmatched messages of one direction, oldest first.
template <typename Entry, std::size_t Capacity = 0>
class MatchQueue {
  static_assert(std::is_trivially_copyable_v<Entry>);

 public:
  std::size_t size() const { return storage_.size(); }
  bool full() const { return Capacity != 0 && storage_.size() == Capacity; }

  // Appends `entry` (the newest); false if the queue is full.
  bool push(const Entry& entry) { return storage_.push(entry); }

  // Removes and returns the oldest entry from `sender` with `tag` that `claim(entry)` accepts. An entry
  // it refuses (withdrawn by its owner meanwhile) is removed too, and the search goes on. nullopt if
  // none is left.
  template <typename Claim>
  std::optional<Entry> take(int sender, Tag tag, Claim&& claim) {
    for (std::size_t i = 0; i < storage_.size();) {
      const Entry entry = storage_.data()[i];
      if (entry.sender != sender || entry.tag != tag) {
        ++i;
        continue;
      }
      storage_.erase(i);
      if (claim(entry)) return entry;
    }
    return std::nullopt;
  }
  std::optional<Entry> take(int sender, Tag tag) {
    return take(sender, tag, [](const Entry&) { return true; });
  }

  // Removes the oldest entry that `matches`; false if there is none.
  template <typename Matches>
  bool remove_first(Matches&& matches) {
    for (std::size_t i = 0; i < storage_.size(); ++i) {
      if (matches(storage_.data()[i])) {
        storage_.erase(i);
        return true;
      }
    }
    return false;
  }

  template <typename Visit>
  void for_each(Visit&& visit) const {
    for (std::size_t i = 0; i < storage_.size(); ++i) visit(storage_.data()[i]);
  }

 private:
  matching_detail::Storage<Entry, Capacity> storage_;
};

// The unmatched messages addressed to one rank: sends that found no recv yet, and recvs it posted
// that found no send yet.
template <typename Entry, std::size_t Capacity = 0>
struct MatchingMailbox {
  MatchQueue<Entry, Capacity> sends;  // unmatched sends addressed to this rank, oldest first
  MatchQueue<Entry, Capacity> recvs;  // unmatched recvs this rank posted, oldest first

  // The counterpart of a send (is_send) or recv from `sender` with `tag`: the oldest unmatched recv
  // (or send) of that (sender, tag) that `claim` accepts, removed; nullopt if none (then queue() it).
  template <typename Claim>
  std::optional<Entry> match(bool is_send, int sender, Tag tag, Claim&& claim) {
    return (is_send ? recvs : sends).take(sender, tag, claim);
  }
  std::optional<Entry> match(bool is_send, int sender, Tag tag) { return (is_send ? recvs : sends).take(sender, tag); }
  // Queues an unmatched send (is_send) or recv; false if its queue is full.
  bool queue(bool is_send, const Entry& entry) { return (is_send ? sends : recvs).push(entry); }
  // Withdraws the oldest unmatched send (is_send) or recv that `matches`; false if there is none.
  template <typename Matches>
  bool withdraw(bool is_send, Matches&& matches) {
    return (is_send ? sends : recvs).remove_first(matches);
  }
};

}  // namespace pipesgd
