#pragma once
// Modelled collectives for large worlds: an allreduce's cost on the simulated network from its
// rounds (collective/allreduce_rounds.h), each distinct round played once on the whole platform.
//
// A message-level ring of 1024 SimGrid hosts costs ~15 s of wall time per allreduce, and a run has
// many. But a round's flows (every rank -> its ring successor, every active rank <-> its partner
// at distance 2^s, ...) take the same time wherever they appear, and for a fixed set of concurrent
// flows that time is affine in the message size under SimGrid's flow models (each flow's share of
// its links does not depend on the size). So each distinct round is simulated twice on the run's
// own platform (topology, network model, link): with 1-byte messages (its latency) and with 16 MiB
// ones (its seconds per byte), with all of its flows at once, until the last one arrives. Summed
// over the rounds this gives the allreduce's a + b·E for E encoded bytes of the vector, which keeps
// what the closed form cannot see: an oversubscribed fat-tree's shared uplinks, two tree children
// sharing their parent's link, LV08's factors. On a flat switch with the ideal model it is MG-WFBP
// Table II exactly (tests/sim check both, and the rounds against the message-level simulation).
#include <string>

#include "pipesgd/sim/platform.h"

namespace pipesgd {

struct ModelledAllreduce {
  double latency_seconds = 0;       // a: the rounds' latencies
  double seconds_per_byte = 0;      // b: per encoded byte of the whole vector
  double reduced_bytes_per_byte = 0;  // fp32 bytes reduced on the critical path per byte of the vector
  int rounds = 0;                   // rounds on the critical path
  int distinct_rounds = 0;          // rounds simulated
  double seconds(double encoded_bytes) const { return latency_seconds + seconds_per_byte * encoded_bytes; }
};

// Simulates `algorithm`'s distinct rounds on `platform` (platform.hosts = the world size) in an
// isolated simulation process. Throws UsageError for an unknown algorithm or a platform that cannot
// be built (as build_platform).
ModelledAllreduce model_allreduce(const std::string& algorithm, const SimPlatformSpec& platform);

}  // namespace pipesgd
