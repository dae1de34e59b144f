#pragma once
// The inside of a public Worker (include/pipesgd/world.h): its rank's endpoint of the world's
// transport and the bookkeeping of the API's own messages. Used by its worker's thread only.
//
// Tags of the API's messages (comm/transport.h): the negotiated collectives on Channel::kNegotiation and
// kCollectives (collective_engine.h); on Channel::kControl:
//   internal broadcasts sequence = the worker's count of them (broadcast_parameters: every worker
//                       calls them in the same order), < kServerSequenceBase;
//   server control      sequence = kServerSequenceBase + worker 0's count of messages to the
//                       servers (server_ranks.h).
// The optimizer's methods use their own channels (kGradients, kPlanning, kParameterServer).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>

#include "pipesgd/api/collective_engine.h"
#include "pipesgd/comm/rank_subset_transport.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/world.h"

namespace pipesgd {

inline constexpr std::uint64_t kServerSequenceBase = 0x80000000u;
// How long every worker may wait on collectives that no peer submitted before they fail
// (collectives.h), at most the world's timeout.
inline constexpr Timeout kStallLimit{5000};

struct Worker::Impl {
  Impl(Transport& world_transport, int workers_, int servers_, int local_rank_, bool mpi_, Timeout timeout_)
      : world(world_transport), workers(first_ranks(world_transport, workers_)), worker_count(workers_), server_count(servers_),
        local_rank(local_rank_), mpi(mpi_), timeout(timeout_),
        engine(std::make_unique<CollectiveEngine>(workers, timeout_, std::min<Timeout>(timeout_, kStallLimit))) {}

  Transport& world;              // workers then servers
  RankSubsetTransport workers;   // ranks 0..worker_count-1
  int worker_count;
  int server_count;
  int local_rank;
  bool mpi;
  Timeout timeout;
  std::uint64_t collective_sequence = 0;
  std::uint64_t server_message_sequence = 0;  // worker 0 only
  // The negotiated collectives (Worker::submit and the blocking collectives); last, so that it stops
  // before the transport view it uses goes.
  std::unique_ptr<CollectiveEngine> engine;

  // The tag of the next user collective.
  Tag next_collective_tag() { return collective_tag(Channel::kControl, collective_sequence++); }
};

// What every way of joining a world does first: UsageError for servers < 0 or a timeout <= 0, then
// keep_freed_memory_in_heap() unless options.keep_freed_memory is false.
void prepare_world(const WorldOptions& options);

// A worker rank's local rank under a launcher (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// MV2_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID), else `rank`.
int local_rank_from_environment(int rank);

}  // namespace pipesgd
