#pragma once
// The server ranks of a public-API world (include/pipesgd/world.h): they run no user code. Worker 0
// sends each server, over the world's transport, either a set-up (a DistributedOptimizer of a
// parameter-server method was built: its method spec, option flags, hyper-parameters, layout and
// initial weights) after which the server serves its shard until every worker closed, or the end
// of the world (worker 0's function returned). Messages on Channel::kControl, sequence
// kServerSequenceBase + worker 0's count (api/worker_impl.h): step 0 a 16-byte header (kind, bytes
// of the description), step 1 the description (JSON), step 2 the initial weights.
#include <atomic>
#include <span>
#include <string>

#include "pipesgd/comm/transport.h"
#include "pipesgd/optim/lr_schedule.h"

namespace pipesgd {

// DistributedOptimizerOptions::lr_schedule: the CLI's forms (parse_lr_schedule) or "external" (the
// caller sets the rate at every step; no warm-up). UsageError as parse_lr_schedule's, naming `names`.
LrScheduleSpec parse_api_lr_schedule(const std::string& text, std::int64_t warmup_iterations,
                                     const LrScheduleNames& names = {});

struct ServerSetup {
  std::string description;             // JSON, see server_ranks.cpp
  std::span<const float> weights;      // the flat initial weights
};

// Worker 0: sends `setup` to every server rank (ranks workers..size-1 of `world`).
void send_server_setup(Transport& world, int workers, std::uint64_t& sequence, const ServerSetup& setup,
                       Timeout timeout);
// Worker 0: tells every server rank that the world ends.
void send_server_shutdown(Transport& world, int workers, std::uint64_t& sequence, Timeout timeout);

// A server rank: serves set-ups until the end of the world. Waits for the next message without a
// deadline, but throws PeerFailedError as soon as a rank reports a failure (or *stop is set); the
// rest of a set-up's messages within `timeout`, and while serving, within the set-up's own timeout
// (the DistributedOptimizer's, which its workers' pushes and pulls have too).
void run_server_rank(Transport& world, int workers, Timeout timeout, const std::atomic<bool>* stop);

}  // namespace pipesgd
