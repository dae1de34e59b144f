#include "pipesgd/collective/codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// The codecs' element loops, each compiled twice where the compiler can (GCC on x86-64): for the
// build's baseline and for AVX2, picked once at load time by the processor (an ifunc). AVX2 alone
// brings no fused multiply-add, so both versions round exactly alike: results are bit-identical
// whichever runs. The loops take the processor time a comm thread spends per byte (CPU ns/B).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PIPESGD_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PIPESGD_VECTOR_CLONES
#endif

PIPESGD_VECTOR_CLONES void add_floats(const std::byte* bytes, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    float value;
    std::memcpy(&value, bytes + i * sizeof(float), sizeof(float));
    out[i] += value;
  }
}

// The largest |x| as its bit pattern: for non-negative floats the unsigned order of the bits is the
// numeric order, and NaN / Inf are exactly the patterns >= 0x7f800000.
PIPESGD_VECTOR_CLONES std::int32_t max_magnitude_bits(const float* x, std::size_t n) {
  std::int32_t max_bits = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::int32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bits &= 0x7fffffff;
    max_bits = bits > max_bits ? bits : max_bits;
  }
  return max_bits;
}

// q[i] = round(x[i] * inverse) half away from zero, clamped to [-127, 127] (x / scale may exceed 127
// by float rounding). The rounding adds the float just below one half (0.5 - 2^-25) toward the sign
// and truncates, which is exact for every |level| <= 127 (checked for each such float): a level
// k + 0.5 sums to within 2^-25 of k + 1 and rounds up to it, anything below stays below. Adding 0.5
// itself is not: 0.5 - 2^-25 + 0.5 rounds to 1.0 in float, so that level became 1 (an error above
// scale / 2). As fast: the loop is the same.
PIPESGD_VECTOR_CLONES void quantize_loop(const float* x, std::size_t n, float inverse, std::int8_t* q) {
  constexpr float kJustBelowHalf = 0x1.fffffep-2f;
  for (std::size_t i = 0; i < n; ++i) {
    float level = x[i] * inverse;
    level = std::min(127.0f, std::max(-127.0f, level));
    q[i] = static_cast<std::int8_t>(static_cast<std::int32_t>(level + std::copysign(kJustBelowHalf, level)));
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PIPESGD_AVX2_QUANTIZE 1
// quantize_loop written in AVX2 intrinsics, 32 values a round: the same operations in the same order
// (multiply, clamp, add the signed just-below-half, truncate), so the levels are bit-identical; the
// compiler's own vectorisation of the loop narrows int32 to int8 lane by lane and takes 1.8x as long
// (`pipesgd profile`: int8 encode 0.053-0.072 -> 0.040 ns/B). The tail goes through quantize_loop.
__attribute__((target("avx2"))) void quantize_avx2(const float* x, std::size_t n, float inverse, std::int8_t* q) {
  constexpr float kJustBelowHalf = 0x1.fffffep-2f;
  const __m256 scale_inverse = _mm256_set1_ps(inverse);
  const __m256 upper = _mm256_set1_ps(127.0f);
  const __m256 lower = _mm256_set1_ps(-127.0f);
  const __m256 just_below_half = _mm256_set1_ps(kJustBelowHalf);
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  // The two packs interleave the four vectors' 4-value halves by 128-bit lane; this puts them back.
  const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i levels[4];
    for (int k = 0; k < 4; ++k) {
      __m256 level = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), scale_inverse);
      level = _mm256_min_ps(upper, _mm256_max_ps(lower, level));
      level = _mm256_add_ps(level, _mm256_or_ps(just_below_half, _mm256_and_ps(level, sign_bit)));
      levels[k] = _mm256_cvttps_epi32(level);
    }
    const __m256i words = _mm256_packs_epi32(levels[0], levels[1]);
    const __m256i more_words = _mm256_packs_epi32(levels[2], levels[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, more_words), in_order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), bytes);
  }
  quantize_loop(x + i, n - i, inverse, q + i);
}
#endif

void quantize(const float* x, std::size_t n, float inverse, std::int8_t* q) {
#ifdef PIPESGD_AVX2_QUANTIZE
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) {
    quantize_avx2(x, n, inverse, q);
    return;
  }
#endif
  quantize_loop(x, n, inverse, q);
}

// The upper 16 bits of each fp32 (a NaN whose payload lives only in the dropped bits keeps its quiet
// bit, so that it never truncates to Inf).
PIPESGD_VECTOR_CLONES void truncate_to_bf16(const float* x, std::size_t n, std::byte* out) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, x + i, 4);
    auto upper = static_cast<std::uint16_t>(bits >> 16);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) upper |= 0x0040u;
    std::memcpy(out + 2 * i, &upper, 2);
  }
}

template <bool Add>
PIPESGD_VECTOR_CLONES void widen_bf16(const std::byte* bytes, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t upper;
    std::memcpy(&upper, bytes + 2 * i, 2);
    const std::uint32_t bits = static_cast<std::uint32_t>(upper) << 16;
    float value;
    std::memcpy(&value, &bits, 4);
    out[i] = Add ? out[i] + value : value;
  }
}

template <bool Add>
PIPESGD_VECTOR_CLONES void dequantize(const std::int8_t* q, std::size_t n, float scale, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    const float value = static_cast<float>(q[i]) * scale;
    out[i] = Add ? out[i] + value : value;
  }
}

void check_size(std::string_view codec, std::size_t got, std::size_t expected) {
  if (got != expected) {
    throw CommError(concat(codec, " message of ", got, " bytes, expected ", expected,
                           " (corrupt or mismatched peer)"));
  }
}

class NoneCodec final : public Codec {
 public:
  std::string_view name() const override { return "none"; }
  bool is_identity() const override { return true; }
  std::size_t encoded_bytes(std::size_t count) const override { return count * sizeof(float); }
  std::size_t encode(std::span<const float> values, std::span<std::byte> out) const override {
    const std::size_t n = encoded_bytes(values.size());
    PIPESGD_ASSERT(out.size() >= n);
    if (n) std::memcpy(out.data(), values.data(), n);
    return n;
  }
  void decode(std::span<const std::byte> message, std::span<float> destination) const override {
    check_size(name(), message.size(), encoded_bytes(destination.size()));
    if (!message.empty()) std::memcpy(destination.data(), message.data(), message.size());
  }
  void decode_add(std::span<const std::byte> message, std::span<float> destination) const override {
    check_size(name(), message.size(), encoded_bytes(destination.size()));
    add_floats(message.data(), destination.size(), destination.data());
  }
  double error_bound(double) const override { return 0; }
};

class Bf16Codec final : public Codec {
 public:
  std::string_view name() const override { return "bf16"; }
  std::size_t encoded_bytes(std::size_t count) const override { return count * 2; }
  std::size_t encode(std::span<const float> values, std::span<std::byte> out) const override {
    const std::size_t n = values.size();
    PIPESGD_ASSERT(out.size() >= encoded_bytes(n));
    truncate_to_bf16(values.data(), n, out.data());
    return encoded_bytes(n);
  }
  void decode(std::span<const std::byte> message, std::span<float> destination) const override {
    check_size(name(), message.size(), encoded_bytes(destination.size()));
    widen_bf16<false>(message.data(), destination.size(), destination.data());
  }
  void decode_add(std::span<const std::byte> message, std::span<float> destination) const override {
    check_size(name(), message.size(), encoded_bytes(destination.size()));
    widen_bf16<true>(message.data(), destination.size(), destination.data());
  }
  // Relative 2^-7 for normal numbers; for denormals the truncated bits are worth up to 2^-133.
  double error_bound(double max_abs) const override { return std::max(max_abs * 0x1p-7, 0x1p-133); }
};

class Int8Codec final : public Codec {
  // Below this scale 1 / scale overflows fp32; such (denormal-range) chunks quantize in double.
  static constexpr float kSmallestFastScale = 1e-36f;

 public:
  std::string_view name() const override { return "int8"; }
  std::size_t encoded_bytes(std::size_t count) const override {
    return count == 0 ? 0 : sizeof(float) + count;
  }
  std::size_t encode(std::span<const float> values, std::span<std::byte> out) const override {
    const std::size_t n = values.size();
    if (n == 0) return 0;
    PIPESGD_ASSERT(out.size() >= encoded_bytes(n));
    const float* x = values.data();
    const std::int32_t max_bits = max_magnitude_bits(x, n);
    float max_abs;
    std::memcpy(&max_abs, &max_bits, sizeof max_abs);
    const bool finite = max_bits < 0x7f800000;
    float scale = finite ? max_abs / 127.0f : std::numeric_limits<float>::quiet_NaN();
    // Round the scale down until 127 * scale <= max|x|, so decoding never overflows (max|x| near
    // FLT_MAX); values a hair above 127 levels are clamped below.
    while (finite && scale > 0 && scale * 127.0f > max_abs) scale = std::nextafter(scale, 0.0f);
    std::memcpy(out.data(), &scale, sizeof(float));
    auto* q = reinterpret_cast<std::int8_t*>(out.data() + sizeof(float));
    if (!(scale > 0)) {  // zero chunk, or poisoned: the payload is ignored by the decoder
      std::memset(q, 0, n);
    } else {
      if (scale >= kSmallestFastScale) {
        quantize(x, n, 1.0f / scale, q);
      } else {  // 1 / scale would overflow in float: the same rounding, in double
        const double inverse = 1.0 / static_cast<double>(scale);
        for (std::size_t i = 0; i < n; ++i) {
          const double level = std::min(127.0, std::max(-127.0, x[i] * inverse));
          q[i] = static_cast<std::int8_t>(std::round(level));  // half away from zero, exactly
        }
      }
    }
    return encoded_bytes(n);
  }
  template <bool Add>
  void decode_into(std::span<const std::byte> message, std::span<float> destination) const {
    const std::size_t n = destination.size();
    check_size(name(), message.size(), encoded_bytes(n));
    if (n == 0) return;
    float scale;
    std::memcpy(&scale, message.data(), sizeof(float));
    const auto* q = reinterpret_cast<const std::int8_t*>(message.data() + sizeof(float));
    float* out = destination.data();
    if (std::isnan(scale) || std::isinf(scale) || scale < 0) {
      const float poison = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t i = 0; i < n; ++i) out[i] = Add ? out[i] + poison : poison;
      return;
    }
    dequantize<Add>(q, n, scale, out);
  }
  void decode(std::span<const std::byte> message, std::span<float> destination) const override {
    decode_into<false>(message, destination);
  }
  void decode_add(std::span<const std::byte> message, std::span<float> destination) const override {
    decode_into<true>(message, destination);
  }
  // scale / 2, plus float rounding of the scale, of x / scale and of q * scale. A denormal scale is
  // a multiple of 2^-149 (possibly 0), so a value clamped to level 127 may lose up to 127 * 2^-149;
  // no error exceeds max_abs itself (x and its decoded value share a sign and |both| <= max_abs).
  double error_bound(double max_abs) const override {
    return std::max(max_abs / 254.0 * (1 + 1e-4), std::min(max_abs, 0x1p-142));
  }
};

}  // namespace

std::vector<std::string> codec_names() { return {"none", "bf16", "int8"}; }

std::size_t codec_encoded_bytes(std::string_view name, std::size_t count) {
  return make_codec(name)->encoded_bytes(count);
}

std::unique_ptr<Codec> make_codec(std::string_view name) {
  if (name == "none") return std::make_unique<NoneCodec>();
  if (name == "bf16") return std::make_unique<Bf16Codec>();
  if (name == "int8") return std::make_unique<Int8Codec>();
  throw UsageError(concat("unknown codec '", name, "' (expected none, bf16, int8)"));
}

double bytes_per_element(const Codec& codec) { return static_cast<double>(codec.encoded_bytes(1000)) / 1000.0; }

}  // namespace pipesgd
