#pragma once
// The simulated cluster: hosts, their links and the network model, built on SimGrid.
//
// Every function here must run inside an isolated simulation process (sim/isolated_run.h): SimGrid
// allows one engine, configured once, per process.
//
// Topology "flat": every host has a full-duplex NIC (a split-duplex SimGrid link: bandwidth each
// way) to one non-blocking switch, as `--net` emulates for thread workers: a message crosses the
// sender's outgoing and the receiver's incoming link, so concurrent messages share a NIC's bandwidth
// per direction, and each link carries half of the one-way latency (one message = one latency).
//
// Network models:
//   ideal    SimGrid's CM02 flow model with its latency and bandwidth factors set to 1 and no
//            cross-traffic: an uncontended message of M bytes takes exactly latency + M / bandwidth,
//            the alpha-beta model of the papers (Pipe-SGD Eq. 5, MG-WFBP Table II).
//   simgrid  SimGrid's default model (LV08, validated against TCP): latency x 13.01, bandwidth x 0.97
//            and cross-traffic (acknowledgements share the reverse direction).
#include <string>
#include <vector>

#include "pipesgd/comm/network_spec.h"

namespace simgrid::s4u {
class Engine;
class Host;
}  // namespace simgrid::s4u

namespace pipesgd {

enum class SimNetworkModel { kIdeal, kSimGrid };

// The cluster's wiring (--topology):
//   flat                          every NIC on one non-blocking switch (above).
//   fat-tree:L;D1,..,DL;U1,..,UL;C1,..,CL
//                                 SimGrid's fat-tree (its own notation, see SimGrid's "Fat-Tree
//                                 Cluster" docs): L levels of switches; a level-i switch has Di children;
//                                 an element of level i-1 has Ui parents, joined by Ci parallel links.
//                                 D1 x ... x DL hosts (at least the simulation's); every link has the
//                                 NIC's bandwidth and half its latency, so two hosts under one leaf
//                                 switch are one latency apart and each level above adds one more.
//                                 Oversubscription: D1 hosts share U2 x C2 uplinks of a leaf switch,
//                                 e.g. fat-tree:2;16,4;1,4;1,1 is 16 hosts per leaf on 4 uplinks (4:1).
struct SimTopology {
  std::string text = "flat";  // as given
  bool fat_tree = false;
  unsigned levels = 0;
  std::vector<unsigned> down, up, count;
  std::size_t leaves() const;  // hosts the fat-tree holds (1 for flat: any number)
};

// Throws UsageError (one line, naming `name`) for anything but the forms above.
SimTopology parse_sim_topology(const std::string& text, const char* name = "--topology");

// "ideal" or "simgrid"; throws UsageError naming `name` otherwise.
SimNetworkModel parse_sim_network_model(const std::string& text, const char* name = "network model");
const char* sim_network_model_name(SimNetworkModel model);

struct SimPlatformSpec {
  int hosts = 1;
  NetworkSpec link;  // each host's NIC; bits_per_second must be > 0
  SimNetworkModel model = SimNetworkModel::kIdeal;
  SimTopology topology;
  int cores_per_host = 1;  // concurrent CPU work beyond this many activities shares the cores
};

// A host executes this many "flops" per second: simulated CPU work of s seconds is s x this.
inline constexpr double kSimHostSpeed = 1e9;

// Configures `engine` (network model, quiet logs) and builds the platform; returns the hosts in
// rank order. Throws UsageError for fewer than 1 host, a link without bandwidth, or a fat-tree with
// fewer leaves than hosts.
std::vector<simgrid::s4u::Host*> build_platform(simgrid::s4u::Engine& engine, const SimPlatformSpec& spec);

// Starts SimGrid's engine for a simulation process (one per process; see above).
simgrid::s4u::Engine& start_simulation_engine();

}  // namespace pipesgd
