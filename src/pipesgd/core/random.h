#pragma once
// Deterministic pseudo-random numbers that do not depend on the standard library's distribution
// implementations: the same (seed, stream) gives the same sequence with every compiler and standard
// library. Generator: xoshiro256** (Blackman & Vigna), state filled by splitmix64.
//
// A Random object is a plain value (32 bytes, no heap); it is not thread-safe, so give each thread
// its own object. Independent sequences for the same seed come from different `stream` values, e.g.
// one stream per epoch or per data split.
#include <cmath>
#include <cstdint>

#include "pipesgd/core/error.h"

namespace pipesgd {

class Random {
 public:
  explicit Random(std::uint64_t seed, std::uint64_t stream = 0) {
    // Fold the stream into the seed through a bijective mixer, then expand with splitmix64. Four
    // consecutive splitmix64 outputs are distinct, so the state is never all zero.
    std::uint64_t splitmix_state = seed ^ mix(stream + kStreamOffset);
    for (std::uint64_t& word : state_) word = splitmix64_next(splitmix_state);
  }

  // Uniform over all 64-bit values.
  std::uint64_t next_u64() {
    const std::uint64_t result = rotate_left(state_[1] * 5, 7) * 9;
    const std::uint64_t shifted = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= shifted;
    state_[3] = rotate_left(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1), a multiple of 2^-53.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  // Uniform in [0, bound) without modulo bias (rejection sampling). Requires bound >= 1.
  std::uint64_t uniform_below(std::uint64_t bound) {
    PIPESGD_ASSERT(bound >= 1);
    // Values below `threshold` would make the low residues more likely; 2^64 mod bound of them.
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t value = next_u64();
      if (value >= threshold) return value % bound;
    }
  }

  // Standard normal (mean 0, variance 1), Box-Muller; consumes two uniforms per call.
  double normal() {
    const double radius_uniform = 1.0 - uniform();  // in (0, 1], so the log is finite
    const double angle_uniform = uniform();
    const double radius = std::sqrt(-2.0 * std::log(radius_uniform));
    return radius * std::cos(kTwoPi * angle_uniform);
  }

 private:
  static constexpr std::uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;
  static constexpr std::uint64_t kStreamOffset = 0x6A09E667F3BCC909ULL;
  static constexpr double kTwoPi = 6.283185307179586476925286766559;

  static std::uint64_t rotate_left(std::uint64_t value, int bits) {
    return (value << bits) | (value >> (64 - bits));
  }

  // The splitmix64 finaliser: a bijection on 64-bit values with good avalanche.
  static std::uint64_t mix(std::uint64_t value) {
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9ULL;
    value = (value ^ (value >> 27)) * 0x94D049BB133111EBULL;
    return value ^ (value >> 31);
  }

  static std::uint64_t splitmix64_next(std::uint64_t& splitmix_state) {
    splitmix_state += kGoldenGamma;
    return mix(splitmix_state);
  }

  std::uint64_t state_[4];
};

}  // namespace pipesgd
