#include "pipesgd/collective/typed_collectives.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {

// ---------------------------------------------------------------------------------------------
// Element types and half-precision conversions

namespace {

void check_type(ElementType type) {
  if (static_cast<int>(type) >= kElementTypeCount) {
    throw UsageError(concat("element type ", static_cast<int>(type), " is not one of the ", kElementTypeCount, " known"));
  }
}

void check_reduction(ElementwiseReduction reduction) {
  if (static_cast<int>(reduction) >= kElementwiseReductionCount) {
    throw UsageError(concat("reduction ", static_cast<int>(reduction), " is not sum, min, max or product"));
  }
}

}  // namespace

std::size_t element_size(ElementType type) {
  check_type(type);
  constexpr std::size_t sizes[kElementTypeCount] = {1, 1, 2, 4, 8, 2, 2, 4, 8, 1};
  return sizes[static_cast<int>(type)];
}

const char* element_type_name(ElementType type) {
  check_type(type);
  constexpr const char* names[kElementTypeCount] = {"uint8",   "int8",     "int16",   "int32",   "int64",
                                                    "float16", "bfloat16", "float32", "float64", "bool"};
  return names[static_cast<int>(type)];
}

float float16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return std::bit_cast<float>(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

std::uint16_t float_to_float16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet, the payload's upper bits kept
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  // 65520 (half-way between 65504, the largest half, and 2^16) and above round to infinity.
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal half (or zero), in units of 2^-24
    if (magnitude < 0x33000000u) return sign;  // below 2^-25, half the smallest subnormal: zero
    const std::uint32_t exponent = magnitude >> 23;                      // 102..112
    const std::uint32_t significand = (magnitude & 0x7fffffu) | 0x800000u;  // value = significand * 2^(e-150)
    const std::uint32_t shift = 126 - exponent;                          // 14..24
    std::uint32_t half = significand >> shift;
    const std::uint32_t remainder = significand & ((1u << shift) - 1);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1u))) ++half;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | half);
  }
  // Normal: rebias the exponent, keep 10 mantissa bits, round the 13 dropped ones to nearest even
  // (a carry may reach the next binade, or infinity from just below 65520: both correct).
  std::uint32_t half = (magnitude >> 13) - ((127 - 15) << 10);
  const std::uint32_t remainder = magnitude & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

float bfloat16_to_float(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

std::uint16_t float_to_bfloat16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);  // ties to even; overflow reaches infinity
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

// ---------------------------------------------------------------------------------------------
// Element-wise kernels

namespace {

// out[i] = left[i] <reduction> right[i] for `count` elements; `out` may be `left` or `right` itself.
using Kernel = void (*)(const std::byte* left, const std::byte* right, std::byte* out, std::size_t count);

enum class Arithmetic { kInteger, kFloating, kFloat16, kBFloat16, kBool };

template <ElementwiseReduction reduction, typename Float>
Float apply_floating(Float a, Float b) {
  if constexpr (reduction == ElementwiseReduction::kSum) {
    return a + b;
  } else if constexpr (reduction == ElementwiseReduction::kProduct) {
    return a * b;
  } else if constexpr (reduction == ElementwiseReduction::kMin) {
    return (a < b || a != a) ? a : b;  // a NaN on either side wins
  } else {
    return (a > b || a != a) ? a : b;
  }
}

template <ElementwiseReduction reduction, typename Integer>
Integer apply_integer(Integer a, Integer b) {
  // Sum and product in the unsigned type (at least unsigned int: no promotion to a signed int that
  // could overflow), wrapping; converted back modulo 2^bits.
  using Unsigned = std::make_unsigned_t<Integer>;
  using Wide = std::conditional_t<(sizeof(Unsigned) < sizeof(unsigned)), unsigned, Unsigned>;
  const Wide x = static_cast<Unsigned>(a), y = static_cast<Unsigned>(b);
  if constexpr (reduction == ElementwiseReduction::kSum) {
    return static_cast<Integer>(static_cast<Unsigned>(x + y));
  } else if constexpr (reduction == ElementwiseReduction::kProduct) {
    return static_cast<Integer>(static_cast<Unsigned>(x * y));
  } else if constexpr (reduction == ElementwiseReduction::kMin) {
    return std::min(a, b);
  } else {
    return std::max(a, b);
  }
}

template <typename Storage, Arithmetic arithmetic, ElementwiseReduction reduction>
Storage apply(Storage a, Storage b) {
  if constexpr (arithmetic == Arithmetic::kInteger) {
    return apply_integer<reduction>(a, b);
  } else if constexpr (arithmetic == Arithmetic::kFloating) {
    return apply_floating<reduction>(a, b);
  } else if constexpr (arithmetic == Arithmetic::kFloat16) {
    return float_to_float16(apply_floating<reduction>(float16_to_float(a), float16_to_float(b)));
  } else if constexpr (arithmetic == Arithmetic::kBFloat16) {
    return float_to_bfloat16(apply_floating<reduction>(bfloat16_to_float(a), bfloat16_to_float(b)));
  } else {
    const bool x = a != 0, y = b != 0;
    const bool both = reduction == ElementwiseReduction::kProduct || reduction == ElementwiseReduction::kMin;
    return static_cast<Storage>(both ? (x && y) : (x || y));
  }
}

template <typename Storage, Arithmetic arithmetic, ElementwiseReduction reduction>
void combine(const std::byte* left, const std::byte* right, std::byte* out, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    Storage a, b;  // unaligned loads and stores: the caller's bytes may sit anywhere
    std::memcpy(&a, left + i * sizeof(Storage), sizeof(Storage));
    std::memcpy(&b, right + i * sizeof(Storage), sizeof(Storage));
    const Storage result = apply<Storage, arithmetic, reduction>(a, b);
    std::memcpy(out + i * sizeof(Storage), &result, sizeof(Storage));
  }
}

template <typename Storage, Arithmetic arithmetic>
Kernel kernel_for(ElementwiseReduction reduction) {
  switch (reduction) {
    case ElementwiseReduction::kSum: return &combine<Storage, arithmetic, ElementwiseReduction::kSum>;
    case ElementwiseReduction::kMin: return &combine<Storage, arithmetic, ElementwiseReduction::kMin>;
    case ElementwiseReduction::kMax: return &combine<Storage, arithmetic, ElementwiseReduction::kMax>;
    case ElementwiseReduction::kProduct: return &combine<Storage, arithmetic, ElementwiseReduction::kProduct>;
  }
  check_reduction(reduction);
  return nullptr;
}

Kernel kernel_for(ElementType type, ElementwiseReduction reduction) {
  switch (type) {
    case ElementType::kUInt8: return kernel_for<std::uint8_t, Arithmetic::kInteger>(reduction);
    case ElementType::kInt8: return kernel_for<std::int8_t, Arithmetic::kInteger>(reduction);
    case ElementType::kInt16: return kernel_for<std::int16_t, Arithmetic::kInteger>(reduction);
    case ElementType::kInt32: return kernel_for<std::int32_t, Arithmetic::kInteger>(reduction);
    case ElementType::kInt64: return kernel_for<std::int64_t, Arithmetic::kInteger>(reduction);
    case ElementType::kFloat16: return kernel_for<std::uint16_t, Arithmetic::kFloat16>(reduction);
    case ElementType::kBFloat16: return kernel_for<std::uint16_t, Arithmetic::kBFloat16>(reduction);
    case ElementType::kFloat32: return kernel_for<float, Arithmetic::kFloating>(reduction);
    case ElementType::kFloat64: return kernel_for<double, Arithmetic::kFloating>(reduction);
    case ElementType::kBool: return kernel_for<std::uint8_t, Arithmetic::kBool>(reduction);
  }
  check_type(type);
  return nullptr;
}

}  // namespace

void reduce_elements(std::span<std::byte> accumulator, std::span<const std::byte> operand, ElementType type,
                     ElementwiseReduction reduction) {
  const std::size_t size = element_size(type);
  PIPESGD_ASSERT(accumulator.size() == operand.size() && accumulator.size() % size == 0);
  kernel_for(type, reduction)(accumulator.data(), operand.data(), accumulator.data(), accumulator.size() / size);
}

// ---------------------------------------------------------------------------------------------
// Messages

namespace {

constexpr std::size_t kSegmentTargetBytes = 256 * 1024;
constexpr std::size_t kMaxSegments = 4096;  // the tag layout's segment field
constexpr int kMaxRingRanks = 2049;         // 2 (p - 1) ring steps within the tag layout's 4096

// A message stream of `bytes` bytes cut into segments of a whole number of `unit`-byte elements:
// about kSegmentTargetBytes each, at most kMaxSegments, the last one possibly shorter. Both ends of
// a stream derive the same segmenting from its size.
struct Segments {
  Segments(std::size_t bytes_, std::size_t unit, std::size_t minimum_count) : bytes(bytes_) {
    const std::size_t elements = bytes / unit;
    std::size_t per_segment = std::max<std::size_t>(1, kSegmentTargetBytes / unit);
    per_segment = std::max(per_segment, (elements + kMaxSegments - 1) / kMaxSegments);
    segment_bytes = per_segment * unit;
    count = std::max(minimum_count, (elements + per_segment - 1) / per_segment);
  }
  // Segment j of the stream's bytes `whole` (whole.size() == bytes).
  template <typename Byte>
  std::span<Byte> of(std::span<Byte> whole, std::size_t j) const {
    const std::size_t begin = std::min(bytes, j * segment_bytes);
    return whole.subspan(begin, std::min(bytes, begin + segment_bytes) - begin);
  }
  std::size_t bytes;
  std::size_t segment_bytes;
  std::size_t count;
};

// The p blocks of a ring collective's vector: block b is bytes [offset[b], offset[b] + size[b]).
struct Blocks {
  std::vector<std::size_t> offset;
  std::vector<std::size_t> size;
  std::size_t largest = 0;
  std::size_t total = 0;

  void add(std::size_t bytes) {
    offset.push_back(total);
    size.push_back(bytes);
    total += bytes;
    largest = std::max(largest, bytes);
  }
  template <typename Byte>
  std::span<Byte> of(std::span<Byte> vector, int block) const {
    return vector.subspan(offset[static_cast<std::size_t>(block)], size[static_cast<std::size_t>(block)]);
  }
};

// A ring over every rank of a transport: rank r sends to r + 1 and receives from r - 1.
struct Ring {
  Ring(Transport& transport_, Tag tag_, Timeout timeout_, const char* operation_)
      : transport(transport_),
        p(transport_.size()),
        rank(transport_.rank()),
        right((rank + 1) % p),
        left((rank + p - 1) % p),
        tag(tag_),
        timeout(timeout_),
        operation(operation_) {}
  int wrap(int block) const { return ((block % p) + p) % p; }
  // UsageError unless a message from the left has the size this rank expects.
  void expect_bytes(std::size_t got, std::size_t expected, int block) const {
    if (got != expected) {
      throw UsageError(concat(operation, ": rank ", left, " sent ", got, " bytes of block ", block, " to rank ", rank,
                              ", which expected ", expected, " (the ranks disagree on the sizes or the element type)"));
    }
  }

  Transport& transport;
  int p, rank, right, left;
  Tag tag;
  Timeout timeout;
  const char* operation;
};

// The requests of a ring's pipelined steps, [step parity][segment], sized for the largest block's
// segments; withdrawn on unwinding.
struct ParityRequests {
  ParityRequests(const Blocks& blocks, std::size_t unit) {
    std::size_t most_segments = 1;
    for (std::size_t bytes : blocks.size) most_segments = std::max(most_segments, Segments(bytes, unit, 1).count);
    for (int parity = 0; parity < 2; ++parity) {
      receives[parity].resize(most_segments);
      sends[parity].resize(most_segments);
    }
  }
  std::vector<Request> receives[2], sends[2];
};

// The reduce-scatter half of the ring (steps 0..p-2). At step s rank r sends the partial reduction
// of block r-1-s to its right (at s = 0 its own block from `source`) and combines what its left
// sends, block r-2-s, with its own block of `source`: target(s, block) = message <reduction> own.
// So block c is reduced along the ring from rank c+1 to rank c, in that fixed order, and after step
// p-2 rank r holds block r reduced over every rank in target(p-2, r). target(s, c) has
// blocks.size[c] bytes and may be c's own block of `source` itself (in place); it is sent at step s+1
// and must stay untouched until then. `unit` is the element size, `combine` the kernel.
template <typename Target>
void ring_reduce_scatter(const Ring& ring, std::span<const std::byte> source, const Blocks& blocks, std::size_t unit,
                         Kernel combine, Target target) {
  const int p = ring.p;
  std::vector<std::byte> receive_buffers[2];  // steps alternate: step s+1's posted while step s's are read
  for (auto& buffer : receive_buffers) buffer.resize(blocks.largest);
  ParityRequests requests(blocks, unit);
  auto& receives = requests.receives;
  auto& sends = requests.sends;
  auto post_receives = [&](int s) {
    const int block = ring.wrap(ring.rank - 2 - s);
    const Segments segments(blocks.size[static_cast<std::size_t>(block)], unit, 1);
    const std::span<std::byte> buffer(receive_buffers[s % 2].data(), segments.bytes);
    for (std::size_t j = 0; j < segments.count; ++j) {  // read once, by the combine: may be lent
      receives[s % 2][j] = ring.transport.recv_in_place(ring.left, step_tag(ring.tag, s, j), segments.of(buffer, j),
                                                        ring.operation);
    }
  };
  post_receives(0);
  {
    const int block = ring.wrap(ring.rank - 1);
    const Segments segments(blocks.size[static_cast<std::size_t>(block)], unit, 1);
    const std::span<const std::byte> own = blocks.of(source, block);
    for (std::size_t j = 0; j < segments.count; ++j) {
      sends[0][j] = ring.transport.send(ring.right, step_tag(ring.tag, 0, j), segments.of(own, j), ring.operation);
    }
  }
  for (int s = 0; s <= p - 2; ++s) {
    if (s < p - 2) post_receives(s + 1);
    const int block = ring.wrap(ring.rank - 2 - s);
    const Segments segments(blocks.size[static_cast<std::size_t>(block)], unit, 1);
    const std::span<const std::byte> own = blocks.of(source, block);
    const std::span<std::byte> result = target(s, block);
    const std::span<const std::byte> buffer(receive_buffers[s % 2].data(), segments.bytes);
    for (std::size_t j = 0; j < segments.count; ++j) {
      Request& receive = receives[s % 2][j];
      const std::span<const std::byte> expected = segments.of(buffer, j);
      const std::span<const std::byte> message = receive.wait_in_place(ring.timeout, expected);
      ring.expect_bytes(message.size(), expected.size(), block);
      const std::span<std::byte> out = segments.of(result, j);
      combine(message.data(), segments.of(own, j).data(), out.data(), out.size() / unit);
      receive = Request();  // the sender's bytes, if lent, go back at once
      if (s < p - 2) {
        sends[(s + 1) % 2][j] = ring.transport.send(ring.right, step_tag(ring.tag, s + 1, j), out, ring.operation);
      }
    }
    const int sent = ring.wrap(ring.rank - 1 - s);
    const std::size_t sent_segments = Segments(blocks.size[static_cast<std::size_t>(sent)], unit, 1).count;
    for (std::size_t j = 0; j < sent_segments; ++j) sends[s % 2][j].wait(ring.timeout);
  }
}

// The allgather ring over `vector` whose block r this rank already holds, steps first_step..
// first_step+p-2: at step t rank r sends block r-t to its right and receives block r-1-t from its
// left straight into `vector`, forwarding each segment at step t+1 as soon as it arrived.
void ring_allgather(const Ring& ring, std::span<std::byte> vector, const Blocks& blocks, std::size_t unit,
                    int first_step) {
  const int p = ring.p;
  ParityRequests requests(blocks, unit);
  auto& receives = requests.receives;
  auto& sends = requests.sends;
  auto post_receives = [&](int t) {
    const int block = ring.wrap(ring.rank - 1 - t);
    const Segments segments(blocks.size[static_cast<std::size_t>(block)], unit, 1);
    const std::span<std::byte> into = blocks.of(vector, block);
    for (std::size_t j = 0; j < segments.count; ++j) {
      receives[t % 2][j] = ring.transport.recv(ring.left, step_tag(ring.tag, first_step + t, j), segments.of(into, j),
                                               ring.operation);
    }
  };
  post_receives(0);
  {
    const Segments segments(blocks.size[static_cast<std::size_t>(ring.rank)], unit, 1);
    const std::span<const std::byte> own = blocks.of(std::span<const std::byte>(vector), ring.rank);
    for (std::size_t j = 0; j < segments.count; ++j) {
      sends[0][j] = ring.transport.send(ring.right, step_tag(ring.tag, first_step, j), segments.of(own, j),
                                        ring.operation);
    }
  }
  for (int t = 0; t <= p - 2; ++t) {
    if (t < p - 2) post_receives(t + 1);
    const int block = ring.wrap(ring.rank - 1 - t);
    const Segments segments(blocks.size[static_cast<std::size_t>(block)], unit, 1);
    const std::span<const std::byte> arrived = blocks.of(std::span<const std::byte>(vector), block);
    for (std::size_t j = 0; j < segments.count; ++j) {
      const std::span<const std::byte> segment = segments.of(arrived, j);
      ring.expect_bytes(receives[t % 2][j].wait(ring.timeout), segment.size(), block);
      if (t < p - 2) {
        sends[(t + 1) % 2][j] =
            ring.transport.send(ring.right, step_tag(ring.tag, first_step + t + 1, j), segment, ring.operation);
      }
    }
    const int sent = ring.wrap(ring.rank - t);
    const std::size_t sent_segments = Segments(blocks.size[static_cast<std::size_t>(sent)], unit, 1).count;
    for (std::size_t j = 0; j < sent_segments; ++j) sends[t % 2][j].wait(ring.timeout);
  }
}

void check_ring_size(const Transport& transport, const char* operation) {
  if (transport.size() > kMaxRingRanks) {
    throw UsageError(concat(operation, ": at most ", kMaxRingRanks, " ranks, the transport has ", transport.size()));
  }
}

// UsageError unless `bytes` is a whole number of `type` elements.
std::size_t elements_in(const char* operation, const char* what, std::size_t bytes, ElementType type) {
  const std::size_t size = element_size(type);
  if (bytes % size != 0) {
    throw UsageError(concat(operation, ": ", what, " of ", bytes, " bytes is not a whole number of ",
                            element_type_name(type), " elements (", size, " bytes each)"));
  }
  return bytes / size;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The collectives

void reduce_all(Transport& transport, std::span<std::byte> data, ElementType type, ElementwiseReduction reduction,
                Tag tag, Timeout timeout) {
  constexpr const char* kOperation = "reduce_all";
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  const std::size_t n = elements_in(kOperation, "the data", data.size(), type);
  check_reduction(reduction);
  check_ring_size(transport, kOperation);
  const int p = transport.size();
  if (p == 1 || n == 0) return;
  const std::size_t unit = element_size(type);
  Blocks blocks;
  for (int b = 0; b < p; ++b) blocks.add(unit * (n / p + (static_cast<std::size_t>(b) < n % p ? 1 : 0)));
  const Ring ring(transport, tag, timeout, kOperation);
  ring_reduce_scatter(ring, data, blocks, unit, kernel_for(type, reduction),
                      [&](int, int block) { return blocks.of(data, block); });
  ring_allgather(ring, data, blocks, unit, p - 1);
}

void reduce_scatter(Transport& transport, std::span<const std::byte> input, std::span<const std::int64_t> counts,
                    std::span<std::byte> output, ElementType type, ElementwiseReduction reduction, Tag tag,
                    Timeout timeout) {
  constexpr const char* kOperation = "reduce_scatter";
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  const std::size_t n = elements_in(kOperation, "the input", input.size(), type);
  check_reduction(reduction);
  check_ring_size(transport, kOperation);
  const int p = transport.size();
  const int rank = transport.rank();
  if (counts.size() != static_cast<std::size_t>(p)) {
    throw UsageError(concat(kOperation, ": ", counts.size(), " counts for ", p, " ranks"));
  }
  const std::size_t unit = element_size(type);
  Blocks blocks;
  std::size_t counted = 0;
  for (int b = 0; b < p; ++b) {
    const std::int64_t count = counts[static_cast<std::size_t>(b)];
    if (count < 0) throw UsageError(concat(kOperation, ": the count of rank ", b, " is negative (", count, ")"));
    counted += static_cast<std::size_t>(count);
    blocks.add(static_cast<std::size_t>(count) * unit);
  }
  if (counted != n) {
    throw UsageError(concat(kOperation, ": the counts sum to ", counted, " elements, the input holds ", n, " ",
                            element_type_name(type), " elements"));
  }
  if (output.size() != blocks.size[static_cast<std::size_t>(rank)]) {
    throw UsageError(concat(kOperation, ": the output of rank ", rank, " holds ", output.size(), " bytes, its block is ",
                            counts[static_cast<std::size_t>(rank)], " ", element_type_name(type), " elements"));
  }
  if (p == 1) {
    std::copy(input.begin(), input.end(), output.begin());
    return;
  }
  if (n == 0) return;
  // Partial reductions alternate between two accumulators (one is being sent while the other
  // fills); the last step writes the caller's output.
  std::vector<std::byte> accumulators[2];
  for (auto& accumulator : accumulators) accumulator.resize(p > 2 ? blocks.largest : 0);
  const Ring ring(transport, tag, timeout, kOperation);
  ring_reduce_scatter(ring, input, blocks, unit, kernel_for(type, reduction), [&](int s, int block) {
    if (s == p - 2) return output;
    return std::span<std::byte>(accumulators[s % 2].data(), blocks.size[static_cast<std::size_t>(block)]);
  });
}

void gather_all(Transport& transport, std::span<const std::byte> own, std::span<const std::size_t> byte_counts,
                std::span<std::byte> output, Tag tag, Timeout timeout) {
  constexpr const char* kOperation = "gather_all";
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  check_ring_size(transport, kOperation);
  const int p = transport.size();
  const int rank = transport.rank();
  if (byte_counts.size() != static_cast<std::size_t>(p)) {
    throw UsageError(concat(kOperation, ": ", byte_counts.size(), " byte counts for ", p, " ranks"));
  }
  if (own.size() != byte_counts[static_cast<std::size_t>(rank)]) {
    throw UsageError(concat(kOperation, ": rank ", rank, " contributes ", own.size(), " bytes, its byte count is ",
                            byte_counts[static_cast<std::size_t>(rank)]));
  }
  Blocks blocks;
  for (std::size_t bytes : byte_counts) blocks.add(bytes);
  if (output.size() != blocks.total) {
    throw UsageError(concat(kOperation, ": the output holds ", output.size(), " bytes, the byte counts sum to ",
                            blocks.total));
  }
  std::copy(own.begin(), own.end(), blocks.of(output, rank).begin());
  if (p == 1 || blocks.total == 0) return;
  ring_allgather(Ring(transport, tag, timeout, kOperation), output, blocks, 1, 0);
}

void exchange_all(Transport& transport, std::span<const std::byte> input, std::span<const std::size_t> send_bytes,
                  std::span<std::byte> output, std::span<const std::size_t> recv_bytes, Tag tag, Timeout timeout) {
  constexpr const char* kOperation = "exchange_all";
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  const int p = transport.size();
  const int rank = transport.rank();
  const auto self = static_cast<std::size_t>(rank);
  if (send_bytes.size() != static_cast<std::size_t>(p) || recv_bytes.size() != static_cast<std::size_t>(p)) {
    throw UsageError(concat(kOperation, ": ", send_bytes.size(), " send sizes and ", recv_bytes.size(),
                            " receive sizes for ", p, " ranks"));
  }
  Blocks sent, received;
  for (int r = 0; r < p; ++r) {
    sent.add(send_bytes[static_cast<std::size_t>(r)]);
    received.add(recv_bytes[static_cast<std::size_t>(r)]);
  }
  if (sent.total != input.size()) {
    throw UsageError(concat(kOperation, ": the send sizes sum to ", sent.total, " bytes, the input holds ", input.size()));
  }
  if (received.total != output.size()) {
    throw UsageError(concat(kOperation, ": the receive sizes sum to ", received.total, " bytes, the output holds ",
                            output.size()));
  }
  if (send_bytes[self] != recv_bytes[self]) {
    throw UsageError(concat(kOperation, ": rank ", rank, " sends ", send_bytes[self], " bytes to itself but expects ",
                            recv_bytes[self]));
  }
  const std::span<const std::byte> own = sent.of(input, rank);
  std::copy(own.begin(), own.end(), received.of(output, rank).begin());
  if (p == 1) return;

  // Step 0: each pair's sizes, both ways ({what I send you, what I expect from you}); step 1: the
  // data, segment j of a pair's part with segment j's tag. Everything is posted before any wait.
  std::vector<std::uint64_t> my_sizes(2 * static_cast<std::size_t>(p)), their_sizes(2 * static_cast<std::size_t>(p));
  std::vector<Request> size_receives(static_cast<std::size_t>(p)), size_sends(static_cast<std::size_t>(p));
  std::vector<Request> data_receives, data_sends;
  for (int peer = 0; peer < p; ++peer) {
    if (peer == rank) continue;
    const auto q = static_cast<std::size_t>(peer);
    my_sizes[2 * q] = send_bytes[q];
    my_sizes[2 * q + 1] = recv_bytes[q];
    size_receives[q] = transport.recv(peer, step_tag(tag, 0, 0),
                                      std::as_writable_bytes(std::span(their_sizes).subspan(2 * q, 2)), kOperation);
    size_sends[q] =
        transport.send(peer, step_tag(tag, 0, 0), std::as_bytes(std::span(my_sizes).subspan(2 * q, 2)), kOperation);
  }
  for (int peer = 0; peer < p; ++peer) {
    if (peer == rank) continue;
    const auto q = static_cast<std::size_t>(peer);
    if (recv_bytes[q] > 0) {
      const Segments segments(recv_bytes[q], 1, 0);
      const std::span<std::byte> into = received.of(output, peer);
      for (std::size_t j = 0; j < segments.count; ++j) {
        data_receives.push_back(transport.recv(peer, step_tag(tag, 1, j), segments.of(into, j), kOperation));
      }
    }
    if (send_bytes[q] > 0) {
      const Segments segments(send_bytes[q], 1, 0);
      const std::span<const std::byte> part = sent.of(input, peer);
      for (std::size_t j = 0; j < segments.count; ++j) {
        data_sends.push_back(transport.send(peer, step_tag(tag, 1, j), segments.of(part, j), kOperation));
      }
    }
  }
  for (int peer = 0; peer < p; ++peer) {
    if (peer == rank) continue;
    const auto q = static_cast<std::size_t>(peer);
    size_receives[q].wait(timeout);
    if (their_sizes[2 * q] != recv_bytes[q]) {
      throw UsageError(concat(kOperation, ": rank ", peer, " sends ", their_sizes[2 * q], " bytes to rank ", rank,
                              ", which expects ", recv_bytes[q]));
    }
    if (their_sizes[2 * q + 1] != send_bytes[q]) {
      throw UsageError(concat(kOperation, ": rank ", rank, " sends ", send_bytes[q], " bytes to rank ", peer,
                              ", which expects ", their_sizes[2 * q + 1]));
    }
  }
  // The sizes agree, so every data message fits its place exactly (a peer that sends something else
  // anyway is caught here).
  std::size_t next = 0;
  for (int peer = 0; peer < p; ++peer) {
    const auto q = static_cast<std::size_t>(peer);
    if (peer == rank || recv_bytes[q] == 0) continue;
    const Segments segments(recv_bytes[q], 1, 0);
    const std::span<std::byte> into = received.of(output, peer);
    for (std::size_t j = 0; j < segments.count; ++j) {
      const std::size_t got = data_receives[next++].wait(timeout);
      if (got != segments.of(into, j).size()) {
        throw UsageError(concat(kOperation, ": rank ", peer, " sent a part of ", got, " bytes to rank ", rank,
                                ", which expected ", segments.of(into, j).size()));
      }
    }
  }
  for (Request& send : data_sends) send.wait(timeout);
  for (Request& send : size_sends) {
    if (send.valid()) send.wait(timeout);
  }
}

void broadcast_bytes(Transport& transport, std::span<std::byte> data, int root, Tag tag, Timeout timeout) {
  constexpr const char* kOperation = "broadcast_bytes";
  PIPESGD_ASSERT(tag < (Tag{1} << 40));
  const int p = transport.size();
  const int rank = transport.rank();
  if (root < 0 || root >= p) throw UsageError(concat(kOperation, ": root ", root, " is not a rank of ", p));
  if (p == 1) return;

  // Binomial tree over ranks relative to the root: v's parent is v without its lowest set bit; its
  // children are v + m for the powers of two m below that bit (below p for the root), the largest
  // subtree first.
  const int relative = (rank - root + p) % p;
  int parent = -1;
  int mask = 1;
  while (mask < p) {
    if (relative & mask) {
      parent = (relative - mask + root) % p;
      break;
    }
    mask <<= 1;
  }
  std::vector<int> children;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask < p) children.push_back((relative + mask + root) % p);
  }

  // Step 0: every rank tells its parent its size at once; step 1: the data, segment by segment.
  const std::uint64_t own_size = data.size();
  std::vector<std::uint64_t> child_sizes(children.size());
  std::vector<Request> size_receives(children.size());
  Request size_message;
  if (parent >= 0) {
    size_message = transport.send(parent, step_tag(tag, 0, 0), std::as_bytes(std::span(&own_size, 1)), kOperation);
  }
  for (std::size_t c = 0; c < children.size(); ++c) {
    size_receives[c] = transport.recv(children[c], step_tag(tag, 0, 0),
                                      std::as_writable_bytes(std::span(child_sizes).subspan(c, 1)), kOperation);
  }
  const Segments segments(data.size(), 1, 0);
  std::vector<Request> receives(parent >= 0 ? segments.count : 0);
  for (std::size_t j = 0; j < receives.size(); ++j) {
    receives[j] = transport.recv(parent, step_tag(tag, 1, j), segments.of(data, j), kOperation);
  }
  for (std::size_t c = 0; c < children.size(); ++c) {
    size_receives[c].wait(timeout);
    if (child_sizes[c] != own_size) {
      throw UsageError(concat(kOperation, ": rank ", children[c], " has ", child_sizes[c], " bytes, its parent rank ",
                              rank, " has ", own_size, " (root ", root, ")"));
    }
  }
  std::vector<Request> sends(children.size() * segments.count);
  for (std::size_t j = 0; j < segments.count; ++j) {
    const std::span<const std::byte> segment = segments.of(std::span<const std::byte>(data), j);
    if (parent >= 0) {
      const std::size_t got = receives[j].wait(timeout);
      if (got != segment.size()) {
        throw UsageError(concat(kOperation, ": rank ", rank, " received ", got, " bytes of segment ", j, " from rank ",
                                parent, ", expected ", segment.size(), " (root ", root, ")"));
      }
    }
    for (std::size_t c = 0; c < children.size(); ++c) {
      sends[j * children.size() + c] = transport.send(children[c], step_tag(tag, 1, j), segment, kOperation);
    }
  }
  for (Request& send : sends) send.wait(timeout);
  if (size_message.valid()) size_message.wait(timeout);
}

}  // namespace pipesgd
