#pragma once
// Collectives on raw bytes for every element type (no LibTorch): allreduce, reduce-scatter,
// allgather(v), alltoall(v) and broadcast over all ranks of a Transport. A RankGroupTransport
// (comm/rank_group_transport.h) runs them over a process set.
//
// Every rank of the transport calls the same collective with the same tag, element type, reduction,
// counts and root (the per-rank sizes of gather_all and exchange_all are checked where noted). The
// collective's messages carry tags derived from `tag` (a collective_tag, < 2^40) with step_tag:
// collectives in flight at once over one transport need distinct tags. Every wait on a peer is
// bounded by `timeout` (CommTimeoutError); a failed peer raises PeerFailedError. Arguments that do
// not fit together raise UsageError naming the collective, before any message is sent. On any error
// the collective withdraws every message it posted before it throws: the caller's buffers are free
// again, their contents unspecified. Input and output spans must not overlap. Not thread-safe per
// call; calls with distinct tags may run on different threads of one rank at once.
//
// Messages: the reductions and gather_all are rings (size() - 1 steps each half; each block is cut
// into segments of about 256 KiB that flow independently, so reducing one overlaps the transfer of
// the next); exchange_all is direct (one message per pair); broadcast_bytes a binomial tree rooted
// at `root`. Scratch is allocated once per call; at most 2049 ranks (the tag layout's 4096 steps).
#include <cstddef>
#include <cstdint>
#include <span>

#include "pipesgd/comm/transport.h"

namespace pipesgd {

// Element types; every one is stored in its natural size and the host's byte order. kBool is one
// byte, 0 false and anything else true (results are 0 or 1).
enum class ElementType : std::uint8_t {
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,   // IEEE 754 binary16
  kBFloat16,  // the upper 16 bits of a float32
  kFloat32,
  kFloat64,
  kBool,
};
inline constexpr int kElementTypeCount = 10;

// Bytes of one element: 1, 1, 2, 4, 8, 2, 2, 4, 8, 1.
std::size_t element_size(ElementType type);
// "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64", "bool".
const char* element_type_name(ElementType type);

// Element-wise reductions.
//  * Integers wrap as two's complement (sum and product are computed in the unsigned type).
//  * Floating point: IEEE arithmetic; float16 and bfloat16 are computed in float32 and rounded back
//    to nearest even. Min and Max return NaN if either operand is NaN.
//  * Bool: Sum and Max are logical or, Product and Min logical and.
enum class ElementwiseReduction : std::uint8_t { kSum, kMin, kMax, kProduct };
inline constexpr int kElementwiseReductionCount = 4;

// Half-precision conversions (the collectives' own; exposed for callers and tests).
// float16: IEEE binary16 with subnormals, infinities and NaN (a NaN stays a NaN, quiet, sign kept);
// float -> half rounds to nearest, ties to even, and overflows to infinity.
float float16_to_float(std::uint16_t bits);
std::uint16_t float_to_float16(float value);
// bfloat16: float -> bfloat16 rounds to nearest, ties to even (a NaN stays a quiet NaN).
float bfloat16_to_float(std::uint16_t bits);
std::uint16_t float_to_bfloat16(float value);

// accumulator[i] = accumulator[i] <reduction> operand[i] for every element: the kernel every
// reduction here runs. Both spans hold the same whole number of elements (PIPESGD_ASSERT).
void reduce_elements(std::span<std::byte> accumulator, std::span<const std::byte> operand, ElementType type,
                     ElementwiseReduction reduction);

// Allreduce in place: every rank ends with the element-wise reduction over all ranks of its `data`,
// bit-identical on every rank. data.size() must be a whole number of elements (else UsageError).
// Ring reduce-scatter over size() nearly equal blocks of elements (block b: n / p elements, plus
// one for b < n % p), each block combined once along the ring in one fixed order, then a ring
// allgather copies each reduced block to every rank. One rank or no elements: no messages.
void reduce_all(Transport& transport, std::span<std::byte> data, ElementType type, ElementwiseReduction reduction,
                Tag tag, Timeout timeout);

// Reduce-scatter: `input` is size() consecutive blocks, block r of counts[r] elements; `output`
// (counts[rank()] elements) receives the reduction over every rank of its block rank(). UsageError
// unless counts.size() == size(), every count >= 0, the counts sum to input's elements and output
// holds counts[rank()] elements. The reduce-scatter half of reduce_all (same ring, same order).
// No elements in all: no messages.
void reduce_scatter(Transport& transport, std::span<const std::byte> input, std::span<const std::int64_t> counts,
                    std::span<std::byte> output, ElementType type, ElementwiseReduction reduction, Tag tag,
                    Timeout timeout);

// Allgather with per-rank sizes: rank r contributes byte_counts[r] bytes (own.size() ==
// byte_counts[rank()]); `output` receives every rank's bytes concatenated in rank order. UsageError
// unless byte_counts.size() == size(), own matches and output holds their sum. Every ring step sends
// one message per block even when it is empty (so that ranks that disagree on a size see it); no
// bytes in all: no messages.
void gather_all(Transport& transport, std::span<const std::byte> own, std::span<const std::size_t> byte_counts,
                std::span<std::byte> output, Tag tag, Timeout timeout);

// Alltoall with per-pair sizes: the send_bytes[r] consecutive bytes of `input` (in rank order) go to
// rank r; `output` receives recv_bytes[r] bytes from each rank r, in rank order (its own part copied
// locally). UsageError unless both lists have size() entries that sum to input's and output's sizes
// and send_bytes[rank()] == recv_bytes[rank()]. Each pair of ranks first exchanges its two sizes
// (one 16-byte message each way, posted with the data): if rank r sends a different number of bytes
// than rank q expects, both throw UsageError naming the two ranks and the sizes before any data is
// used. Empty parts send no data message.
void exchange_all(Transport& transport, std::span<const std::byte> input, std::span<const std::size_t> send_bytes,
                  std::span<std::byte> output, std::span<const std::size_t> recv_bytes, Tag tag, Timeout timeout);

// Broadcast: every rank's `data` ends as root's. UsageError if root is not in [0, size()). Binomial
// tree rooted at `root`; each rank tells its parent its size when it starts, and a parent whose
// child's size differs from its own throws UsageError naming the child, the parent and the root
// before it sends (the child then fails with the parent's failure or its timeout). No bytes on every
// rank: only the size messages.
void broadcast_bytes(Transport& transport, std::span<std::byte> data, int root, Tag tag, Timeout timeout);

}  // namespace pipesgd
