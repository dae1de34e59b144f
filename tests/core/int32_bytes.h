#pragma once
// Byte views of int32 test messages, for the transport tests.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace pipesgd {

inline std::span<const std::byte> bytes_of(const std::vector<std::int32_t>& values) {
  return std::as_bytes(std::span(values));
}
inline std::span<std::byte> bytes_of(std::vector<std::int32_t>& values) {
  return std::as_writable_bytes(std::span(values));
}

}  // namespace pipesgd
