#include "pipesgd/collective/codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

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
    const std::byte* bytes = message.data();
    float* out = destination.data();
    const std::size_t n = destination.size();
    for (std::size_t i = 0; i < n; ++i) {
      float value;
      std::memcpy(&value, bytes + i * sizeof(float), sizeof(float));
      out[i] += value;
    }
  }
  double error_bound(double) const override { return 0; }
};

class Bf16Codec final : public Codec {
 public:
  std::string_view name() const override { return "bf16"; }
  std::size_t encoded_bytes(std::size_t count) const override { return count * 2; }
  static std::uint16_t truncate(float value) {
    std::uint32_t bits;
    std::memcpy(&bits, &value, 4);
    auto upper = static_cast<std::uint16_t>(bits >> 16);
    // A NaN whose payload lives only in the dropped bits would truncate to Inf: keep it a NaN.
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) upper |= 0x0040u;
    return upper;
  }
  static float widen(std::uint16_t upper) {
    const std::uint32_t bits = static_cast<std::uint32_t>(upper) << 16;
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  }
  std::size_t encode(std::span<const float> values, std::span<std::byte> out) const override {
    const std::size_t n = values.size();
    PIPESGD_ASSERT(out.size() >= encoded_bytes(n));
    std::byte* bytes = out.data();
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t upper = truncate(values[i]);
      std::memcpy(bytes + 2 * i, &upper, 2);
    }
    return encoded_bytes(n);
  }
  void decode(std::span<const std::byte> message, std::span<float> destination) const override {
    check_size(name(), message.size(), encoded_bytes(destination.size()));
    const std::byte* bytes = message.data();
    for (std::size_t i = 0; i < destination.size(); ++i) {
      std::uint16_t upper;
      std::memcpy(&upper, bytes + 2 * i, 2);
      destination[i] = widen(upper);
    }
  }
  void decode_add(std::span<const std::byte> message, std::span<float> destination) const override {
    check_size(name(), message.size(), encoded_bytes(destination.size()));
    const std::byte* bytes = message.data();
    float* out = destination.data();
    for (std::size_t i = 0; i < destination.size(); ++i) {
      std::uint16_t upper;
      std::memcpy(&upper, bytes + 2 * i, 2);
      out[i] += widen(upper);
    }
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
    // One vectorisable pass over the magnitudes' bit patterns: for non-negative floats the unsigned
    // order of the bits is the numeric order, and NaN / Inf are exactly the patterns >= 0x7f800000.
    std::int32_t max_bits = 0;
    const float* x = values.data();
    for (std::size_t i = 0; i < n; ++i) {
      std::int32_t bits;
      std::memcpy(&bits, x + i, sizeof bits);
      bits &= 0x7fffffff;
      max_bits = bits > max_bits ? bits : max_bits;
    }
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
        const float inverse = 1.0f / scale;
        for (std::size_t i = 0; i < n; ++i) {
          // Round half away from zero; clamped (x / scale may exceed 127 by float rounding).
          float level = x[i] * inverse;
          level = std::min(127.0f, std::max(-127.0f, level));
          q[i] = static_cast<std::int8_t>(static_cast<std::int32_t>(level + std::copysign(0.5f, level)));
        }
      } else {  // 1 / scale would overflow in float: the same rounding, in double
        const double inverse = 1.0 / static_cast<double>(scale);
        for (std::size_t i = 0; i < n; ++i) {
          double level = std::min(127.0, std::max(-127.0, x[i] * inverse));
          level += level >= 0 ? 0.5 : -0.5;
          q[i] = static_cast<std::int8_t>(static_cast<int>(level));
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
    for (std::size_t i = 0; i < n; ++i) {
      const float value = static_cast<float>(q[i]) * scale;
      out[i] = Add ? out[i] + value : value;
    }
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

std::unique_ptr<Codec> make_codec(std::string_view name) {
  if (name == "none") return std::make_unique<NoneCodec>();
  if (name == "bf16") return std::make_unique<Bf16Codec>();
  if (name == "int8") return std::make_unique<Int8Codec>();
  throw UsageError(concat("unknown codec '", name, "' (expected none, bf16, int8)"));
}

double bytes_per_element(const Codec& codec) { return static_cast<double>(codec.encoded_bytes(1000)) / 1000.0; }

}  // namespace pipesgd
