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
