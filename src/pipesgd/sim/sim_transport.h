#pragma once
// SimTransport: the Transport interface over SimGrid communications, so that the runtime's own
// algorithms (the allreduces of collective/, unchanged) run inside simulated hosts and every message
// they send is a SimGrid communication of exactly its size.
//
// Matching: one SimGrid mailbox per (sender, receiver, tag), so FIFO per (peer, tag) as the
// Transport contract requires. The receiving actor is the mailbox's permanent receiver: a send
// starts moving as soon as it is posted (eager, like MPI's small messages and like the emulated
// NICs of LocalTransport), whether or not the recv is posted yet. A send completes when its bytes
// have arrived; its payload is copied when it is posted, so the sender's buffer is free at once.
//
// Only actors of one simulation process call it (SimGrid runs them one at a time). A wait's timeout
// is simulated time: a wait is SimGrid's own, with the errors and the failure state of comm/wait.h.
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "pipesgd/comm/transport.h"
#include "pipesgd/comm/wait.h"

namespace simgrid::s4u {
class Actor;
}  // namespace simgrid::s4u

namespace pipesgd {

// What the ranks of one simulated run share: the receiving actor of each rank, and failures.
class SimFabric {
 public:
  explicit SimFabric(int ranks);
  ~SimFabric();
  int size() const { return static_cast<int>(receivers_.size()); }
  // The actor that receives rank's messages (set before any message is sent to it).
  void set_receiver(int rank, simgrid::s4u::Actor* actor);
  simgrid::s4u::Actor* receiver(int rank) const;
  Transport& endpoint(int rank) { return *endpoints_[static_cast<std::size_t>(rank)]; }

  // True the first time `mailbox` is seen (its receiver is then set by the caller).
  bool claim_mailbox(const void* mailbox) { return claimed_.insert(mailbox).second; }

  // The first failure reported ("rank R failed: <reason>", comm/wait.h), "" until then.
  bool failed() const { return failure_.failed(); }
  std::string failure() const { return failure_.message(); }
  void report_failure(int rank, const std::string& reason);

 private:
  std::vector<simgrid::s4u::Actor*> receivers_;
  std::vector<std::unique_ptr<Transport>> endpoints_;
  FailureState failure_;
  std::unordered_set<const void*> claimed_;
};

}  // namespace pipesgd
