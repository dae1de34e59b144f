#pragma once
// A codec that does the real work of another and charges its cost, as simulated CPU time, to the
// simulated host of the calling actor. Only actors of a simulation may call it.
#include "pipesgd/collective/codec.h"
#include "pipesgd/sim/collective_simulation.h"

namespace pipesgd {

class TimedCodec : public Codec {
 public:
  // `codec` must outlive this object.
  TimedCodec(const Codec& codec, CodecCost cost) : codec_(codec), cost_(cost) {}
  std::string_view name() const override { return codec_.name(); }
  bool is_identity() const override { return codec_.is_identity(); }
  std::size_t encoded_bytes(std::size_t count) const override { return codec_.encoded_bytes(count); }
  std::size_t encode(std::span<const float> values, std::span<std::byte> out) const override;
  void decode(std::span<const std::byte> message, std::span<float> destination) const override;
  void decode_add(std::span<const std::byte> message, std::span<float> destination) const override;
  double error_bound(double max_abs) const override { return codec_.error_bound(max_abs); }

 private:
  const Codec& codec_;
  CodecCost cost_;
};

// Executes `seconds` of CPU work on the calling actor's host (shared with the host's other work).
void simulate_cpu_work(double seconds);

}  // namespace pipesgd
