#pragma once
// MpiTransport: the Transport interface over MPI point-to-point messages, one worker per MPI rank.
//
// Tags: the channel of a Tag (comm/transport.h) selects one of kChannelCount communicators
// duplicated from MPI_COMM_WORLD at construction; the MPI tag is
//   (sequence mod kMpiSequenceWindow) << 24 | step << 12 | segment,
// which fits the MPI_TAG_UB of OpenMPI (2^31 - 1). MPI matches messages of equal (communicator,
// source, tag) in posting order, so the mapping is exact as long as two collectives of one channel
// whose sequences differ by a multiple of kMpiSequenceWindow are never in flight at once. Training
// methods keep at most kMaxStaleness (64) iterations in flight; the parameter server
// (ps/parameter_server.h) at most three consecutive sequences per worker-server pair.
//
// Same-host peers: messages to a rank on this host go through a SharedMemoryTransport
// (comm/shared_memory_transport.h) instead of MPI: the second of sender and receiver to arrive copies
// the payload once between the two processes, and a wait sleeps on a futex until the peer completes
// it. OpenMPI's own shared-memory path progresses only while a rank polls, so a comm thread sharing
// a core with compute either takes the core from it or leaves each transfer waiting on a time slice.
// Set up at construction (collective: MPI_Comm_split_type, a POSIX shared-memory object unlinked as
// soon as every process of the host has mapped it); off when MpiTransportOptions::shared_memory is
// false, when any rank's environment has PIPESGD_MPI_SHARED_MEMORY=0, or where it cannot work (no
// /dev/shm, cross-memory attach not permitted): describe() says which.
//
// Waiting on MPI (comm/wait.h's policy): MPI has no blocking wait with a timeout, so wait() polls
// MPI_Test: it spins (yielding the CPU between polls, as OpenMPI does when oversubscribed) for
// MpiTransportOptions::spin_window, then sleeps briefly between polls so that an idle comm thread
// leaves the cores to compute. The first few polls of a wait do not even yield: a message about to
// land costs no system call. When every peer is on this host, no wait polls, and waits_sleep() is
// true (the comm threads may then run at raised priority, core/thread_priority.h).
//
// Failures: report_failure() sends a notice to every other rank on a dedicated communicator; every
// rank keeps one receive for it posted, and a wait that sees a notice throws PeerFailedError naming
// the failed rank and its reason. A rank that dies without a word (killed) is noticed by the
// timeouts. After a failure the process must exit without MPI_Finalize
// (MpiRuntime::exit_without_finalize), and a cancelled send may still be read by MPI until then.
//
// Thread-safety: send, recv and the Requests may be used from several threads of this rank at once
// (MPI_THREAD_MULTIPLE); one Request is waited on by one thread.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pipesgd/comm/transport.h"
#include "pipesgd/mpi/mpi_runtime.h"

namespace pipesgd {

inline constexpr std::uint64_t kMpiSequenceWindow = 128;

struct MpiTransportOptions {
  // How long a wait polls without sleeping before it starts sleeping between polls. Long enough
  // for any transfer in progress (a sleeping poller stalls MPI's progress, and with it the peer);
  // only waits on a peer that is busy elsewhere (e.g. still computing) reach the sleeps.
  std::chrono::microseconds spin_window{20000};
  // The sleep between polls after the spin window.
  std::chrono::microseconds poll_sleep{20};
  // Messages to ranks of this host through shared memory (see above). Every rank must agree; the
  // environment variable PIPESGD_MPI_SHARED_MEMORY (0 or 1) overrides it.
  bool shared_memory = true;
  // Tests only: when > 0, ranks r and s count as one host's iff r % simulated_hosts == s %
  // simulated_hosts (a single machine then exercises the mixed routing of a cluster).
  int simulated_hosts = 0;
};

// "PIPESGD_MPI_SHARED_MEMORY": `fallback` if unset; throws UsageError unless it is 0 or 1.
bool shared_memory_from_environment(bool fallback);

class MpiTransport final : public Transport {
 public:
  // Collective over MPI_COMM_WORLD (duplicates communicators): every rank constructs it at the same
  // point. `runtime` must outlive this object.
  explicit MpiTransport(MpiRuntime& runtime, MpiTransportOptions options = {});
  ~MpiTransport() override;

  int rank() const override;
  int size() const override;
  Request send(int peer, Tag tag, std::span<const std::byte> bytes, const char* operation) override;
  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override;
  void report_failure(const std::string& reason) override;
  std::uint64_t bytes_sent() const override;
  std::string describe() const override;
  bool waits_sleep() const override;
  // Ranks reached through shared memory (this one included), empty if none.
  std::vector<int> shared_memory_peers() const;

  // MPI_Ibarrier on a communicator of its own (no message of ours, so it measures nothing of our
  // transport), polled like a wait: returns once every rank has called it; throws PeerFailedError on
  // a failure notice, CommTimeoutError after `timeout` (the barrier is then left pending: the
  // process must exit without MPI_Finalize). Collective: every rank calls it in the same order, from
  // one thread at a time.
  void barrier(Timeout timeout, const char* operation);

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace pipesgd
