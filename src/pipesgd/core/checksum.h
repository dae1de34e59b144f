#pragma once
// A 64-bit FNV-1a checksum of fp32 values, over their bit patterns word by word: equal values
// (bit for bit) give equal checksums on every rank and transport; any differing bit almost surely
// changes it. For comparing replicas and runs, not for security.
#include <cstdint>
#include <cstring>
#include <span>

namespace pipesgd {

inline std::uint64_t checksum_of(std::span<const float> values) {
  std::uint64_t hash = 14695981039346656037ull;
  for (float value : values) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    hash = (hash ^ bits) * 1099511628211ull;
  }
  return hash;
}

}  // namespace pipesgd
