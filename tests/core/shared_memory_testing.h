#pragma once
// Test-only access to a SharedMemoryTransport's insides (its friend; production code never includes
// this header): holding its mailbox lock, counting its busy staging slots.
#include <pthread.h>

#include <cerrno>
#include <memory>

#include "pipesgd/comm/shared_memory_transport.h"
#include "pipesgd/comm/shm/region_layout.h"

namespace pipesgd {

class SharedMemoryTransportTesting {
 public:
  // Takes `transport`'s own mailbox lock until the returned handle is destroyed (on the same
  // thread), so that the other members' posts to this process are deferred meanwhile.
  static std::shared_ptr<void> hold_mailbox_lock(SharedMemoryTransport& transport) {
    pthread_mutex_t& mutex = shm_detail::member_at(transport.shared_, transport.self_).mutex;
    if (pthread_mutex_lock(&mutex) == EOWNERDEAD) pthread_mutex_consistent(&mutex);
    return std::shared_ptr<void>(&mutex, [](void* held) { pthread_mutex_unlock(static_cast<pthread_mutex_t*>(held)); });
  }

  // The staging slots of pairs (any member, this one) holding a message not yet released.
  static int busy_staging_slots(const SharedMemoryTransport& transport) {
    return transport.staging_area_.busy_slots_to(transport.self_);
  }
};

}  // namespace pipesgd
