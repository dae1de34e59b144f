#include "pipesgd/comm/shm/mailbox.h"

#include "pipesgd/comm/shm/region_layout.h"

namespace pipesgd::shm_detail {

Posted post_to_mailbox(Region* region, int receiver, bool is_send, const Entry& posted, Match& match) {
  Mailbox& box = member_at(region, receiver).mailbox;
  if (is_send) {
    // The counterpart: a recv of `receiver`, unless its owner withdrew it (then dropped).
    Slot* const recv_slots = member_at(region, receiver).slots;
    if (const std::optional<Entry> recv = box.match(true, posted.sender, posted.tag,
                                                    [&](const Entry& entry) { return claim(recv_slots[entry.slot]); })) {
      match = Match{posted.sender, posted.slot, receiver, recv->slot, posted.staged, posted.bytes};
      return Posted::kMatched;
    }
  } else if (const std::optional<Entry> send = box.match(false, posted.sender, posted.tag, [&](const Entry& entry) {
               // An eager message is no operation's any more: nothing to claim.
               return entry.staged != 0 || claim(member_at(region, entry.sender).slots[entry.slot]);
             })) {
    match = Match{send->sender, send->slot, receiver, posted.slot, send->staged, send->bytes};
    return Posted::kMatched;
  }
  return box.queue(is_send, posted) ? Posted::kQueued : Posted::kFull;
}

}  // namespace pipesgd::shm_detail
