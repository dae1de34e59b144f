#pragma once
// Emulated network links: each rank has a full-duplex NIC with a bandwidth and a one-way latency.
#include <string>

namespace pipesgd {

struct NetworkSpec {
  double bits_per_second = 0;  // 0 = no emulation (messages move at memory speed)
  double latency_seconds = 0;  // one-way, added to every message
  std::string name = "none";   // preset name or the explicit form, for reports

  bool emulated() const { return bits_per_second > 0 || latency_seconds > 0; }
  double bytes_per_second() const { return bits_per_second / 8.0; }
};

// Parses a network: "none", a preset "1gbe" | "10gbe" | "25gbe" | "100gbe", or the explicit form
// "bw=2.5Gbit,lat=30us" (bw units: bit, Kbit, Mbit, Gbit; lat units: ns, us, ms, s; either key may be
// omitted). Throws UsageError with a one-line message naming `name` (the option that gave it) on
// anything else.
NetworkSpec parse_network_spec(const std::string& text, const char* name = "network");

// "10 Gbit/s, 20 us latency" or "no emulation".
std::string describe(const NetworkSpec& spec);

}  // namespace pipesgd
