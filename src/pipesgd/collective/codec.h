#pragma once
// Gradient codecs applied inside every allreduce step (Pipe-SGD Sec. 3.2).
//
//  none  fp32 as is.
//  bf16  16-bit truncation ("T"): keeps the upper 16 bits of each fp32 (sign, 8 exponent bits,
//        7 mantissa bits), rounding toward zero. |decode(encode(x)) - x| < max(2^-7 * |x|, 2^-133)
//        (the second term for denormals).
//        Denormals keep their upper bits (so tiny values may become 0); +-Inf stays +-Inf; NaN stays
//        NaN (the quiet bit is forced so truncation can never turn a NaN into Inf).
//  int8  scalar quantization ("Q"): a message is [fp32 scale][int8 x n], scale = max|x| / 127
//        (rounded down so that 127 * scale never overflows), each
//        value round(x / scale) in [-127, 127]. |decode(encode(x)) - x| <= scale / 2 = max|x| / 254
//        per element of the chunk, or min(max|x|, 2^-142) if larger (tiny chunks, whose denormal
//        scale is rounded to a multiple of 2^-149). An all-zero chunk has scale 0 and decodes to
//        zeros. If the chunk holds a NaN or Inf, the scale is NaN and the whole chunk decodes to
//        NaN: a non-finite gradient is poisoned loudly, never silently clipped.
//
// Codecs are stateless and thread-safe. Decoders validate the message size against the expected
// element count and throw CommError on a mismatch (a peer can send anything).
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "pipesgd/collective/codec_names.h"

namespace pipesgd {

class Codec {
 public:
  virtual ~Codec() = default;
  virtual std::string_view name() const = 0;
  // True for `none`: encoded bytes are the fp32 values themselves.
  virtual bool is_identity() const { return false; }
  // Exact size of the message that encodes `count` values.
  virtual std::size_t encoded_bytes(std::size_t count) const = 0;
  // Encodes `values` into `out` (at least encoded_bytes(values.size()) bytes); returns bytes used.
  virtual std::size_t encode(std::span<const float> values, std::span<std::byte> out) const = 0;
  // destination[i] = value i of the message.
  virtual void decode(std::span<const std::byte> message, std::span<float> destination) const = 0;
  // destination[i] += value i of the message, in one pass (the fused decode-add of a ring step).
  virtual void decode_add(std::span<const std::byte> message, std::span<float> destination) const = 0;
  // Upper bound of |decode(encode(x))_i - x_i| for a chunk whose largest magnitude is max_abs.
  virtual double error_bound(double max_abs) const = 0;
};

// Bytes on the wire per fp32 value, as the planners count a gradient's size: encoded_bytes(1000) /
// 1000 (int8's per-message scale spread over a thousand values).
double bytes_per_element(const Codec& codec);

// "none", "bf16" or "int8"; throws UsageError naming the valid codecs otherwise. codec_names()
// and codec_encoded_bytes(): codec_names.h.
std::unique_ptr<Codec> make_codec(std::string_view name);

}  // namespace pipesgd
