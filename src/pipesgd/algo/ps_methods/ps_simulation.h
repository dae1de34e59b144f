#pragma once
// The parameter-server methods' schedules for the simulator (algo/simulated_method.h), as
// ParameterServerMethod and the servers of ps/parameter_server.h run them. The gradient is split
// over the S servers by the runtime's ShardPlan; each message is sized as the protocol sends it
// (32-byte request header + the shard's gradients; 8-byte reply header + the shard's weights).
//   pssync          every worker pushes its shards and pulls version t + 1; a server takes one
//                   update of its shard after the M pushes of version t, then answers the pulls.
//   asgd, dcasgd    a server applies each push as it arrives (dcasgd: with its delay compensation,
//                   costed as one more pass over the shard) and answers each pull at once.
// The workers wait for their pull in end_iteration (no comm thread). A server's update of its shard
// costs the profile's update time in proportion to the shard's size.
#include <memory>
#include <vector>

#include "pipesgd/algo/simulated_method.h"

namespace pipesgd {

std::unique_ptr<SimulatedMethod> simulate_parameter_server(const SimulationContext& context);

// Shared with OD-SGD: the shards of the profile's layers over `servers` servers (elements each).
std::vector<std::size_t> simulated_shard_sizes(const ModelProfile& profile, int servers);
// One worker's push of every shard and pull of every shard, waiting for the replies.
void simulate_push_and_pull(const std::vector<std::size_t>& shards, SimulatedThread& thread);
// A synchronous server's life: `iterations` rounds of M pushes, one update, M pull replies.
void simulate_synchronous_server(std::size_t shard, double update_seconds, std::int64_t iterations,
                                 SimulatedServer& server);

}  // namespace pipesgd
