// Tests of the dtype-generic collectives (collective/typed_collectives.h) and of RankGroupTransport
// (comm/rank_group_transport.h): the half-precision conversions against known bit patterns; the
// element-wise kernels' wrapping, rounding, NaN and bool rules; reduce_all for every element type,
// reduction, world size 1-4 and count 0, 1, 2 and 20011 against closed forms, bit-identical on every
// rank; reduce_scatter with uneven and empty blocks (and bit for bit as reduce_all's blocks);
// gather_all with an empty contribution; exchange_all with uneven and empty parts; broadcast from
// every root; messages large enough to be cut into segments; the size checks of exchange_all and
// broadcast_bytes; the argument checks; process sets (two groups of a 4-rank world at once with one
// tag); and the same collectives across processes over SharedMemoryTransport (forked_world.h).
// Ranks are threads over a LocalFabric (test_world.h) unless noted.
#include "pipesgd/collective/typed_collectives.h"

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <numeric>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipesgd/comm/local_transport.h"
#include "pipesgd/comm/rank_group_transport.h"
#include "pipesgd/comm/rank_subset_transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/random.h"
#include "forked_world.h"
#include "test_world.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

// Generous: only reached if a collective is broken; the test then fails instead of hanging.
constexpr Timeout long_timeout = 30s;

constexpr ElementType kEveryType[] = {ElementType::kUInt8,   ElementType::kInt8,     ElementType::kInt16,
                                      ElementType::kInt32,   ElementType::kInt64,    ElementType::kFloat16,
                                      ElementType::kBFloat16, ElementType::kFloat32, ElementType::kFloat64,
                                      ElementType::kBool};
constexpr ElementwiseReduction kEveryReduction[] = {ElementwiseReduction::kSum, ElementwiseReduction::kMin,
                                                    ElementwiseReduction::kMax, ElementwiseReduction::kProduct};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

Tag test_tag(std::uint64_t sequence) { return collective_tag(Channel::kControl, sequence); }

// ---------------------------------------------------------------------------------------------
// The closed-form model: rank r's element i of a test vector, and the reduction over ranks 0..p-1,
// written as element bytes.
//  * Integers: any values (near the type's range, so that sums and products wrap); the expected sum
//    and product are taken modulo 2^64 and truncated, which is the type's two's complement wrap.
//  * Floating point: values whose every partial sum or product is exact in every floating type
//    (halves below 64; powers of two within 2^-8..2^8), so the order of the ring cannot matter.
//    Min/max also put a NaN on one rank of every 97th element from 5 on: the result is NaN.
//  * Bool: true stored as rank + 1 (not only 1), false as 0; results are 0 or 1.

bool is_floating(ElementType type) {
  return type == ElementType::kFloat16 || type == ElementType::kBFloat16 || type == ElementType::kFloat32 ||
         type == ElementType::kFloat64;
}

// Stores the low element_size(type) bytes of `bits` as one integer (or bool) element.
void put_integer(ElementType type, std::uint64_t bits, std::byte* out) {
  switch (element_size(type)) {
    case 1: { const auto v = static_cast<std::uint8_t>(bits); std::memcpy(out, &v, 1); break; }
    case 2: { const auto v = static_cast<std::uint16_t>(bits); std::memcpy(out, &v, 2); break; }
    case 4: { const auto v = static_cast<std::uint32_t>(bits); std::memcpy(out, &v, 4); break; }
    default: std::memcpy(out, &bits, 8);
  }
}

// Stores `value` (exactly representable, or NaN) as one floating-point element.
void put_floating(ElementType type, double value, std::byte* out) {
  if (type == ElementType::kFloat64) {
    std::memcpy(out, &value, 8);
  } else if (type == ElementType::kFloat32) {
    const auto v = static_cast<float>(value);
    std::memcpy(out, &v, 4);
  } else {
    const std::uint16_t v = type == ElementType::kFloat16 ? float_to_float16(static_cast<float>(value))
                                                          : float_to_bfloat16(static_cast<float>(value));
    std::memcpy(out, &v, 2);
  }
}

bool is_nan_element(ElementType type, const std::byte* element) {
  switch (type) {
    case ElementType::kFloat64: { double v; std::memcpy(&v, element, 8); return std::isnan(v); }
    case ElementType::kFloat32: { float v; std::memcpy(&v, element, 4); return std::isnan(v); }
    case ElementType::kFloat16: { std::uint16_t v; std::memcpy(&v, element, 2); return std::isnan(float16_to_float(v)); }
    case ElementType::kBFloat16: { std::uint16_t v; std::memcpy(&v, element, 2); return std::isnan(bfloat16_to_float(v)); }
    default: return false;
  }
}

std::int64_t integer_input(ElementType type, int rank, std::size_t i) {
  const std::int64_t base = static_cast<std::int64_t>((i * 37 + static_cast<std::size_t>(rank) * 101) % 251) - 125;
  switch (type) {
    case ElementType::kUInt8: return base + 125;
    case ElementType::kInt8: return base;
    case ElementType::kInt16: return base * 257;
    case ElementType::kInt32: return base * 16777259;
    default: return base * ((std::int64_t{1} << 56) + 1);
  }
}

double floating_input(ElementwiseReduction reduction, int ranks, int rank, std::size_t i) {
  switch (reduction) {
    case ElementwiseReduction::kSum: return static_cast<double>(i % 29) - 14 + 0.5 * rank;
    case ElementwiseReduction::kProduct: {
      const double magnitude = std::ldexp(1.0, static_cast<int>((i + 2 * static_cast<std::size_t>(rank)) % 5) - 2);
      return (i * 3 + static_cast<std::size_t>(rank)) % 4 == 0 ? -magnitude : magnitude;
    }
    default:
      if (i % 97 == 5 && rank == static_cast<int>((i / 97) % static_cast<std::size_t>(ranks))) {
        return std::numeric_limits<double>::quiet_NaN();
      }
      return static_cast<double>((i * 7 + static_cast<std::size_t>(rank) * 5) % 23) - 11 + (rank % 2 ? 0.25 : 0);
  }
}

bool bool_input(int rank, std::size_t i) { return (i * 5 + static_cast<std::size_t>(rank) * 3) % 7 < 4; }

std::vector<std::byte> input_of(ElementType type, ElementwiseReduction reduction, int ranks, int rank,
                                std::size_t count) {
  const std::size_t size = element_size(type);
  std::vector<std::byte> bytes(count * size);
  for (std::size_t i = 0; i < count; ++i) {
    std::byte* out = bytes.data() + i * size;
    if (type == ElementType::kBool) {
      put_integer(type, bool_input(rank, i) ? static_cast<std::uint64_t>(rank + 1) : 0, out);
    } else if (is_floating(type)) {
      put_floating(type, floating_input(reduction, ranks, rank, i), out);
    } else {
      put_integer(type, static_cast<std::uint64_t>(integer_input(type, rank, i)), out);
    }
  }
  return bytes;
}

std::vector<std::byte> expected_of(ElementType type, ElementwiseReduction reduction, int ranks, std::size_t count) {
  const std::size_t size = element_size(type);
  const bool is_sum = reduction == ElementwiseReduction::kSum, is_product = reduction == ElementwiseReduction::kProduct;
  const bool is_min = reduction == ElementwiseReduction::kMin;
  std::vector<std::byte> bytes(count * size);
  for (std::size_t i = 0; i < count; ++i) {
    std::byte* out = bytes.data() + i * size;
    if (type == ElementType::kBool) {
      bool any = false, all = true;
      for (int r = 0; r < ranks; ++r) {
        any = any || bool_input(r, i);
        all = all && bool_input(r, i);
      }
      put_integer(type, (is_product || is_min) ? all : any, out);
    } else if (is_floating(type)) {
      double result = floating_input(reduction, ranks, 0, i);
      for (int r = 1; r < ranks; ++r) {
        const double v = floating_input(reduction, ranks, r, i);
        if (is_sum) result += v;
        else if (is_product) result *= v;
        else if (std::isnan(v) || std::isnan(result)) result = std::numeric_limits<double>::quiet_NaN();
        else result = is_min ? std::min(result, v) : std::max(result, v);
      }
      put_floating(type, result, out);
    } else {
      std::uint64_t wrapped = static_cast<std::uint64_t>(integer_input(type, 0, i));
      std::int64_t extreme = integer_input(type, 0, i);
      for (int r = 1; r < ranks; ++r) {
        const std::int64_t v = integer_input(type, r, i);
        if (is_sum) wrapped += static_cast<std::uint64_t>(v);
        if (is_product) wrapped *= static_cast<std::uint64_t>(v);
        extreme = is_min ? std::min(extreme, v) : std::max(extreme, v);
      }
      put_integer(type, (is_sum || is_product) ? wrapped : static_cast<std::uint64_t>(extreme), out);
    }
  }
  return bytes;
}

// "" if `got` holds `expected`'s elements (a NaN expected: any NaN), else the first difference.
std::string compare_elements(ElementType type, const std::vector<std::byte>& expected, std::span<const std::byte> got) {
  if (got.size() != expected.size()) return concat(got.size(), " bytes, expected ", expected.size());
  const std::size_t size = element_size(type);
  for (std::size_t at = 0; at < expected.size(); at += size) {
    const bool nan_expected = is_nan_element(type, expected.data() + at);
    if (nan_expected ? !is_nan_element(type, got.data() + at) : std::memcmp(expected.data() + at, got.data() + at, size) != 0) {
      return concat("element ", at / size, " of ", expected.size() / size, " differs");
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Element types and conversions

TEST(TypedCollectivesElements, SizesAndNames) {
  const std::size_t sizes[] = {1, 1, 2, 4, 8, 2, 2, 4, 8, 1};
  const std::string names[] = {"uint8",   "int8",     "int16",   "int32",   "int64",
                               "float16", "bfloat16", "float32", "float64", "bool"};
  for (int t = 0; t < kElementTypeCount; ++t) {
    EXPECT_EQ(element_size(kEveryType[t]), sizes[t]);
    EXPECT_EQ(element_type_name(kEveryType[t]), names[t]);
  }
  EXPECT_THROW(element_size(static_cast<ElementType>(10)), UsageError);
}

TEST(TypedCollectivesElements, Float16KnownBitPatterns) {
  EXPECT_EQ(float_to_float16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_float16(-2.5f), 0xc100);
  EXPECT_EQ(float_to_float16(0.0f), 0x0000);
  EXPECT_EQ(float_to_float16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_float16(65504.0f), 0x7bff);                      // the largest half
  EXPECT_EQ(float_to_float16(65519.99f), 0x7bff);                     // below the half-way point
  EXPECT_EQ(float_to_float16(65520.0f), 0x7c00);                      // the tie rounds to even: infinity
  EXPECT_EQ(float_to_float16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_float16(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_float16(std::ldexp(1.0f, -14)), 0x0400);         // the smallest normal
  EXPECT_EQ(float_to_float16(std::ldexp(1.0f, -24)), 0x0001);         // the smallest subnormal
  EXPECT_EQ(float_to_float16(std::ldexp(1023.0f, -24)), 0x03ff);      // the largest subnormal
  EXPECT_EQ(float_to_float16(std::ldexp(1.0f, -25)), 0x0000);         // a tie: to even (zero)
  EXPECT_EQ(float_to_float16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_float16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units: a tie, to even 2
  EXPECT_EQ(float_to_float16(std::ldexp(5.0f, -25)), 0x0002);         // 2.5 units: to even 2
  EXPECT_EQ(float_to_float16(std::ldexp(1.0f, -26)), 0x0000);
  EXPECT_EQ(float_to_float16(std::ldexp(2047.0f, -25)), 0x0400);      // rounds up into the normals
  EXPECT_EQ(float_to_float16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie: to even
  EXPECT_EQ(float_to_float16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // a tie: to even (up)
  EXPECT_EQ(float_to_float16(2049.0f), 0x6800);                       // 2048
  EXPECT_EQ(float_to_float16(2051.0f), 0x6802);                       // 2052
  EXPECT_EQ(float_to_float16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_float16(-std::numeric_limits<float>::infinity()), 0xfc00);
  const std::uint16_t nan = float_to_float16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(float16_to_float(float_to_float16(std::bit_cast<float>(0x7f800001u)))));  // signalling

  EXPECT_EQ(float16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(float16_to_float(0xc100), -2.5f);
  EXPECT_EQ(float16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(float16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(float16_to_float(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(float16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(float16_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(float16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(float16_to_float(0xfc01)));
  EXPECT_TRUE(std::signbit(float16_to_float(0x8000)));
  // Every non-NaN half survives the round trip through float.
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float value = float16_to_float(half);
    if (std::isnan(value)) continue;
    ASSERT_EQ(float_to_float16(value), half) << std::hex << bits;
  }
}

TEST(TypedCollectivesElements, BFloat16KnownBitPatterns) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(-2.5f), 0xc020);
  EXPECT_EQ(float_to_bfloat16(65504.0f), 0x4780);                      // rounds to 65536
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // a tie: to even
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);  // a tie: to even (up)
  EXPECT_EQ(float_to_bfloat16(1.0f + std::ldexp(1.0f, -7) + std::ldexp(1.0f, -9)), 0x3f81);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to infinity
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bfloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bfloat16(std::bit_cast<float>(0x00018000u)), 0x0002);  // a subnormal tie: to even
  const std::uint16_t nan = float_to_bfloat16(std::bit_cast<float>(0x7f800001u));  // payload below bit 16
  EXPECT_TRUE(std::isnan(bfloat16_to_float(nan)));
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(-std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bfloat16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bfloat16_to_float(0x0001), std::ldexp(1.0f, -133));  // the smallest subnormal
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float value = bfloat16_to_float(half);
    if (std::isnan(value)) continue;
    ASSERT_EQ(float_to_bfloat16(value), half) << std::hex << bits;
  }
}

template <typename T>
T reduce_two(ElementType type, ElementwiseReduction reduction, T a, T b) {
  reduce_elements(std::as_writable_bytes(std::span(&a, 1)), std::as_bytes(std::span(&b, 1)), type, reduction);
  return a;
}

TEST(TypedCollectivesElements, KernelsWrapRoundAndPropagateNan) {
  using R = ElementwiseReduction;
  EXPECT_EQ(reduce_two<std::int8_t>(ElementType::kInt8, R::kSum, 127, 1), -128);
  EXPECT_EQ(reduce_two<std::uint8_t>(ElementType::kUInt8, R::kProduct, 16, 16), 0);
  EXPECT_EQ(reduce_two<std::int16_t>(ElementType::kInt16, R::kProduct, 300, 300), static_cast<std::int16_t>(90000 - 65536));
  EXPECT_EQ(reduce_two<std::int16_t>(ElementType::kInt16, R::kProduct, -32768, -1), -32768);
  EXPECT_EQ(reduce_two<std::int32_t>(ElementType::kInt32, R::kSum, std::numeric_limits<std::int32_t>::max(), 1),
            std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(reduce_two<std::int64_t>(ElementType::kInt64, R::kProduct, std::int64_t{1} << 62, 4), 0);
  EXPECT_EQ(reduce_two<std::int64_t>(ElementType::kInt64, R::kMin, -5, 3), -5);
  EXPECT_EQ(reduce_two<std::int8_t>(ElementType::kInt8, R::kMax, -5, -3), -3);
  EXPECT_EQ(reduce_two<std::uint8_t>(ElementType::kUInt8, R::kMin, 200, 100), 100);
  // Bool: any non-zero byte is true, results are 0 or 1.
  EXPECT_EQ(reduce_two<std::uint8_t>(ElementType::kBool, R::kSum, 2, 0), 1);
  EXPECT_EQ(reduce_two<std::uint8_t>(ElementType::kBool, R::kMax, 0, 0), 0);
  EXPECT_EQ(reduce_two<std::uint8_t>(ElementType::kBool, R::kProduct, 2, 3), 1);
  EXPECT_EQ(reduce_two<std::uint8_t>(ElementType::kBool, R::kMin, 2, 0), 0);
  // Half precision: computed in float, rounded back to nearest even.
  const std::uint16_t h2048 = float_to_float16(2048), h1 = float_to_float16(1), h3 = float_to_float16(3);
  EXPECT_EQ(reduce_two<std::uint16_t>(ElementType::kFloat16, R::kSum, h2048, h1), h2048);  // 2049: a tie
  EXPECT_EQ(reduce_two<std::uint16_t>(ElementType::kFloat16, R::kSum, h2048, h3), float_to_float16(2052));
  EXPECT_EQ(reduce_two<std::uint16_t>(ElementType::kFloat16, R::kProduct, float_to_float16(256), float_to_float16(256)),
            0x7c00);  // overflows to infinity
  EXPECT_EQ(reduce_two<std::uint16_t>(ElementType::kBFloat16, R::kSum, float_to_bfloat16(256), float_to_bfloat16(1)),
            float_to_bfloat16(256));  // 257: a tie, to even
  // Min and max: a NaN on either side wins.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(reduce_two<float>(ElementType::kFloat32, R::kMin, nan, 1.0f)));
  EXPECT_TRUE(std::isnan(reduce_two<float>(ElementType::kFloat32, R::kMin, 1.0f, nan)));
  EXPECT_TRUE(std::isnan(reduce_two<double>(ElementType::kFloat64, R::kMax, 1.0, static_cast<double>(nan))));
  EXPECT_TRUE(std::isnan(float16_to_float(
      reduce_two<std::uint16_t>(ElementType::kFloat16, R::kMax, float_to_float16(nan), float_to_float16(1)))));
  EXPECT_EQ(reduce_two<double>(ElementType::kFloat64, R::kMax, -1.5, 2.5), 2.5);
}

// ---------------------------------------------------------------------------------------------
// reduce_all: every element type, reduction and world size

struct ReduceCase {
  ElementType type;
  ElementwiseReduction reduction;
  int ranks;
};

std::string name_of(const ReduceCase& c) {
  constexpr const char* reductions[kElementwiseReductionCount] = {"sum", "min", "max", "product"};
  return concat(element_type_name(c.type), "_", reductions[static_cast<int>(c.reduction)], "_", c.ranks, "_ranks");
}
void PrintTo(const ReduceCase& c, std::ostream* out) { *out << name_of(c); }

std::vector<ReduceCase> every_reduce_case() {
  std::vector<ReduceCase> cases;
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (ElementType type : kEveryType) {
      for (ElementwiseReduction reduction : kEveryReduction) cases.push_back({type, reduction, ranks});
    }
  }
  return cases;
}

class ReduceAll : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(ReduceAll, MatchesTheClosedFormBitIdenticallyOnEveryRank) {
  const ReduceCase c = GetParam();
  for (const std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{20011}}) {
    SCOPED_TRACE(concat(count, " elements"));
    std::vector<std::vector<std::byte>> results(static_cast<std::size_t>(c.ranks));
    run_ranks(c.ranks, [&](int rank, Transport& transport) {
      std::vector<std::byte> data = input_of(c.type, c.reduction, c.ranks, rank, count);
      reduce_all(transport, data, c.type, c.reduction, test_tag(count), long_timeout);
      results[static_cast<std::size_t>(rank)] = std::move(data);
    });
    const std::vector<std::byte> expected = expected_of(c.type, c.reduction, c.ranks, count);
    for (int rank = 0; rank < c.ranks; ++rank) {
      EXPECT_EQ(compare_elements(c.type, expected, results[static_cast<std::size_t>(rank)]), "") << "rank " << rank;
      EXPECT_TRUE(results[static_cast<std::size_t>(rank)] == results[0]) << "rank " << rank << " differs from rank 0";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TypedCollectives, ReduceAll, ::testing::ValuesIn(every_reduce_case()),
                         [](const ::testing::TestParamInfo<ReduceCase>& info) { return name_of(info.param); });

// Blocks of several segments (about 256 KiB each): 3 ranks, 300001 float64 (800 KB blocks) and
// 1000003 bfloat16 elements, so that segments flow through both ring halves.
TEST(TypedCollectivesSegments, LargeVectorsReduceExactly) {
  const ReduceCase cases[] = {{ElementType::kFloat64, ElementwiseReduction::kSum, 3},
                              {ElementType::kBFloat16, ElementwiseReduction::kMax, 3},
                              {ElementType::kInt8, ElementwiseReduction::kProduct, 4}};
  for (const ReduceCase& c : cases) {
    SCOPED_TRACE(name_of(c));
    const std::size_t count = c.type == ElementType::kFloat64 ? 300001 : 1000003;
    std::vector<std::vector<std::byte>> results(static_cast<std::size_t>(c.ranks));
    run_ranks(c.ranks, [&](int rank, Transport& transport) {
      std::vector<std::byte> data = input_of(c.type, c.reduction, c.ranks, rank, count);
      reduce_all(transport, data, c.type, c.reduction, test_tag(1), long_timeout);
      results[static_cast<std::size_t>(rank)] = std::move(data);
    });
    const std::vector<std::byte> expected = expected_of(c.type, c.reduction, c.ranks, count);
    for (int rank = 0; rank < c.ranks; ++rank) {
      EXPECT_EQ(compare_elements(c.type, expected, results[static_cast<std::size_t>(rank)]), "") << "rank " << rank;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// reduce_scatter

// Uneven block sizes per world size, with empty blocks.
std::vector<std::int64_t> uneven_counts(int ranks) {
  switch (ranks) {
    case 1: return {7};
    case 2: return {0, 20011};
    case 3: return {4, 0, 3001};
    default: return {3, 0, 1, 20011};
  }
}

TEST(TypedCollectivesReduceScatter, UnevenAndEmptyBlocksForEveryTypeAndReduction) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const std::vector<std::int64_t> counts = uneven_counts(ranks);
    std::size_t total = 0;
    for (std::int64_t count : counts) total += static_cast<std::size_t>(count);
    for (ElementType type : kEveryType) {
      for (ElementwiseReduction reduction : kEveryReduction) {
        SCOPED_TRACE(name_of({type, reduction, ranks}));
        const std::size_t size = element_size(type);
        std::vector<std::vector<std::byte>> outputs(static_cast<std::size_t>(ranks));
        run_ranks(ranks, [&](int rank, Transport& transport) {
          const std::vector<std::byte> input = input_of(type, reduction, ranks, rank, total);
          std::vector<std::byte> output(static_cast<std::size_t>(counts[static_cast<std::size_t>(rank)]) * size);
          reduce_scatter(transport, input, counts, output, type, reduction, test_tag(7), long_timeout);
          outputs[static_cast<std::size_t>(rank)] = std::move(output);
        });
        const std::vector<std::byte> expected = expected_of(type, reduction, ranks, total);
        std::size_t offset = 0;
        for (int rank = 0; rank < ranks; ++rank) {
          const std::size_t bytes = static_cast<std::size_t>(counts[static_cast<std::size_t>(rank)]) * size;
          const std::vector<std::byte> block(expected.begin() + static_cast<std::ptrdiff_t>(offset),
                                             expected.begin() + static_cast<std::ptrdiff_t>(offset + bytes));
          EXPECT_EQ(compare_elements(type, block, outputs[static_cast<std::size_t>(rank)]), "") << "rank " << rank;
          offset += bytes;
        }
      }
    }
  }
}

// reduce_scatter is reduce_all's first half: with reduce_all's blocks as counts it returns each
// rank's block of reduce_all's result bit for bit, even for sums that round.
TEST(TypedCollectivesReduceScatter, IsReduceAllsFirstHalfBitForBit) {
  for (int ranks = 2; ranks <= 4; ++ranks) {
    SCOPED_TRACE(concat(ranks, " ranks"));
    constexpr std::size_t n = 1001;
    std::vector<std::int64_t> counts;
    for (int b = 0; b < ranks; ++b) counts.push_back(static_cast<std::int64_t>(n / ranks + (static_cast<std::size_t>(b) < n % ranks)));
    std::vector<std::vector<float>> inputs(static_cast<std::size_t>(ranks));
    for (int rank = 0; rank < ranks; ++rank) {
      Random random(static_cast<std::uint64_t>(rank) + 11);
      for (std::size_t i = 0; i < n; ++i) inputs[static_cast<std::size_t>(rank)].push_back(static_cast<float>(random.normal() * 1e3));
    }
    std::vector<std::vector<float>> reduced(static_cast<std::size_t>(ranks)), scattered(static_cast<std::size_t>(ranks));
    run_ranks(ranks, [&](int rank, Transport& transport) {
      std::vector<float> all = inputs[static_cast<std::size_t>(rank)];
      reduce_all(transport, std::as_writable_bytes(std::span(all)), ElementType::kFloat32, ElementwiseReduction::kSum,
                 test_tag(1), long_timeout);
      std::vector<float> own(static_cast<std::size_t>(counts[static_cast<std::size_t>(rank)]));
      reduce_scatter(transport, std::as_bytes(std::span(inputs[static_cast<std::size_t>(rank)])), counts,
                     std::as_writable_bytes(std::span(own)), ElementType::kFloat32, ElementwiseReduction::kSum,
                     test_tag(2), long_timeout);
      reduced[static_cast<std::size_t>(rank)] = std::move(all);
      scattered[static_cast<std::size_t>(rank)] = std::move(own);
    });
    std::size_t offset = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      const std::vector<float>& own = scattered[static_cast<std::size_t>(rank)];
      EXPECT_EQ(std::memcmp(own.data(), reduced[0].data() + offset, own.size() * sizeof(float)), 0) << "rank " << rank;
      offset += own.size();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// gather_all, exchange_all, broadcast_bytes

std::byte pattern_byte(int a, int b, std::size_t k) { return static_cast<std::byte>((a * 59 + b * 13 + k * 7) & 0xff); }

TEST(TypedCollectivesGatherAll, ConcatenatesEveryRanksBytesIncludingEmptyOnes) {
  const std::vector<std::vector<std::size_t>> layouts = {{5}, {0, 3}, {4, 0, 700001}, {3, 0, 1, 6}, {0, 0, 0}};
  for (const std::vector<std::size_t>& byte_counts : layouts) {
    const int ranks = static_cast<int>(byte_counts.size());
    SCOPED_TRACE(concat(ranks, " ranks, rank 0 contributes ", byte_counts[0], " bytes"));
    std::vector<std::byte> expected;
    for (int rank = 0; rank < ranks; ++rank) {
      for (std::size_t k = 0; k < byte_counts[static_cast<std::size_t>(rank)]; ++k) expected.push_back(pattern_byte(rank, 0, k));
    }
    std::vector<std::vector<std::byte>> outputs(static_cast<std::size_t>(ranks));
    run_ranks(ranks, [&](int rank, Transport& transport) {
      std::vector<std::byte> own(byte_counts[static_cast<std::size_t>(rank)]);
      for (std::size_t k = 0; k < own.size(); ++k) own[k] = pattern_byte(rank, 0, k);
      std::vector<std::byte> output(expected.size(), std::byte{0xee});
      gather_all(transport, own, byte_counts, output, test_tag(3), long_timeout);
      outputs[static_cast<std::size_t>(rank)] = std::move(output);
    });
    for (int rank = 0; rank < ranks; ++rank) EXPECT_TRUE(outputs[static_cast<std::size_t>(rank)] == expected) << "rank " << rank;
  }
}

// Bytes rank `from` sends rank `to`: uneven, empty when (from + 2 to) % 4 == 0, and 600000 more
// from rank 0 to the last rank (several segments).
std::size_t part_bytes(int ranks, int from, int to) {
  return static_cast<std::size_t>((from + 2 * to) % 4) * 3 + (ranks > 1 && from == 0 && to == ranks - 1 ? 600000 : 0);
}

TEST(TypedCollectivesExchangeAll, UnevenAndEmptyPartsArriveInRankOrder) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    SCOPED_TRACE(concat(ranks, " ranks"));
    std::vector<std::vector<std::byte>> outputs(static_cast<std::size_t>(ranks));
    run_ranks(ranks, [&](int rank, Transport& transport) {
      std::vector<std::size_t> send_bytes, recv_bytes;
      std::vector<std::byte> input;
      for (int peer = 0; peer < ranks; ++peer) {
        send_bytes.push_back(part_bytes(ranks, rank, peer));
        recv_bytes.push_back(part_bytes(ranks, peer, rank));
        for (std::size_t k = 0; k < send_bytes.back(); ++k) input.push_back(pattern_byte(rank, peer, k));
      }
      std::vector<std::byte> output(std::accumulate(recv_bytes.begin(), recv_bytes.end(), std::size_t{0}), std::byte{0xee});
      exchange_all(transport, input, send_bytes, output, recv_bytes, test_tag(4), long_timeout);
      outputs[static_cast<std::size_t>(rank)] = std::move(output);
    });
    for (int rank = 0; rank < ranks; ++rank) {
      std::vector<std::byte> expected;
      for (int peer = 0; peer < ranks; ++peer) {
        for (std::size_t k = 0; k < part_bytes(ranks, peer, rank); ++k) expected.push_back(pattern_byte(peer, rank, k));
      }
      EXPECT_TRUE(outputs[static_cast<std::size_t>(rank)] == expected) << "rank " << rank;
    }
  }
}

TEST(TypedCollectivesBroadcast, FromEveryRoot) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (int root = 0; root < ranks; ++root) {
      for (const std::size_t bytes : {std::size_t{0}, std::size_t{1001}, std::size_t{700001}}) {
        SCOPED_TRACE(concat(ranks, " ranks, root ", root, ", ", bytes, " bytes"));
        std::vector<std::byte> expected(bytes);
        for (std::size_t k = 0; k < bytes; ++k) expected[k] = pattern_byte(root, 1, k);
        std::vector<std::vector<std::byte>> outputs(static_cast<std::size_t>(ranks));
        run_ranks(ranks, [&](int rank, Transport& transport) {
          std::vector<std::byte> data = rank == root ? expected : std::vector<std::byte>(bytes, std::byte{0xee});
          broadcast_bytes(transport, data, root, test_tag(5), long_timeout);
          outputs[static_cast<std::size_t>(rank)] = std::move(data);
        });
        for (int rank = 0; rank < ranks; ++rank) EXPECT_TRUE(outputs[static_cast<std::size_t>(rank)] == expected) << "rank " << rank;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Size disagreements and argument checks

// Runs body on every rank of a world and returns each rank's exception text ("" if none). A rank
// that throws reports the failure, so that its peers stop waiting (PeerFailedError).
std::vector<std::string> errors_of(int ranks, const std::function<void(int rank, Transport& transport)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(ranks));
  std::mutex mutex;
  run_ranks(ranks, [&](int rank, Transport& transport) {
    try {
      body(rank, transport);
    } catch (const UsageError& error) {
      std::lock_guard lock(mutex);
      errors[static_cast<std::size_t>(rank)] = concat("UsageError: ", error.what());
      transport.report_failure(error.what());
    } catch (const std::exception& error) {
      std::lock_guard lock(mutex);
      errors[static_cast<std::size_t>(rank)] = concat("other: ", error.what());
      transport.report_failure(error.what());
    }
  });
  return errors;
}

// Rank 0 sends rank 1 four bytes, rank 1 expects three: both ranks of the pair say so, before any
// data is used; rank 2, whose parts agree, finishes or fails only because they did.
TEST(TypedCollectivesExchangeAll, DisagreeingSizesAreAUsageErrorOnBothRanksOfThePair) {
  const std::vector<std::string> errors = errors_of(3, [](int rank, Transport& transport) {
    std::vector<std::size_t> send_bytes = {2, 2, 2}, recv_bytes = {2, 2, 2};
    if (rank == 0) send_bytes[1] = 4;
    if (rank == 1) recv_bytes[0] = 3;
    std::vector<std::byte> input(std::accumulate(send_bytes.begin(), send_bytes.end(), std::size_t{0}));
    std::vector<std::byte> output(std::accumulate(recv_bytes.begin(), recv_bytes.end(), std::size_t{0}));
    exchange_all(transport, input, send_bytes, output, recv_bytes, test_tag(6), long_timeout);
  });
  const std::string expected = "UsageError: exchange_all: rank 0 sends 4 bytes to rank 1, which expects 3";
  EXPECT_EQ(errors[0], expected);
  EXPECT_EQ(errors[1], expected);
  EXPECT_FALSE(contains(errors[2], "UsageError")) << errors[2];
}

TEST(TypedCollectivesBroadcast, ASizeMismatchIsAUsageErrorNamingTheRankAndTheRoot) {
  for (int ranks = 2; ranks <= 4; ++ranks) {
    SCOPED_TRACE(concat(ranks, " ranks"));
    const int root = ranks - 1, odd = (root + 1) % ranks;  // rank `odd` is a child of the root
    try {
      run_ranks(ranks, [&](int rank, Transport& transport) {
        std::vector<std::byte> data(rank == odd ? 6 : 8);
        broadcast_bytes(transport, data, root, test_tag(8), long_timeout);
      });
      ADD_FAILURE() << "no error";
    } catch (const UsageError& error) {
      EXPECT_EQ(std::string(error.what()), concat("broadcast_bytes: rank ", odd, " has 6 bytes, its parent rank ", root,
                                                  " has 8 (root ", root, ")"));
    }
  }
}

TEST(TypedCollectivesArguments, AreCheckedBeforeAnyMessage) {
  LocalFabric fabric(3);
  Transport& transport = fabric.endpoint(1);
  auto expect_usage = [](const std::function<void()>& call, const std::string& message) {
    try {
      call();
      ADD_FAILURE() << "no error, expected: " << message;
    } catch (const UsageError& error) {
      EXPECT_EQ(std::string(error.what()), message);
    }
  };
  std::vector<std::byte> ten(10), twelve(12), four(4), none;
  const ElementType i32 = ElementType::kInt32;
  const ElementwiseReduction sum = ElementwiseReduction::kSum;
  expect_usage([&] { reduce_all(transport, ten, i32, sum, 0, long_timeout); },
               "reduce_all: the data of 10 bytes is not a whole number of int32 elements (4 bytes each)");
  expect_usage([&] { reduce_all(transport, twelve, static_cast<ElementType>(12), sum, 0, long_timeout); },
               "element type 12 is not one of the 10 known");
  expect_usage([&] { reduce_all(transport, twelve, i32, static_cast<ElementwiseReduction>(9), 0, long_timeout); },
               "reduction 9 is not sum, min, max or product");

  const std::vector<std::int64_t> two_counts = {1, 2}, negative = {4, -1, 0}, short_sum = {1, 1, 0}, fine = {1, 1, 1};
  expect_usage([&] { reduce_scatter(transport, twelve, two_counts, four, i32, sum, 0, long_timeout); },
               "reduce_scatter: 2 counts for 3 ranks");
  expect_usage([&] { reduce_scatter(transport, twelve, negative, four, i32, sum, 0, long_timeout); },
               "reduce_scatter: the count of rank 1 is negative (-1)");
  expect_usage([&] { reduce_scatter(transport, twelve, short_sum, four, i32, sum, 0, long_timeout); },
               "reduce_scatter: the counts sum to 2 elements, the input holds 3 int32 elements");
  expect_usage([&] { reduce_scatter(transport, twelve, fine, none, i32, sum, 0, long_timeout); },
               "reduce_scatter: the output of rank 1 holds 0 bytes, its block is 1 int32 elements");
  expect_usage([&] { reduce_scatter(transport, ten, fine, four, i32, sum, 0, long_timeout); },
               "reduce_scatter: the input of 10 bytes is not a whole number of int32 elements (4 bytes each)");

  const std::vector<std::size_t> two_sizes = {4, 4}, sizes = {4, 4, 4}, other_sizes = {4, 4, 2}, self_differs = {4, 0, 8};
  expect_usage([&] { gather_all(transport, four, two_sizes, twelve, 0, long_timeout); },
               "gather_all: 2 byte counts for 3 ranks");
  expect_usage([&] { gather_all(transport, ten, sizes, twelve, 0, long_timeout); },
               "gather_all: rank 1 contributes 10 bytes, its byte count is 4");
  expect_usage([&] { gather_all(transport, four, sizes, ten, 0, long_timeout); },
               "gather_all: the output holds 10 bytes, the byte counts sum to 12");

  expect_usage([&] { exchange_all(transport, twelve, two_sizes, twelve, sizes, 0, long_timeout); },
               "exchange_all: 2 send sizes and 3 receive sizes for 3 ranks");
  expect_usage([&] { exchange_all(transport, ten, sizes, twelve, sizes, 0, long_timeout); },
               "exchange_all: the send sizes sum to 12 bytes, the input holds 10");
  expect_usage([&] { exchange_all(transport, twelve, sizes, twelve, other_sizes, 0, long_timeout); },
               "exchange_all: the receive sizes sum to 10 bytes, the output holds 12");
  expect_usage([&] { exchange_all(transport, twelve, sizes, twelve, self_differs, 0, long_timeout); },
               "exchange_all: rank 1 sends 4 bytes to itself but expects 0");

  expect_usage([&] { broadcast_bytes(transport, four, 3, 0, long_timeout); }, "broadcast_bytes: root 3 is not a rank of 3");
  expect_usage([&] { broadcast_bytes(transport, four, -1, 0, long_timeout); }, "broadcast_bytes: root -1 is not a rank of 3");
}

// ---------------------------------------------------------------------------------------------
// RankGroupTransport

TEST(RankGroupTransport, RenumbersItsRanksAndForwardsToTheInnerOnes) {
  LocalFabric fabric(4);
  RankGroupTransport on_two(fabric.endpoint(2), {2, 0});
  RankGroupTransport on_zero(fabric.endpoint(0), {2, 0});
  EXPECT_EQ(on_two.rank(), 0);
  EXPECT_EQ(on_zero.rank(), 1);
  EXPECT_EQ(on_two.size(), 2);
  EXPECT_EQ(on_two.ranks(), (std::vector<int>{2, 0}));
  EXPECT_TRUE(contains(on_two.describe(), fabric.endpoint(2).describe() + ", ranks 2, 0")) << on_two.describe();
  EXPECT_EQ(on_two.waits_sleep(), fabric.endpoint(2).waits_sleep());

  // Group rank 0 (inner 2) to group rank 1 (inner 0), received on the inner endpoint from inner rank 2.
  const std::vector<std::byte> hello = {std::byte{1}, std::byte{2}, std::byte{3}};
  std::vector<std::byte> received(3);
  const std::uint64_t sent_before = fabric.endpoint(2).bytes_sent();
  Request send = on_two.send(1, 9, hello, "group test");
  fabric.endpoint(0).recv(2, 9, received, "group test").wait(long_timeout);
  send.wait(long_timeout);
  EXPECT_EQ(received, hello);
  EXPECT_EQ(on_two.bytes_sent(), sent_before + 3);
  // And back: inner rank 0 to inner rank 2, received by the group from its peer 1.
  std::vector<std::byte> back(3);
  Request reply = fabric.endpoint(0).send(2, 10, hello, "group test");
  on_two.recv(1, 10, back, "group test").wait(long_timeout);
  reply.wait(long_timeout);
  EXPECT_EQ(back, hello);

  EXPECT_THROW(on_two.send(2, 0, hello, "group test"), UsageError);
  EXPECT_THROW(on_two.recv(-1, 0, back, "group test"), UsageError);
}

TEST(RankGroupTransport, RejectsEmptyDuplicateOrOutOfRangeListsAndOnesWithoutThisRank) {
  LocalFabric fabric(4);
  Transport& inner = fabric.endpoint(1);
  auto error_of = [&](std::vector<int> ranks) -> std::string {
    try {
      RankGroupTransport group(inner, std::move(ranks));
    } catch (const UsageError& error) {
      return error.what();
    }
    return "no error";
  };
  EXPECT_EQ(error_of({}), "rank group: no ranks (of 4)");
  EXPECT_EQ(error_of({1, 3, 1}), "rank group 1, 3, 1: rank 1 appears twice");
  EXPECT_EQ(error_of({1, 4}), "rank group 1, 4: rank 4 is outside [0, 4)");
  EXPECT_EQ(error_of({-1, 1}), "rank group -1, 1: rank -1 is outside [0, 4)");
  EXPECT_EQ(error_of({1, 2, 3, 4}), "rank group 1..4: rank 4 is outside [0, 4)");
  EXPECT_EQ(error_of({0, 2, 3}), "rank group 0, 2, 3: does not hold this rank (1 of 4)");
  EXPECT_EQ(error_of({3, 1}), "no error");
}

// RankSubsetTransport is the identity group of the first ranks.
TEST(RankGroupTransport, FirstRanksIsTheIdentityGroup) {
  LocalFabric fabric(4);
  RankSubsetTransport first = first_ranks(fabric.endpoint(2), 3);
  EXPECT_EQ(first.rank(), 2);
  EXPECT_EQ(first.size(), 3);
  EXPECT_EQ(first.ranks(), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(contains(first.describe(), ", ranks 0..2")) << first.describe();
  try {
    first_ranks(fabric.endpoint(3), 3);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& error) {
    EXPECT_EQ(std::string(error.what()), "rank subset of 3 ranks: invalid for rank 3 of 4");
  }
}

// Process sets: in a 4-rank world, ranks {2, 0} run reduce_all as group ranks 0 and 1 while ranks
// {1, 3} run gather_all and broadcast_bytes on their own group, all with the same tag; the groups
// do not involve each other's ranks.
TEST(RankGroupTransport, DisjointGroupsRunTheirOwnCollectivesAtOnce) {
  constexpr std::size_t n = 20011;
  std::vector<std::vector<std::int64_t>> sums(4);
  std::vector<std::vector<std::byte>> gathered(4), broadcast(4);
  run_ranks(4, [&](int rank, Transport& transport) {
    const Tag tag = test_tag(42);
    if (rank == 0 || rank == 2) {
      RankGroupTransport group(transport, {2, 0});
      std::vector<std::int64_t> data(n);
      for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<std::int64_t>(i) * (group.rank() == 0 ? 3 : -1000) + 7;
      reduce_all(group, std::as_writable_bytes(std::span(data)), ElementType::kInt64, ElementwiseReduction::kSum, tag,
                 long_timeout);
      sums[static_cast<std::size_t>(rank)] = std::move(data);
    } else {
      RankGroupTransport group(transport, {1, 3});
      const std::vector<std::byte> own(static_cast<std::size_t>(group.rank()) * 5 + 1, static_cast<std::byte>(rank));
      const std::vector<std::size_t> byte_counts = {1, 6};
      std::vector<std::byte> output(7);
      gather_all(group, own, byte_counts, output, tag, long_timeout);
      gathered[static_cast<std::size_t>(rank)] = std::move(output);
      std::vector<std::byte> data(100, static_cast<std::byte>(rank));
      broadcast_bytes(group, data, 1, tag + 1, long_timeout);  // group rank 1: inner rank 3
      broadcast[static_cast<std::size_t>(rank)] = std::move(data);
    }
  });
  for (const int rank : {0, 2}) {
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(sums[static_cast<std::size_t>(rank)][i], static_cast<std::int64_t>(i) * -997 + 14) << "rank " << rank << " element " << i;
    }
  }
  std::vector<std::byte> expected_gather(1, std::byte{1});
  expected_gather.insert(expected_gather.end(), 6, std::byte{3});
  for (const int rank : {1, 3}) {
    EXPECT_EQ(gathered[static_cast<std::size_t>(rank)], expected_gather) << "rank " << rank;
    EXPECT_EQ(broadcast[static_cast<std::size_t>(rank)], std::vector<std::byte>(100, std::byte{3})) << "rank " << rank;
  }
}

// ---------------------------------------------------------------------------------------------
// Across processes: the same collectives over SharedMemoryTransport (3 forked ranks). Children check
// their own results and report a mismatch as their error.

void check(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

TEST(TypedCollectivesForked, EveryCollectiveOverSharedMemory) {
  constexpr int ranks = 3;
  ForkedWorld world(ranks);
  const std::vector<std::string> errors = world.run([](SharedMemoryTransport& transport, std::span<std::byte>) {
    const int rank = transport.rank();
    std::uint64_t sequence = 0;
    const ReduceCase cases[] = {{ElementType::kFloat16, ElementwiseReduction::kSum, ranks},
                                {ElementType::kBFloat16, ElementwiseReduction::kMin, ranks},
                                {ElementType::kInt8, ElementwiseReduction::kProduct, ranks},
                                {ElementType::kUInt8, ElementwiseReduction::kMax, ranks},
                                {ElementType::kFloat64, ElementwiseReduction::kProduct, ranks},
                                {ElementType::kBool, ElementwiseReduction::kSum, ranks}};
    for (const ReduceCase& c : cases) {
      std::vector<std::byte> data = input_of(c.type, c.reduction, ranks, rank, 20011);
      reduce_all(transport, data, c.type, c.reduction, test_tag(++sequence), long_timeout);
      const std::string difference = compare_elements(c.type, expected_of(c.type, c.reduction, ranks, 20011), data);
      check(difference.empty(), concat("reduce_all ", name_of(c), ": ", difference));

      const std::vector<std::int64_t> counts = uneven_counts(ranks);
      const std::vector<std::byte> input = input_of(c.type, c.reduction, ranks, rank, 3005);
      std::vector<std::byte> output(static_cast<std::size_t>(counts[static_cast<std::size_t>(rank)]) * element_size(c.type));
      reduce_scatter(transport, input, counts, output, c.type, c.reduction, test_tag(++sequence), long_timeout);
      const std::vector<std::byte> all = expected_of(c.type, c.reduction, ranks, 3005);
      const std::size_t offset = rank == 0 ? 0 : static_cast<std::size_t>(counts[0] + (rank == 2 ? counts[1] : 0)) * element_size(c.type);
      const std::vector<std::byte> block(all.begin() + static_cast<std::ptrdiff_t>(offset),
                                         all.begin() + static_cast<std::ptrdiff_t>(offset + output.size()));
      check(compare_elements(c.type, block, output).empty(), concat("reduce_scatter ", name_of(c)));
    }

    const std::vector<std::size_t> byte_counts = {4, 0, 300001};
    std::vector<std::byte> own(byte_counts[static_cast<std::size_t>(rank)]);
    for (std::size_t k = 0; k < own.size(); ++k) own[k] = pattern_byte(rank, 0, k);
    std::vector<std::byte> gathered(300005);
    gather_all(transport, own, byte_counts, gathered, test_tag(++sequence), long_timeout);
    for (std::size_t k = 0; k < gathered.size(); ++k) {
      check(gathered[k] == (k < 4 ? pattern_byte(0, 0, k) : pattern_byte(2, 0, k - 4)), concat("gather_all byte ", k));
    }

    std::vector<std::size_t> send_bytes, recv_bytes;
    std::vector<std::byte> input;
    for (int peer = 0; peer < ranks; ++peer) {
      send_bytes.push_back(part_bytes(ranks, rank, peer));
      recv_bytes.push_back(part_bytes(ranks, peer, rank));
      for (std::size_t k = 0; k < send_bytes.back(); ++k) input.push_back(pattern_byte(rank, peer, k));
    }
    std::vector<std::byte> output(std::accumulate(recv_bytes.begin(), recv_bytes.end(), std::size_t{0}));
    exchange_all(transport, input, send_bytes, output, recv_bytes, test_tag(++sequence), long_timeout);
    std::size_t at = 0;
    for (int peer = 0; peer < ranks; ++peer) {
      for (std::size_t k = 0; k < recv_bytes[static_cast<std::size_t>(peer)]; ++k) {
        check(output[at++] == pattern_byte(peer, rank, k), concat("exchange_all from rank ", peer, " byte ", k));
      }
    }

    for (int root = 0; root < ranks; ++root) {
      std::vector<std::byte> data(70001, std::byte{0xee});
      if (rank == root) for (std::size_t k = 0; k < data.size(); ++k) data[k] = pattern_byte(root, 1, k);
      broadcast_bytes(transport, data, root, test_tag(++sequence), long_timeout);
      for (std::size_t k = 0; k < data.size(); ++k) check(data[k] == pattern_byte(root, 1, k), concat("broadcast from ", root));
    }
  });
  for (int rank = 0; rank < ranks; ++rank) EXPECT_EQ(errors[static_cast<std::size_t>(rank)], "") << "rank " << rank;
}

}  // namespace
}  // namespace pipesgd
