// Fuzzes the gradient codecs (collective/codec.h) on the surface a peer's bytes reach: every
// allreduce hands a received message to Codec::decode or Codec::decode_add together with the
// destination span it expects to fill, and the decoder alone checks that the message has
// encoded_bytes(destination.size()) bytes (throwing CommError otherwise). So the message and the
// element count are both arbitrary here, matching or not.
//
// Input layout: byte 0 selects the codec (bits 0-1: none, bf16, int8), the operation (bits 2-3:
// decode, decode_add, encode round trip) and how the count is chosen (bit 4: from bytes 1-2 as a
// little-endian uint16; otherwise the count whose message size is nearest the remaining bytes, so
// sizes usually match); the rest is the message (or, for the round trip, the float values).
//
// Checked, besides ASan/UBSan: decode and decode_add throw CommError with a one-line message
// exactly when the size is wrong, write only their destination, and produce what the codec's
// documented format says (checked against an independent reference decoder here); decode_add equals
// the old destination plus decode; the round trip meets codec.h's promises (exact for none; bf16
// within max(2^-7 |x|, 2^-133), Inf and NaN kept; int8 within error_bound(max|x|), a non-finite
// chunk all NaN).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "codec_fuzzer: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

const std::vector<std::unique_ptr<pipesgd::Codec>>& codecs() {
  static const auto all = [] {
    std::vector<std::unique_ptr<pipesgd::Codec>> list;
    for (const std::string& name : pipesgd::codec_names())
      list.push_back(pipesgd::make_codec(name));
    if (list.size() != 3) finding("expected three codecs");
    return list;
  }();
  return all;
}

// Exact enough to tell denormals apart: "1.40129846e-45".
std::string show(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

float load_float(const std::byte* bytes) {
  float value;
  std::memcpy(&value, bytes, sizeof value);
  return value;
}

std::uint32_t bits_of(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Bitwise equality, any NaN equal to any NaN.
bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

// Value i of a well-sized message, straight from the format in codec.h.
float reference_value(std::string_view codec, std::span<const std::byte> message, std::size_t i) {
  if (codec == "none") return load_float(message.data() + 4 * i);
  if (codec == "bf16") {
    std::uint16_t upper;
    std::memcpy(&upper, message.data() + 2 * i, 2);
    const std::uint32_t bits = std::uint32_t{upper} << 16;
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
  }
  const float scale = load_float(message.data());
  if (!std::isfinite(scale) || scale < 0) return std::numeric_limits<float>::quiet_NaN();
  const auto level = static_cast<std::int8_t>(message[4 + i]);
  return static_cast<float>(level) * scale;
}

// decode or decode_add of `message` into `count` floats, with guard floats on both sides.
void check_decode(const pipesgd::Codec& codec, bool add, std::span<const std::byte> message,
                  std::size_t count) {
  constexpr std::size_t kGuard = 4;
  constexpr float kGuardValue = -1234.5f;
  std::vector<float> buffer(count + 2 * kGuard, kGuardValue);
  std::vector<float> initial(count);
  for (std::size_t i = 0; i < count; ++i) initial[i] = 0.25f * static_cast<float>(i % 17) - 2.0f;
  std::copy(initial.begin(), initial.end(), buffer.begin() + kGuard);
  const std::span<float> destination(buffer.data() + kGuard, count);

  const bool size_ok = message.size() == codec.encoded_bytes(count);
  bool threw = false;
  try {
    if (add) {
      codec.decode_add(message, destination);
    } else {
      codec.decode(message, destination);
    }
  } catch (const pipesgd::CommError& error) {
    threw = true;
    const std::string text = error.what();
    if (text.empty() || text.find('\n') != std::string::npos)
      finding("bad CommError message", text);
  }
  if (threw == size_ok) {
    finding(size_ok ? "rejected a well-sized message" : "accepted a message of the wrong size",
            std::string(codec.name()) + " message of " + std::to_string(message.size()) +
                " bytes for " + std::to_string(count) + " values");
  }
  for (std::size_t i = 0; i < kGuard; ++i) {
    if (bits_of(buffer[i]) != bits_of(kGuardValue) ||
        bits_of(buffer[kGuard + count + i]) != bits_of(kGuardValue)) {
      finding("wrote outside the destination");
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    float expected = initial[i];  // a rejected message leaves the destination untouched
    if (!threw) {
      const float value = reference_value(codec.name(), message, i);
      expected = add ? initial[i] + value : value;
    }
    if (!same_float(destination[i], expected)) {
      finding(add ? "decode_add differs from the reference" : "decode differs from the reference",
              std::string(codec.name()) + " value " + std::to_string(i));
    }
  }
}

void check_round_trip(const pipesgd::Codec& codec, std::span<const std::uint8_t> bytes) {
  const std::size_t n = bytes.size() / sizeof(float);
  std::vector<float> values(n);
  if (n > 0) std::memcpy(values.data(), bytes.data(), n * sizeof(float));
  const std::size_t expected_bytes = codec.encoded_bytes(n);
  std::vector<std::byte> message(expected_bytes + 8, std::byte{0xA5});
  const std::size_t used = codec.encode(values, message);
  if (used != expected_bytes) finding("encode returned a size other than encoded_bytes(n)");
  for (std::size_t i = expected_bytes; i < message.size(); ++i) {
    if (message[i] != std::byte{0xA5}) finding("encode wrote past encoded_bytes(n)");
  }
  std::vector<float> decoded(n);
  codec.decode(std::span<const std::byte>(message.data(), used), decoded);

  double max_abs = 0;
  bool finite = true;
  for (float x : values) {
    if (!std::isfinite(x))
      finite = false;
    else
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(x)));
  }
  const std::string name(codec.name());
  for (std::size_t i = 0; i < n; ++i) {
    const float x = values[i];
    const float y = decoded[i];
    const auto where = [&] { return name + " value " + std::to_string(i) + " (" + show(x) + ")"; };
    if (name == "none") {
      if (bits_of(x) != bits_of(y)) finding("none round trip not exact", where());
    } else if (name == "bf16") {
      if (std::isnan(x)) {
        if (!std::isnan(y)) finding("bf16 lost a NaN", where());
      } else if (std::isinf(x)) {
        if (bits_of(x) != bits_of(y)) finding("bf16 lost an Inf", where());
      } else {
        const double error = std::fabs(static_cast<double>(y) - x);
        if (!(error <= codec.error_bound(std::fabs(x))))
          finding("bf16 error above its bound", where());
      }
    } else {  // int8
      if (!finite) {
        if (!std::isnan(y)) finding("int8 chunk with NaN/Inf not decoded as NaN", where());
      } else {
        const double error = std::fabs(static_cast<double>(y) - x);
        if (!(error <= codec.error_bound(max_abs))) {
          finding("int8 error above error_bound(max|x|)",
                  where() + ", max|x| " + show(max_abs) + ", error " + show(error) + ", bound " +
                      show(codec.error_bound(max_abs)));
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t selector = data[0];
  const auto& codec = *codecs()[(selector & 3) % 3];
  const int operation = (selector >> 2) & 3;
  std::span<const std::uint8_t> rest(data + 1, size - 1);

  if (operation == 2 || operation == 3) {
    check_round_trip(codec, rest);
    return 0;
  }

  std::size_t count = 0;
  if ((selector & 0x10) != 0 && rest.size() >= 2) {
    count = rest[0] | (std::size_t{rest[1]} << 8);
    rest = rest.subspan(2);
  } else {
    // The count whose message is closest to (at most) the bytes present.
    const std::size_t per_value = codec.encoded_bytes(2) - codec.encoded_bytes(1);
    const std::size_t header = codec.encoded_bytes(1) - per_value;
    count = rest.size() > header ? (rest.size() - header) / per_value : 0;
  }
  // The message is a copy of exactly its size, so ASan sees a read past its end.
  const std::vector<std::byte> message(
      reinterpret_cast<const std::byte*>(rest.data()),
      reinterpret_cast<const std::byte*>(rest.data()) + rest.size());
  check_decode(codec, operation == 1, message, count);
  return 0;
}
