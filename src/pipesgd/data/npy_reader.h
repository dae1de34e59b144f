#pragma once
// Reader for NumPy's .npy files (format versions 1.0 and 2.0) and the decoding of their arrays into
// a data set's inputs, labels or regression targets. The header's dictionary is parsed by xtensor's
// npy support (Debian libxtensor-dev); this file checks what xtensor leaves unchecked: the header
// length against the bytes present, the element count against the data bytes (no allocation is
// sized by the header), the dtype, and C order.
//
// Every problem (missing file, truncation, broken header, wrong dtype or shape, trailing bytes)
// throws DataError with a one-line message naming the file. No input bytes can crash the reader.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pipesgd {

// A decoded .npy file; owns its data.
struct NpyArray {
  std::string dtype;                // NumPy's type string, e.g. "<f4", "|u1", "<i8"
  std::vector<std::size_t> shape;   // empty for a 0-d array
  std::vector<std::uint8_t> data;   // product(shape) elements of the dtype, C order, as stored
};

// "[3, 4]": a shape in messages.
std::string npy_shape_text(const std::vector<std::size_t>& shape);

// Reads and validates the .npy file at `path`. Throws DataError.
NpyArray read_npy(const std::string& path);

// Parses .npy content already in memory; `source_name` names it in error messages the way read_npy
// names the path. Throws DataError. Meant for fuzzing and tests.
NpyArray parse_npy(std::span<const std::uint8_t> bytes, const std::string& source_name);

// The inputs of a data set from an array of shape [N, d1, d2, ...] (at least 2 dimensions, N >= 1,
// every d >= 1): float32 values as stored, float64 (NumPy's default) rounded to float32, uint8 values
// scaled by 1/255 (as the IDX path scales pixels). Throws DataError naming `source_name` for another
// dtype or shape.
struct NpyInputs {
  std::size_t count = 0;
  std::vector<std::int64_t> example_shape;  // {d1, d2, ...}
  std::size_t features = 0;                 // product of example_shape
  std::vector<float> values;                // count * features, row-major
  bool converted_from_float64 = false;      // the file held float64
};
NpyInputs decode_npy_inputs(const NpyArray& array, const std::string& source_name);

// The labels or regression targets of a data set: int64 or int32 of shape [N] are labels (each in
// [0, 2^31 - 1]); float32 or float64 of shape [N] or [N, k] (k >= 1) are regression targets (k, or
// 1 for [N], floats per example; float64 is rounded to float32). N >= 1. Throws DataError naming
// `source_name` otherwise.
struct NpyTargets {
  std::size_t count = 0;
  std::vector<std::int32_t> labels;  // count entries for labels, else empty
  std::size_t target_features = 0;   // 0 for labels
  std::vector<float> targets;        // count * target_features

  bool regression() const { return target_features > 0; }
};
NpyTargets decode_npy_targets(const NpyArray& array, const std::string& source_name);

}  // namespace pipesgd
