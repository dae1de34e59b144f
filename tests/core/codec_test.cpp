// Tests of the gradient codecs (none, bf16, int8) against the contract documented in codec.h.
#include "pipesgd/collective/codec.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

constexpr float infinity = std::numeric_limits<float>::infinity();

float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }
std::uint32_t to_bits(float value) { return std::bit_cast<std::uint32_t>(value); }

std::vector<std::byte> encode_all(const Codec& codec, const std::vector<float>& values) {
  std::vector<std::byte> message(codec.encoded_bytes(values.size()));
  const std::size_t used = codec.encode(values, message);
  EXPECT_EQ(used, message.size()) << codec.name() << " encode() must use exactly encoded_bytes()";
  return message;
}

std::vector<float> round_trip(const Codec& codec, const std::vector<float>& values) {
  const std::vector<std::byte> message = encode_all(codec, values);
  std::vector<float> decoded(values.size(), 12345.0f);  // garbage that decode must overwrite
  codec.decode(message, decoded);
  return decoded;
}

double max_magnitude(const std::vector<float>& values) {
  double largest = 0;
  for (float value : values) largest = std::max(largest, std::fabs(static_cast<double>(value)));
  return largest;
}

// Asserts |decoded_i - x_i| <= codec.error_bound(max|x|) for every element of one chunk.
void expect_within_error_bound(const Codec& codec, const std::vector<float>& values) {
  const std::vector<float> decoded = round_trip(codec, values);
  const double bound = codec.error_bound(max_magnitude(values));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double error = std::fabs(static_cast<double>(decoded[i]) - static_cast<double>(values[i]));
    EXPECT_LE(error, bound) << codec.name() << ": element " << i << " = " << values[i]
                            << " (bits " << std::hex << to_bits(values[i]) << std::dec
                            << ") decoded to " << decoded[i] << "; chunk max|x| "
                            << max_magnitude(values);
  }
}

// Values with every sign, zeros, denormals, tiny and huge magnitudes in one chunk.
std::vector<float> extreme_mixed_values() {
  return {0.0f,    -0.0f,   1e-40f,  -1e-40f, 1e-45f,   1e-30f, -2.5e-20f, 0.001f,   -0.001f,
          1.0f,    -1.0f,   1.5f,    -3.75f,  123.456f, 1e10f,  -7e15f,    1e38f,    -3e38f,
          1.17549435e-38f /* smallest normal */};
}

// Deterministic pseudo-random chunk: magnitudes spread over 2^-exponent_span..2^exponent_span,
// both signs.
std::vector<float> spread_values(std::size_t count, int exponent_span, std::uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-exponent_span, exponent_span);
  std::vector<float> values(count);
  for (float& value : values) {
    value = std::ldexp(mantissa(generator), exponent(generator));
    if (generator() % 2) value = -value;
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// make_codec

TEST(CodecFactory, MakesEveryListedCodecUnderItsName) {
  const std::vector<std::string> names = codec_names();
  EXPECT_EQ(names, (std::vector<std::string>{"none", "bf16", "int8"}));
  for (const std::string& name : names) {
    auto codec = make_codec(name);
    ASSERT_NE(codec, nullptr);
    EXPECT_EQ(codec->name(), name);
    EXPECT_EQ(codec->is_identity(), name == "none") << name;
  }
}

TEST(CodecFactory, UnknownNameThrowsUsageErrorNamingTheValidCodecs) {
  try {
    make_codec("zstd");
    FAIL() << "make_codec(\"zstd\") did not throw";
  } catch (const UsageError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("zstd"), std::string::npos) << message;
    for (const std::string& name : codec_names()) {
      EXPECT_NE(message.find(name), std::string::npos) << "message does not name " << name << ": "
                                                       << message;
    }
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message is not one line: " << message;
  }
  EXPECT_THROW(make_codec(""), UsageError);
  EXPECT_THROW(make_codec("BF16"), UsageError);
}

// ---------------------------------------------------------------------------------------------
// Properties every codec shares.

class EveryCodec : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Codec> codec_ = make_codec(GetParam());
};

TEST_P(EveryCodec, RoundTripOfExtremeMixedValuesIsWithinErrorBound) {
  expect_within_error_bound(*codec_, extreme_mixed_values());
}

TEST_P(EveryCodec, RoundTripOfSpreadValuesIsWithinErrorBound) {
  // Chunks of moderate dynamic range, where the int8 bound is small relative to most values.
  for (int exponent_span : {0, 3, 10}) {
    for (std::uint32_t seed = 1; seed <= 5; ++seed) {
      SCOPED_TRACE(::testing::Message() << "span " << exponent_span << " seed " << seed);
      expect_within_error_bound(*codec_, spread_values(257, exponent_span, seed));
    }
  }
}

TEST_P(EveryCodec, EncodedBytesMatchesTheDocumentedLayout) {
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{1000}}) {
    std::size_t expected = 0;
    if (GetParam() == "none") expected = 4 * count;
    if (GetParam() == "bf16") expected = 2 * count;
    if (GetParam() == "int8") expected = count == 0 ? 0 : 4 + count;
    EXPECT_EQ(codec_->encoded_bytes(count), expected) << "count " << count;
  }
}

TEST_P(EveryCodec, DecodeAddEqualsDecodeThenAddBitForBit) {
  std::vector<std::vector<float>> chunks = {extreme_mixed_values(), spread_values(1001, 8, 7),
                                            {0.0f, -0.0f, 0.0f}, {2.0f}};
  if (GetParam() != "none") {  // none keeps NaN payloads as is; covered by the exact test below
    chunks.push_back({1.0f, std::numeric_limits<float>::quiet_NaN(), -2.0f});
    chunks.push_back({1.0f, infinity, -infinity});
  }
  for (std::size_t chunk = 0; chunk < chunks.size(); ++chunk) {
    SCOPED_TRACE(::testing::Message() << "chunk " << chunk);
    const std::vector<float>& values = chunks[chunk];
    const std::vector<std::byte> message = encode_all(*codec_, values);
    const std::vector<float> destination = spread_values(values.size(), 5, 99 + chunk);

    std::vector<float> fused = destination;
    codec_->decode_add(message, fused);

    std::vector<float> decoded(values.size());
    codec_->decode(message, decoded);
    std::vector<float> separate = destination;
    for (std::size_t i = 0; i < separate.size(); ++i) separate[i] += decoded[i];

    ASSERT_EQ(fused.size(), separate.size());
    EXPECT_EQ(std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)), 0);
    // The fused path must actually add: not leave the destination or just overwrite it.
    if (chunk == 0) {
      EXPECT_NE(std::memcmp(fused.data(), destination.data(), fused.size() * sizeof(float)), 0);
      EXPECT_NE(std::memcmp(fused.data(), decoded.data(), fused.size() * sizeof(float)), 0);
    }
  }
}

TEST_P(EveryCodec, EmptyInputEncodesToZeroBytesAndDecodes) {
  EXPECT_EQ(codec_->encoded_bytes(0), 0u);
  std::vector<std::byte> message(8, std::byte{0x5a});
  EXPECT_EQ(codec_->encode(std::span<const float>{}, message), 0u);
  std::vector<float> destination;
  EXPECT_NO_THROW(codec_->decode(std::span<const std::byte>{}, destination));
  EXPECT_NO_THROW(codec_->decode_add(std::span<const std::byte>{}, destination));
}

TEST_P(EveryCodec, DecodersRejectAMessageOfTheWrongSize) {
  const std::vector<float> values = {1.0f, -2.0f, 3.0f, 0.5f, 8.0f};
  const std::vector<std::byte> message = encode_all(*codec_, values);
  std::vector<float> destination(values.size());
  std::vector<std::byte> too_long = message;
  too_long.push_back(std::byte{0});
  const std::span<const std::byte> too_short(message.data(), message.size() - 1);

  EXPECT_THROW(codec_->decode(too_long, destination), CommError);
  EXPECT_THROW(codec_->decode(too_short, destination), CommError);
  EXPECT_THROW(codec_->decode_add(too_long, destination), CommError);
  EXPECT_THROW(codec_->decode_add(too_short, destination), CommError);
  // A non-empty message for an empty destination, and an empty one for a non-empty destination.
  std::vector<float> empty_destination;
  EXPECT_THROW(codec_->decode(message, empty_destination), CommError);
  EXPECT_THROW(codec_->decode(std::span<const std::byte>{}, destination), CommError);
  // One element more or less than the message holds.
  std::vector<float> one_more(values.size() + 1);
  EXPECT_THROW(codec_->decode(message, one_more), CommError);
  std::vector<float> one_fewer(values.size() - 1);
  EXPECT_THROW(codec_->decode_add(message, one_fewer), CommError);
}

// ---------------------------------------------------------------------------------------------
// Bit for bit against a plain scalar reference written from codec.h's semantics. The codecs' element
// loops are compiled for more than one instruction set (codec.cpp): whichever runs, encode, decode
// and decode_add must give exactly these bytes and floats.
//   none  the fp32 bytes as they are; decode_add adds each value in fp32.
//   bf16  the upper 16 bits of each fp32, a NaN's quiet bit (0x0040 of the upper half) forced;
//         decoding puts them back as the upper half, the lower 16 bits zero.
//   int8  [fp32 scale][int8 levels]: scale = max|x| / 127 in fp32, stepped down by nextafter until
//         127 * scale <= max|x|; NaN if the chunk holds a NaN or an Inf (levels 0), levels 0 for a zero
//         chunk; else level = clamp(x * (1 / scale), -127, 127) rounded half away from zero, the
//         product in fp32 (in double where 1 / scale would overflow fp32: scales below 1e-36).
//         Decoding gives level * scale in fp32, or NaN for every element if the scale is NaN or Inf.

namespace reference {

std::vector<std::byte> encode(const std::string& codec, const std::vector<float>& x) {
  std::vector<std::byte> message;
  auto append = [&message](const void* data, std::size_t size) {
    const auto* bytes = static_cast<const std::byte*>(data);
    message.insert(message.end(), bytes, bytes + size);
  };
  if (codec == "none") {
    for (float value : x) append(&value, 4);
  } else if (codec == "bf16") {
    for (float value : x) {
      const std::uint32_t bits = to_bits(value);
      std::uint16_t upper = static_cast<std::uint16_t>(bits >> 16);
      if (std::isnan(value)) upper |= 0x0040u;
      append(&upper, 2);
    }
  } else if (!x.empty()) {  // int8
    bool finite = true;
    float max_abs = 0.0f;
    for (float value : x) {
      if (!std::isfinite(value)) finite = false;
      else max_abs = std::max(max_abs, std::fabs(value));
    }
    float scale = finite ? max_abs / 127.0f : std::numeric_limits<float>::quiet_NaN();
    while (finite && scale > 0 && scale * 127.0f > max_abs) scale = std::nextafter(scale, 0.0f);
    append(&scale, 4);
    for (float value : x) {
      std::int8_t level = 0;
      if (scale > 0) {
        double rounded;
        if (scale >= 1e-36f) {
          const float inverse = 1.0f / scale;
          rounded = std::round(std::clamp(value * inverse, -127.0f, 127.0f));
        } else {
          const double inverse = 1.0 / static_cast<double>(scale);
          rounded = std::round(std::clamp(static_cast<double>(value) * inverse, -127.0, 127.0));
        }
        level = static_cast<std::int8_t>(rounded);
      }
      append(&level, 1);
    }
  }
  return message;
}

// decode (add = false) or decode_add (add = true) of `count` values into `out`.
void decode(const std::string& codec, const std::vector<std::byte>& message, std::vector<float>& out, bool add) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    float value;
    if (codec == "none") {
      std::memcpy(&value, message.data() + 4 * i, 4);
    } else if (codec == "bf16") {
      std::uint16_t upper;
      std::memcpy(&upper, message.data() + 2 * i, 2);
      value = from_bits(static_cast<std::uint32_t>(upper) << 16);
    } else {
      float scale;
      std::memcpy(&scale, message.data(), 4);
      const auto level = static_cast<std::int8_t>(message[4 + i]);
      value = std::isnan(scale) || std::isinf(scale) ? std::numeric_limits<float>::quiet_NaN()
                                                     : static_cast<float>(level) * scale;
    }
    out[i] = add ? out[i] + value : value;
  }
}

}  // namespace reference

// One value of a kind: 0 signed zero, 1 denormal, 2 normal of any exponent, 3 huge (above 2^100),
// 4 moderate ([-4, 4]), 5 half-integer or its float neighbour, 6 NaN (any payload and sign), 7 +-Inf.
float value_of_kind(std::mt19937& random, int kind) {
  const std::uint32_t sign = (random() & 1u) << 31;
  switch (kind) {
    case 0:
      return from_bits(sign);
    case 1:
      return from_bits(sign | (1u + random() % 0x7fffffu));
    case 2:
      return from_bits(sign | ((1u + random() % 254u) << 23) | (random() & 0x7fffffu));
    case 3:
      return from_bits(sign | ((227u + random() % 28u) << 23) | (random() & 0x7fffffu));
    case 4:
      return std::uniform_real_distribution<float>(-4.0f, 4.0f)(random);
    case 5: {
      const float half = static_cast<float>(static_cast<int>(random() % 254u) - 127) + 0.5f;
      const int step = static_cast<int>(random() % 3u) - 1;
      return step == 0 ? half : std::nextafter(half, step * 1000.0f);
    }
    case 6:
      return from_bits(sign | 0x7f800000u | (1u + random() % 0x7fffffu));
    default:
      return from_bits(sign | 0x7f800000u);
  }
}

// A chunk of `count` values of family `family`: 0 finite of every magnitude, 1 the same with the odd
// NaN or Inf, 2 zeros and denormals only (int8's double path), 3 moderate values only, 4 max|x| = 127
// (int8's scale exactly 1) with the rest at or beside half-integers (rounding ties).
std::vector<float> chunk_of_family(std::mt19937& random, int family, std::size_t count) {
  std::vector<float> values(count);
  for (float& value : values) {
    switch (family) {
      case 0:
        value = value_of_kind(random, static_cast<int>(random() % 6u));
        break;
      case 1:
        value = value_of_kind(random, random() % 50u == 0 ? 6 + static_cast<int>(random() % 2u) : static_cast<int>(random() % 6u));
        break;
      case 2:
        value = value_of_kind(random, static_cast<int>(random() % 2u));
        break;
      case 3:
        value = value_of_kind(random, 4);
        break;
      default:
        value = value_of_kind(random, 5);
        break;
    }
  }
  if (family == 1 && count > 0) values[random() % count] = value_of_kind(random, 6 + static_cast<int>(random() % 2u));
  if (family == 4 && count > 0) values[random() % count] = random() % 2 ? 127.0f : -127.0f;
  return values;
}

std::string describe_first_difference(const std::vector<float>& got, const std::vector<float>& want) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (to_bits(got[i]) != to_bits(want[i])) {
      std::ostringstream text;
      text << "element " << i << ": " << got[i] << " (bits " << std::hex << to_bits(got[i]) << ") vs reference "
           << want[i] << " (bits " << to_bits(want[i]) << ")";
      return text.str();
    }
  }
  return "";
}

void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(describe_first_difference(got, want), "") << what;
}

// `codec` decodes `message` into fresh values, and decode-adds it onto `destination`, exactly as
// the reference does.
void expect_decodes_as_reference(const Codec& codec, const std::string& name, const std::vector<std::byte>& message,
                                 std::size_t count, const std::vector<float>& destination) {
  std::vector<float> decoded(count, 12345.0f), expected_decoded(count, 12345.0f);
  codec.decode(message, decoded);
  reference::decode(name, message, expected_decoded, false);
  expect_same_floats(decoded, expected_decoded, "decode");
  std::vector<float> added = destination, expected_added = destination;
  codec.decode_add(message, added);
  reference::decode(name, message, expected_added, true);
  expect_same_floats(added, expected_added, "decode_add");
}

TEST_P(EveryCodec, MatchesTheScalarReferenceBitForBit) {
  const std::string name = GetParam();
  for (int family = 0; family < 5; ++family) {
    for (std::size_t count : {0, 1, 7, 8, 9, 1000, 1027}) {
      for (std::uint32_t seed = 1; seed <= 4; ++seed) {
        SCOPED_TRACE(::testing::Message() << "family " << family << ", " << count << " values, seed " << seed);
        std::mt19937 random(seed * 7919u + static_cast<std::uint32_t>(count) * 31u + static_cast<std::uint32_t>(family));
        const std::vector<float> values = chunk_of_family(random, family, count);
        const std::vector<std::byte> expected_message = reference::encode(name, values);
        const std::vector<std::byte> message = encode_all(*codec_, values);
        ASSERT_EQ(message.size(), expected_message.size());
        EXPECT_TRUE(message == expected_message) << "encode differs from the reference";

        // decode_add onto finite destinations (with two NaNs the result's payload would depend on
        // the order of the operands, which the reference does not pin down).
        expect_decodes_as_reference(*codec_, name, message, count, chunk_of_family(random, 0, count));
      }
    }
  }
}

// Messages that no encoder of ours writes, as a peer may send them: every bit pattern decodes as
// the reference says (int8: any scale, including 0, denormal, NaN and Inf, and any level).
TEST_P(EveryCodec, DecodesArbitraryMessagesAsTheReference) {
  const std::string name = GetParam();
  const float scales[] = {1.0f, 3.5e-3f, 0.0f, 1e-40f, 1e30f, std::numeric_limits<float>::quiet_NaN(), infinity};
  for (std::size_t count : {1, 8, 9, 1027}) {
    for (std::uint32_t seed = 1; seed <= 7; ++seed) {
      SCOPED_TRACE(::testing::Message() << count << " values, seed " << seed);
      std::mt19937 random(seed);
      std::vector<std::byte> message(codec_->encoded_bytes(count));
      for (std::byte& byte : message) byte = static_cast<std::byte>(random() & 0xffu);
      if (name == "int8") std::memcpy(message.data(), &scales[seed - 1], 4);
      expect_decodes_as_reference(*codec_, name, message, count, chunk_of_family(random, 3, count));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, EveryCodec, ::testing::Values("none", "bf16", "int8"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// none

TEST(NoneCodec, RoundTripIsBitExactIncludingNaNPayloadsAndSignedZero) {
  auto codec = make_codec("none");
  std::vector<float> values = extreme_mixed_values();
  values.push_back(from_bits(0x7f800001u));  // signalling-style NaN payload
  values.push_back(from_bits(0xffc01234u));
  values.push_back(infinity);
  values.push_back(-infinity);
  const std::vector<float> decoded = round_trip(*codec, values);
  ASSERT_EQ(decoded.size(), values.size());
  EXPECT_EQ(std::memcmp(decoded.data(), values.data(), values.size() * sizeof(float)), 0);
  EXPECT_EQ(codec->error_bound(1e30), 0.0);
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(Bf16Codec, RelativeErrorIsBelowTwoToMinusSevenAndTruncatesTowardZero) {
  auto codec = make_codec("bf16");
  std::vector<float> values = spread_values(4000, 120, 3);
  for (float value : extreme_mixed_values()) {
    if (std::isnormal(value)) values.push_back(value);
  }
  values.push_back(std::numeric_limits<float>::max());
  values.push_back(std::numeric_limits<float>::lowest());
  values.push_back(from_bits(0x3f80ffffu));  // 1 + everything below bf16 precision
  const std::vector<float> decoded = round_trip(*codec, values);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double x = values[i];
    const double error = std::fabs(decoded[i] - x);
    EXPECT_LT(error, 0x1p-7 * std::fabs(x)) << "x = " << x << " decoded " << decoded[i];
    // Truncation toward zero: same sign, never larger in magnitude, low 16 bits cleared.
    EXPECT_EQ(std::signbit(decoded[i]), std::signbit(values[i])) << x;
    EXPECT_LE(std::fabs(decoded[i]), std::fabs(values[i])) << x;
    EXPECT_EQ(to_bits(decoded[i]), to_bits(values[i]) & 0xffff0000u) << x;
  }
}

TEST(Bf16Codec, ZerosAndDenormalsKeepTheirUpperBits) {
  auto codec = make_codec("bf16");
  const std::vector<float> values = {0.0f, -0.0f, 1e-40f, -1e-40f, 1e-45f, -1e-45f};
  const std::vector<float> decoded = round_trip(*codec, values);
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(to_bits(decoded[i]), to_bits(values[i]) & 0xffff0000u) << values[i];
  }
  EXPECT_TRUE(std::signbit(decoded[1])) << "-0 must stay -0";
  EXPECT_EQ(decoded[4], 0.0f) << "1e-45 has no upper bits: it becomes 0";
  EXPECT_GT(decoded[2], 0.0f) << "1e-40 keeps its upper bits";
}

TEST(Bf16Codec, KeepsInfinitiesAndEveryNaNANaN) {
  auto codec = make_codec("bf16");
  const std::vector<float> values = {
      infinity,
      -infinity,
      std::numeric_limits<float>::quiet_NaN(),
      -std::numeric_limits<float>::quiet_NaN(),
      from_bits(0x7f800001u),  // NaN whose payload lives only in the dropped low 16 bits
      from_bits(0xff800001u),
      from_bits(0x7f80ffffu),
      from_bits(0x7f810000u),  // NaN with payload in the kept bits
      from_bits(0x7fa00000u),  // signalling NaN
  };
  const std::vector<float> decoded = round_trip(*codec, values);
  EXPECT_EQ(decoded[0], infinity);
  EXPECT_EQ(decoded[1], -infinity);
  for (std::size_t i = 2; i < values.size(); ++i) {
    EXPECT_TRUE(std::isnan(decoded[i])) << "bits " << std::hex << to_bits(values[i])
                                        << " decoded to bits " << to_bits(decoded[i]);
  }
}

// The error bound must also hold for a chunk that holds nothing but denormals.
TEST(Bf16Codec, ErrorBoundHoldsForADenormalOnlyChunk) {
  auto codec = make_codec("bf16");
  expect_within_error_bound(*codec, {1e-40f});
  expect_within_error_bound(*codec, {1e-40f, -3e-41f, 5e-42f});
}

// ---------------------------------------------------------------------------------------------
// int8

TEST(Int8Codec, MessageIsScaleThenLevelsWithTheLargestValueAtPlusMinus127) {
  auto codec = make_codec("int8");
  const std::vector<float> values = {0.5f, -2.0f, 1.5f, 0.0f, 2.0f / 127.0f};
  const std::vector<std::byte> message = encode_all(*codec, values);
  ASSERT_EQ(message.size(), 4 + values.size());
  float scale;
  std::memcpy(&scale, message.data(), sizeof(float));
  EXPECT_EQ(scale, 2.0f / 127.0f);
  std::vector<int> levels;
  for (std::size_t i = 0; i < values.size(); ++i) {
    levels.push_back(static_cast<std::int8_t>(message[4 + i]));
  }
  // level = round(x / scale) = round(x * 63.5): 31.75 -> 32, 95.25 -> 95.
  EXPECT_EQ(levels, (std::vector<int>{32, -127, 95, 0, 1}));
}

// Rounding half away from zero, exactly: with max|x| = 127 the scale is 1 and each level is x itself
// rounded. 0.5 - 2^-25 (the float just below one half) rounds to 0: adding 0.5 in float first would
// round the sum up to 1.0 and decode to an error above scale / 2.
TEST(Int8Codec, RoundsHalfAwayFromZeroExactly) {
  auto codec = make_codec("int8");
  const float below_half = std::nextafter(0.5f, 0.0f);
  const std::vector<float> values = {127.0f, below_half, -below_half, 0.5f, -0.5f, 2.5f, -2.5f,
                                     std::nextafter(2.5f, 0.0f), 126.5f, -126.5f, 1.4999999f};
  const std::vector<std::byte> message = encode_all(*codec, values);
  float scale;
  std::memcpy(&scale, message.data(), sizeof(float));
  ASSERT_EQ(scale, 1.0f);
  std::vector<int> levels;
  for (std::size_t i = 0; i < values.size(); ++i) levels.push_back(static_cast<std::int8_t>(message[4 + i]));
  EXPECT_EQ(levels, (std::vector<int>{127, 0, 0, 1, -1, 3, -3, 2, 127, -127, 1}));
  // codec.h: |decode(encode(x)) - x| <= scale / 2.
  const std::vector<float> decoded = round_trip(*codec, values);
  for (std::size_t i = 0; i < values.size(); ++i) {
    EXPECT_LE(std::fabs(static_cast<double>(decoded[i]) - values[i]), 0.5) << "x = " << values[i];
  }
  // Every half-integer level in (-127, 127) and the three floats on each side of it.
  std::vector<float> ties = {127.0f};
  for (int k = -127; k < 127; ++k) {
    float x = static_cast<float>(k) + 0.5f;
    for (int step = 0; step < 3; ++step) x = std::nextafter(x, -1000.0f);
    for (int step = 0; step < 7; ++step, x = std::nextafter(x, 1000.0f)) ties.push_back(x);
  }
  const std::vector<std::byte> tie_message = encode_all(*codec, ties);
  for (std::size_t i = 0; i < ties.size(); ++i) {
    EXPECT_EQ(static_cast<std::int8_t>(tie_message[4 + i]), static_cast<int>(std::round(ties[i])))
        << "x = " << std::hexfloat << ties[i];
  }
}

TEST(Int8Codec, ZeroChunkDecodesToExactZeros) {
  auto codec = make_codec("int8");
  const std::vector<float> values = {0.0f, -0.0f, 0.0f, 0.0f};
  const std::vector<float> decoded = round_trip(*codec, values);
  for (float value : decoded) EXPECT_EQ(value, 0.0f);
  // decode_add of a zero chunk leaves the destination unchanged.
  std::vector<float> destination = {1.0f, -2.0f, 3.5f, 1e-3f};
  const std::vector<float> before = destination;
  codec->decode_add(encode_all(*codec, values), destination);
  EXPECT_EQ(destination, before);
}

TEST(Int8Codec, AnyNonFiniteValuePoisonsTheWholeChunkWithNaN) {
  auto codec = make_codec("int8");
  for (float poison : {std::numeric_limits<float>::quiet_NaN(), infinity, -infinity,
                       from_bits(0x7f800001u)}) {
    for (std::size_t position : {0u, 3u, 6u}) {
      std::vector<float> values = {1.0f, -2.0f, 0.0f, 4.0f, 0.25f, -1e-3f, 7.0f};
      values[position] = poison;
      SCOPED_TRACE(::testing::Message() << "poison " << poison << " at " << position);
      const std::vector<float> decoded = round_trip(*codec, values);
      for (std::size_t i = 0; i < decoded.size(); ++i) {
        EXPECT_TRUE(std::isnan(decoded[i])) << "element " << i << " decoded to " << decoded[i];
      }
      std::vector<float> destination(values.size(), 1.0f);
      codec->decode_add(encode_all(*codec, values), destination);
      for (float value : destination) EXPECT_TRUE(std::isnan(value));
    }
  }
}

TEST(Int8Codec, ErrorBoundIsTightEnoughToCatchALostLevel) {
  // The bound is max|x| / 254, half a quantization step (here max|x| = 127, so a step is 1): an
  // error of one whole level must exceed it.
  auto codec = make_codec("int8");
  EXPECT_LT(codec->error_bound(127.0), 0.51);
  EXPECT_GE(codec->error_bound(127.0), 0.5);
  EXPECT_EQ(codec->error_bound(0.0), 0.0);
}

// Values just around the midpoints between two quantization levels: float rounding in the encoder
// must not push the error past the documented scale / 2 (error_bound).
TEST(Int8Codec, ErrorBoundHoldsAtRoundingMidpoints) {
  auto codec = make_codec("int8");
  // 0x1.244892p-1 = 0.570866... lies just off the midpoint between levels 72 and 73 (of 1/127); an
  // encoder that rounded x * (1 / scale) in float without slack in the bound failed here.
  expect_within_error_bound(*codec, {1.0f, 0x1.244892p-1f});
  for (int level = 0; level < 127; ++level) {
    std::vector<float> values = {1.0f};
    float x = static_cast<float>((level + 0.5) / 127.0);
    for (int step = 0; step < 20; ++step) x = std::nextafter(x, 0.0f);
    for (int step = 0; step < 40; ++step, x = std::nextafter(x, 2.0f)) values.push_back(x);
    SCOPED_TRACE(::testing::Message() << "around level " << level << ".5");
    expect_within_error_bound(*codec, values);
  }
}

// A chunk whose largest magnitude is tiny (below ~3.7e-37, where 1/scale overflows a float) must
// still be quantized relative to its own maximum.
TEST(Int8Codec, ErrorBoundHoldsForATinyMagnitudeChunk) {
  auto codec = make_codec("int8");
  expect_within_error_bound(*codec, {1e-37f, 3e-38f, -2e-38f});
  expect_within_error_bound(*codec, {1e-38f, 1e-39f, 0.0f, -5e-39f});
  expect_within_error_bound(*codec, {1e-40f, -3e-41f, 0.0f});
}

// Quantizing the largest finite floats must not overflow to Inf on decode.
TEST(Int8Codec, RoundTripOfTheLargestFiniteFloatsStaysFinite) {
  auto codec = make_codec("int8");
  const std::vector<float> values = {std::numeric_limits<float>::max(),
                                     std::numeric_limits<float>::lowest(), 1.0f};
  const std::vector<float> decoded = round_trip(*codec, values);
  for (float value : decoded) EXPECT_TRUE(std::isfinite(value)) << value;
  expect_within_error_bound(*codec, values);
}

}  // namespace
}  // namespace pipesgd
