#pragma once
// Reader for IDX files, the format of MNIST and Fashion-MNIST:
//   bytes 0-1  zero
//   byte  2    element type (only 0x08, unsigned byte, is supported)
//   byte  3    number of dimensions, 1..4
//   then one big-endian uint32 per dimension, then product(dims) elements, and nothing after.
// Files may be gzip-compressed or plain; both are read the same way.
//
// Every problem (missing file, truncation, bad header, trailing bytes, corrupt gzip) throws
// DataError with a one-line message naming the file and the problem. No input bytes can crash the
// reader or make it allocate more memory than the data actually present (plus a bounded chunk).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pipesgd {

inline constexpr std::uint8_t kIdxTypeUnsignedByte = 0x08;
inline constexpr std::size_t kIdxMaxDimensions = 4;

// A decoded IDX file; owns its data.
struct IdxArray {
  std::uint8_t element_type = 0;    // always kIdxTypeUnsignedByte for a returned array
  std::vector<std::uint32_t> dims;  // 1..kIdxMaxDimensions entries, each >= 1
  std::vector<std::uint8_t> data;   // product(dims) elements, row-major

  std::size_t element_count() const { return data.size(); }
};

// Reads and validates the IDX file at `path` (gzip or plain). Throws DataError.
IdxArray read_idx(const std::string& path);

// Parses IDX content already in memory (decompressed). `source_name` is used in error messages the
// way read_idx uses the path. Throws DataError. Meant for fuzzing and tests.
IdxArray parse_idx(std::span<const std::uint8_t> bytes, const std::string& source_name);

}  // namespace pipesgd
