#pragma once
// LocalTransport: the ranks of one run as threads of one process. Used as the embedded default
// runtime and as the test harness for every algorithm.
//
// A LocalFabric owns the shared state of all ranks; endpoint(r) is rank r's Transport. Messages are
// copied once, straight from the sender's buffer into the posted receive buffer (rendezvous), so a
// send completes only once the receiver has posted the matching recv. A recv_in_place is not copied
// into at all: the receiver reads the sender's bytes in place (one pass for a reduction), and the
// send completes when the receiver returns them (Transport::recv_in_place).
//
// Link emulation (optional, NetworkSpec): every rank has a full-duplex NIC. A message of n bytes
// leaves the sender's egress after the previous one, taking n/bandwidth, and reaches the receiver
// `latency` later, queued behind earlier arrivals on the receiver's ingress. A recv completes no
// earlier than its arrival; a send completes when matched (its bytes are copied by then, and its wire
// time is already booked on both NICs). Waiting sleeps; no CPU is burnt, so emulated communication
// overlaps with computation as a NIC's would.
//
// Thread-safety: all members may be called from any thread; each rank's endpoint may be used by
// several threads of that rank at once.
#include <memory>
#include <string>
#include <vector>

#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/comm/wait.h"
#include "pipesgd/core/clock.h"

namespace pipesgd {

namespace local_detail {
struct Operation;
struct Mailbox;
struct Link;
class Endpoint;
}  // namespace local_detail

class LocalFabric {
 public:
  // Throws UsageError if ranks < 1.
  LocalFabric(int ranks, NetworkSpec network = {});
  ~LocalFabric();
  LocalFabric(const LocalFabric&) = delete;
  LocalFabric& operator=(const LocalFabric&) = delete;

  int size() const { return ranks_; }
  Transport& endpoint(int rank);
  const NetworkSpec& network() const { return network_; }

  // True once any rank reported a failure; failure_message() names the first ("rank R failed: ...").
  bool failed() const { return failure_.failed(); }
  std::string failure_message() const { return failure_.message(); }
  void report_failure(int rank, const std::string& reason);
  // From now on rank `rank`'s emulated NIC moves bytes `factor` (> 0) times slower, both ways; its
  // latency is unchanged (a congested link; tests of --algo auto's drift). Any thread.
  void slow_link(int rank, double factor);

 private:
  friend class local_detail::Endpoint;
  friend struct local_detail::Operation;

  int ranks_;
  NetworkSpec network_;
  std::vector<std::unique_ptr<local_detail::Mailbox>> mailboxes_;  // indexed by receiving rank
  std::vector<std::unique_ptr<local_detail::Link>> links_;         // indexed by rank
  std::vector<std::unique_ptr<local_detail::Endpoint>> endpoints_;
  FailureState failure_;
};

}  // namespace pipesgd
