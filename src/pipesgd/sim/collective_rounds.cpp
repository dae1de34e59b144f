#include "pipesgd/sim/collective_rounds.h"

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>
#include <nlohmann/json.hpp>
#include <vector>

#include "pipesgd/collective/allreduce_rounds.h"
#include "pipesgd/core/error.h"
#include "pipesgd/sim/isolated_run.h"

namespace pipesgd {
namespace sg4 = simgrid::s4u;
namespace {

constexpr double kProbeBytes = 16.0 * 1024 * 1024;  // per message, for a round's seconds per byte
constexpr std::size_t kMaxPlayedFlows = 64 * 63;      // concurrent flows one play may hold
constexpr std::size_t kSampledGroups = 32;            // permutations played of a larger round

// Simulated seconds from the common start until each flow of `flows` has delivered `bytes`, per flow
// in the order of `flows`.
std::vector<double> play_round(const std::vector<AllreduceFlow>& flows, const std::vector<sg4::Host*>& hosts,
                               double bytes) {
  const double start = sg4::Engine::get_clock();
  std::vector<sg4::CommPtr> comms;
  comms.reserve(flows.size());
  for (const AllreduceFlow& flow : flows) {
    comms.push_back(sg4::Comm::sendto_async(hosts[static_cast<std::size_t>(flow.from)],
                                            hosts[static_cast<std::size_t>(flow.to)],
                                            static_cast<std::uint64_t>(bytes)));
  }
  std::vector<double> seconds(flows.size(), 0.0);
  std::vector<std::size_t> open(flows.size());
  for (std::size_t f = 0; f < open.size(); ++f) open[f] = f;
  // Flows of one round end in few distinct instants: collect every flow finished by then.
  while (!comms.empty()) {
    sg4::Comm::wait_any(comms);
    const double now = sg4::Engine::get_clock() - start;
    for (std::size_t k = comms.size(); k-- > 0;) {
      if (comms[k]->get_state() == sg4::Activity::State::FINISHED) {
        seconds[open[k]] = now;
        comms.erase(comms.begin() + static_cast<std::ptrdiff_t>(k));
        open.erase(open.begin() + static_cast<std::ptrdiff_t>(k));
      }
    }
  }
  return seconds;
}

// The cost of `round`'s `repeat` rounds from its flows' times at 1 byte and at kProbeBytes: the
// slowest flow per round, or for a chained round the slowest window of `repeat` consecutive flows
// (the ring's data passes them one after another), the window taken at the probe size.
std::pair<double, double> round_cost(const AllreduceRound& round, const std::vector<double>& small,
                                     const std::vector<double>& full) {
  double small_seconds = 0, full_seconds = 0;
  if (!round.chained) {
    small_seconds = round.repeat * *std::max_element(small.begin(), small.end());
    full_seconds = round.repeat * *std::max_element(full.begin(), full.end());
  } else {
    const std::size_t n = full.size();
    for (std::size_t first = 0; first < n; ++first) {
      double window_small = 0, window_full = 0;
      for (int k = 0; k < round.repeat; ++k) {
        window_small += small[(first + static_cast<std::size_t>(k)) % n];
        window_full += full[(first + static_cast<std::size_t>(k)) % n];
      }
      if (window_full > full_seconds) std::tie(small_seconds, full_seconds) = std::pair(window_small, window_full);
    }
  }
  const double per_byte = (full_seconds - small_seconds) / (kProbeBytes - 1);
  return {small_seconds - per_byte, per_byte};
}

// A round's flows' times at 1 byte and at kProbeBytes, per flow. One byte, not zero: SimGrid
// completes empty host-to-host messages one latency after another. A round of more than
// kMaxPlayedFlows flows (direct's all-to-all above 64 workers: 65,280 concurrent messages, at 256
// workers, take SimGrid 5 minutes) is played as its permutations, the flows grouped by
// the distance from sender to receiver, one group after another: their seconds per byte add up, as
// on a NIC that sends one message at a time, and the round pays the slowest group's latency once.
// On a flat switch that is the concurrent round's time exactly; on a tree, where concurrent flows
// could share out idle links better, it is an upper estimate. Only kSampledGroups evenly spaced
// distances are played (a 1024-worker all-to-all has 1023 groups, ~30 ms of wall time each); the
// mean of their seconds per byte stands for every group's, so on a tree the figure is an estimate.
// Returned as one flow's times.
std::pair<std::vector<double>, std::vector<double>> play_flows(const AllreduceRound& round,
                                                               const std::vector<sg4::Host*>& hosts) {
  if (round.flows.size() <= kMaxPlayedFlows) {
    return {play_round(round.flows, hosts, 1), play_round(round.flows, hosts, kProbeBytes)};
  }
  PIPESGD_ASSERT(!round.chained);
  const int p = static_cast<int>(hosts.size());
  std::vector<std::vector<AllreduceFlow>> groups(static_cast<std::size_t>(p));
  for (const AllreduceFlow& flow : round.flows) groups[static_cast<std::size_t>((flow.to - flow.from + p) % p)].push_back(flow);
  std::vector<std::size_t> nonempty;
  for (std::size_t d = 0; d < groups.size(); ++d) {
    if (!groups[d].empty()) nonempty.push_back(d);
  }
  const std::size_t sampled = std::min(nonempty.size(), kSampledGroups);
  double latency = 0, per_byte = 0;
  for (std::size_t k = 0; k < sampled; ++k) {
    const std::vector<AllreduceFlow>& group = groups[nonempty[k * nonempty.size() / sampled]];
    const std::vector<double> small = play_round(group, hosts, 1), full = play_round(group, hosts, kProbeBytes);
    const double small_max = *std::max_element(small.begin(), small.end());
    const double group_per_byte = (*std::max_element(full.begin(), full.end()) - small_max) / (kProbeBytes - 1);
    latency = std::max(latency, small_max - group_per_byte);
    per_byte += group_per_byte;
  }
  per_byte *= static_cast<double>(nonempty.size()) / static_cast<double>(sampled);
  return {{latency + per_byte}, {latency + per_byte * kProbeBytes}};
}

}  // namespace

ModelledAllreduce model_allreduce(const std::string& algorithm, const SimPlatformSpec& platform) {
  const std::vector<AllreduceRound> rounds = allreduce_rounds(algorithm, platform.hosts);  // UsageError
  ModelledAllreduce model;
  for (const AllreduceRound& round : rounds) {
    model.rounds += round.repeat;
    model.reduced_bytes_per_byte += round.repeat * round.reduced;
  }
  if (rounds.empty()) return model;
  const std::string text = run_isolated(concat("simulating the rounds of ", algorithm), [&] {
    sg4::Engine& engine = start_simulation_engine();
    const std::vector<sg4::Host*> hosts = build_platform(engine, platform);
    double latency = 0, per_byte = 0;
    std::size_t distinct = 0;
    sg4::Actor::create("rounds", hosts.front(), [&] {
      // Each distinct flow set is played once: its flows' times at 1 byte and at kProbeBytes.
      std::map<std::vector<AllreduceFlow>, std::pair<std::vector<double>, std::vector<double>>> played;
      for (const AllreduceRound& round : rounds) {
        auto [found, added] = played.try_emplace(round.flows);
        if (added) found->second = play_flows(round, hosts);
        const auto [round_latency, round_per_byte] = round_cost(round, found->second.first, found->second.second);
        latency += round_latency;
        per_byte += round.fraction * round_per_byte;
      }
      distinct = played.size();
    });
    engine.run();
    return nlohmann::json{{"latency", latency}, {"per_byte", per_byte}, {"distinct", distinct}}.dump();
  });
  const nlohmann::json result = nlohmann::json::parse(text);
  model.latency_seconds = result.at("latency").get<double>();
  model.seconds_per_byte = result.at("per_byte").get<double>();
  model.distinct_rounds = result.at("distinct").get<int>();
  return model;
}

}  // namespace pipesgd
