#pragma once
// The process-local half of a SharedMemoryTransport operation: the RequestState of one send or recv,
// a handle on its slot (shm/slot.h) in this member's table. It waits for its slot to be done under
// comm/wait.h's policy (a few polls; on any thread but a communication thread, polls that yield for
// SharedMemoryTransport::kPollBeforeSleep; then sleeps on the slot's futex, kWaitSlice at a time,
// posting what this process deferred first), and withdraws itself when its Request goes unfinished.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "pipesgd/comm/shared_memory_transport.h"
#include "pipesgd/comm/shm/region_layout.h"
#include "pipesgd/comm/shm/slot.h"

namespace pipesgd::shm_detail {

class Operation final : public RequestState {
 public:
  Operation(SharedMemoryTransport& transport, std::uint32_t index) : transport_(transport), index_(index) {}

  // Makes this (finished) operation a new send or recv of `bytes` bytes at `data`: its slot pending.
  void start(bool is_send, bool in_place, int peer, int peer_member, Tag tag, std::byte* data, std::size_t bytes,
             const char* operation);

  std::size_t wait(Timeout timeout) override;
  std::span<const std::byte> wait_in_place(Timeout timeout, std::span<const std::byte> posted) override;
  bool lends() const override { return lent_; }
  bool test() override;
  void cancel() override;

  Slot& slot() const { return member_at(transport_.shared_, transport_.self_).slots[index_]; }
  std::uint32_t index() const { return index_; }
  bool is_send() const { return is_send_; }
  Tag tag() const { return tag_; }
  int peer_member() const { return peer_member_; }
  // The member whose mailbox holds this operation while it is unmatched: the receiver's.
  int mailbox() const { return is_send_ ? peer_member_ : transport_.self_; }
  bool leaked() const { return leaked_; }
  std::size_t bytes() const { return slot().bytes; }
  // A send whose payload is in staging slot k of (this member, peer): k + 1, else 0.
  std::uint32_t staged() const { return staged_; }
  void set_staged(std::uint32_t staged) { staged_ = staged; }
  std::atomic<bool> deferred{false};  // waiting in this process's deferred queue of mailbox()

  // "<operation>: send to rank P (tag ...) on rank R" (comm/transport.h).
  std::string describe_wait() const;

 private:
  struct WaitSite;

  // Blocks until the slot is done (or throws: timeout, failure).
  void await_done(Timeout timeout);
  // After await_done: copies a staged message out and frees its staging slot; throws the outcome's error.
  std::size_t finish();
  // Frees the staging slot of a received staged message (once read).
  void release_staged();

  SharedMemoryTransport& transport_;
  const std::uint32_t index_;
  bool is_send_ = false;
  int peer_ = -1;
  int peer_member_ = -1;
  Tag tag_ = 0;
  const char* operation_ = "";
  bool in_place_ = false;  // a recv_in_place: a staged message may be read in place
  std::uint32_t staged_ = 0;
  bool lent_ = false;  // wait_in_place returned a staging slot's bytes: freed by cancel()
  bool finished_ = true;
  bool leaked_ = false;  // never reused: a copy into or out of it may still come
};

}  // namespace pipesgd::shm_detail
