#include "pipesgd/sim/timed_codec.h"

#include <simgrid/s4u.hpp>

#include "pipesgd/sim/platform.h"

namespace pipesgd {

void simulate_cpu_work(double seconds) {
  if (seconds > 0) simgrid::s4u::this_actor::execute(seconds * kSimHostSpeed);
}

std::size_t TimedCodec::encode(std::span<const float> values, std::span<std::byte> out) const {
  simulate_cpu_work(cost_.encode * static_cast<double>(values.size_bytes()));
  return codec_.encode(values, out);
}

void TimedCodec::decode(std::span<const std::byte> message, std::span<float> destination) const {
  simulate_cpu_work(cost_.decode * static_cast<double>(destination.size_bytes()));
  codec_.decode(message, destination);
}

void TimedCodec::decode_add(std::span<const std::byte> message, std::span<float> destination) const {
  simulate_cpu_work(cost_.decode_add * static_cast<double>(destination.size_bytes()));
  codec_.decode_add(message, destination);
}

}  // namespace pipesgd
