#pragma once
// The mailboxes of a SharedMemoryTransport's region: every member's unmatched sends addressed to it
// and unmatched recvs it posted, matched FIFO per (peer, tag) (comm/message_matching.h, the queues in
// shared memory), under the member's process-shared robust mutex.
//
// A posted operation that finds its counterpart removes it and the pair is a Match: the process that
// posted second moves the payload (SharedMemoryTransport::transfer). Else the operation is queued for
// its counterpart to find. A recv's counterpart must still be pending: claiming its slot (pending ->
// copying, shm/slot.h) fails if its owner withdrew it meanwhile, and the entry is dropped. An eager
// send's entry is the message itself (in a staging slot): its operation slot is done with, and it is
// never claimed.
#include <cstdint>
#include <optional>

#include "pipesgd/comm/message_matching.h"
#include "pipesgd/comm/shared_memory_transport.h"

namespace pipesgd::shm_detail {

// An unmatched operation of member `sender` (a send) or of the mailbox's member (a recv from
// `sender`): its slot `slot` of its owner, tag `tag`. A send entry with `staged` = k + 1 is an eager
// message of `bytes` bytes in staging slot k of its pair.
struct Entry {
  Tag tag;
  std::int32_t sender;
  std::uint32_t slot;
  std::uint32_t staged;
  std::uint64_t bytes;
};

using Mailbox = MatchingMailbox<Entry, SharedMemoryTransport::kMailboxEntries>;

// A matched pair: the payload of `send_slot` of member `sender` (or, if `staged` = k + 1, the `bytes`
// in staging slot k of the pair) goes to `recv_slot` of `receiver`.
struct Match {
  int sender = -1;
  std::uint32_t send_slot = 0;
  int receiver = -1;
  std::uint32_t recv_slot = 0;
  std::uint32_t staged = 0;
  std::uint64_t bytes = 0;
};

struct Region;

enum class Posted { kMatched, kQueued, kFull };

// Under the lock of the mailbox of member `receiver`: posts the send (is_send) or recv whose own entry
// is `posted` (its sender, tag, its slot; a send's staging and size). Removes its counterpart (claiming
// the counterpart's slot) and sets `match` (kMatched), or queues it (kQueued), or finds its queue full
// (kFull: the caller throws).
Posted post_to_mailbox(Region* region, int receiver, bool is_send, const Entry& posted, Match& match);

}  // namespace pipesgd::shm_detail
