#include "pipesgd/comm/network_spec.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// One-way latencies of the presets: typical kernel TCP stacks on Ethernet of that class.
struct Preset {
  const char* name;
  double bits_per_second;
  double latency_seconds;
};
constexpr Preset kPresets[] = {
    {"1gbe", 1e9, 50e-6},
    {"10gbe", 10e9, 20e-6},
    {"25gbe", 25e9, 10e-6},
    {"100gbe", 100e9, 5e-6},
};

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

[[noreturn]] void bad(const char* name, const std::string& text, const std::string& why) {
  throw UsageError(concat(name, " '", text, "': ", why,
                          " (expected none, 1gbe, 10gbe, 25gbe, 100gbe or bw=2.5Gbit,lat=30us)"));
}

// Splits "2.5Gbit" into 2.5 and "gbit"; rejects empty or negative numbers.
double parse_quantity(const char* option, const std::string& whole, const std::string& value, std::string& unit) {
  const char* begin = value.c_str();
  char* end = nullptr;
  double number = std::strtod(begin, &end);
  if (end == begin) bad(option, whole, concat("'", value, "' does not start with a number"));
  if (!std::isfinite(number) || number < 0) bad(option, whole, concat("'", value, "' is not a number >= 0"));
  unit = lowercase(std::string(end));
  return number;
}

}  // namespace

NetworkSpec parse_network_spec(const std::string& text, const char* option) {
  const std::string key = lowercase(text);
  if (key.empty() || key == "none") return NetworkSpec{};
  for (const Preset& preset : kPresets) {
    if (key == preset.name) return NetworkSpec{preset.bits_per_second, preset.latency_seconds, key};
  }
  if (key.find('=') == std::string::npos) bad(option, text, "unknown preset");

  NetworkSpec spec;
  spec.name = text;
  bool have_bandwidth = false, have_latency = false;
  std::stringstream fields(text);
  std::string field;
  while (std::getline(fields, field, ',')) {
    auto equals = field.find('=');
    if (equals == std::string::npos) bad(option, text, concat("field '", field, "' is not key=value"));
    std::string name = lowercase(field.substr(0, equals));
    std::string unit;
    double number = parse_quantity(option, text, field.substr(equals + 1), unit);
    if (name == "bw") {
      if (have_bandwidth) bad(option, text, "bw given twice");
      have_bandwidth = true;
      double scale = 0;
      if (unit == "bit" || unit == "bit/s" || unit == "bps") scale = 1;
      else if (unit == "kbit" || unit == "kbit/s") scale = 1e3;
      else if (unit == "mbit" || unit == "mbit/s") scale = 1e6;
      else if (unit == "gbit" || unit == "gbit/s") scale = 1e9;
      else bad(option, text, concat("bandwidth unit '", unit, "' is not bit, Kbit, Mbit or Gbit"));
      spec.bits_per_second = number * scale;
      if (spec.bits_per_second <= 0) bad(option, text, "bandwidth must be > 0");
    } else if (name == "lat") {
      if (have_latency) bad(option, text, "lat given twice");
      have_latency = true;
      double scale = 0;
      if (unit == "ns") scale = 1e-9;
      else if (unit == "us") scale = 1e-6;
      else if (unit == "ms") scale = 1e-3;
      else if (unit == "s") scale = 1;
      else bad(option, text, concat("latency unit '", unit, "' is not ns, us, ms or s"));
      spec.latency_seconds = number * scale;
    } else {
      bad(option, text, concat("unknown key '", name, "'"));
    }
  }
  if (!have_bandwidth && !have_latency) bad(option, text, "neither bw nor lat given");
  return spec;
}

std::string describe(const NetworkSpec& spec) {
  if (!spec.emulated()) return "no emulation";
  std::ostringstream out;
  if (spec.bits_per_second > 0) out << spec.bits_per_second / 1e9 << " Gbit/s";
  else out << "unlimited bandwidth";
  out << ", " << spec.latency_seconds * 1e6 << " us latency";
  return out.str();
}

}  // namespace pipesgd
