#pragma once
// Internal helpers shared by the allreduce algorithms (ring, recursive doubling, halving-doubling,
// tree). Not part of the public interface: include only from src/pipesgd/collective/*.cpp.
#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/comm/transport.h"
#include "pipesgd/core/error.h"

namespace pipesgd::allreduce_detail {

// Segments per message stream, bounded by the tag layout of step_tag (12 bits of segment).
inline constexpr std::size_t kMaxSegments = 4096;

// Throws CommError if a message from `peer` has `got` bytes instead of `expected`: the ranks
// disagree on the element count (a peer can send anything; never trust its size).
inline void expect_bytes(const char* operation, std::size_t got, std::size_t expected, int peer,
                         Tag tag) {
  if (got != expected) {
    throw CommError(concat(operation, ": message from rank ", peer, " (tag ", tag, ") has ", got,
                           " bytes, expected ", expected,
                           " (ranks disagree on the element count)"));
  }
}

// Throws UsageError if run() is given more elements than the allreduce was built for.
inline void check_count(const char* operation, std::size_t count, std::size_t max_count) {
  if (count > max_count) {
    throw UsageError(concat(operation, ": ", count, " elements exceed the ", max_count,
                            " this allreduce was built for"));
  }
}

// Elements per segment for messages of at most `max_message_elements` (>= 1) elements cut per
// AllreduceOptions::segment_bytes: kAutoSegmentBytes means kDefaultSegmentBytes, kUnsegmented whole
// messages; at least one element, and never more than kMaxSegments segments per message.
inline std::size_t segment_elements_for(std::size_t segment_bytes,
                                        std::size_t max_message_elements) {
  PIPESGD_ASSERT(max_message_elements >= 1);
  const std::size_t requested =
      segment_bytes == kAutoSegmentBytes ? kDefaultSegmentBytes : segment_bytes;
  std::size_t elements = std::max<std::size_t>(1, requested / sizeof(float));
  elements = std::max(elements, (max_message_elements + kMaxSegments - 1) / kMaxSegments);
  return std::min(elements, max_message_elements);
}

// Segments of a message of `elements` elements: at least one (possibly empty) segment, so that
// ranks disagreeing on the count still exchange a message whose size reveals it.
inline std::size_t segment_count(std::size_t elements, std::size_t segment_elements) {
  return std::max<std::size_t>(1, (elements + segment_elements - 1) / segment_elements);
}

// Block `block` of `n` elements cut into `blocks` near-equal blocks: n / blocks elements, plus one
// for block < n % blocks (blocks may be empty).
inline std::size_t block_count(std::size_t n, std::size_t blocks, std::size_t block) {
  return n / blocks + (block < n % blocks ? 1 : 0);
}
inline std::size_t block_offset(std::size_t n, std::size_t blocks, std::size_t block) {
  return block * (n / blocks) + std::min(block, n % blocks);
}

// Drops every request, withdrawing those still posted (on the caller's data or our buffers) so that
// nothing lands in or is read from them once run() has thrown.
inline void withdraw(std::span<Request> requests) {
  for (Request& request : requests) request = Request();
}

// The standard fold of p ranks onto q = the largest power of two <= p "active" ranks, for
// algorithms that need a power of two. With r = p - q, ranks 0..2r-1 form the pairs (2i, 2i+1): the
// even rank sends its vector to the odd one and sits out; the odd one adds it and stays active;
// after the power-of-two algorithm the odd rank returns the result to the even one. Ranks >= 2r are
// active and unpaired. The active ranks are numbered 0..q-1 (active index): rank 2i+1 is i (i < r),
// rank k >= 2r is k - r.
struct PowerOfTwoFold {
  PowerOfTwoFold(int rank, int size) {
    PIPESGD_ASSERT(size >= 1 && rank >= 0 && rank < size);
    while (active_size * 2 <= size) {
      active_size *= 2;
      ++steps;
    }
    extra = size - active_size;
    if (rank < 2 * extra) {
      partner = rank ^ 1;
      sits_out = rank % 2 == 0;
      active_index = sits_out ? -1 : rank / 2;
    } else {
      active_index = rank - extra;
    }
  }
  // The rank whose active index is `index` (0 <= index < active_size).
  int rank_of(int index) const { return index < extra ? 2 * index + 1 : index + extra; }

  int active_size = 1;    // q
  int steps = 0;          // log2(q)
  int extra = 0;          // r = p - q: the number of pairs
  int partner = -1;       // the other rank of this rank's pair, -1 if unpaired
  bool sits_out = false;  // an even rank of a pair: hands its vector over, gets the result back
  int active_index = -1;  // -1 if sits_out
};

}  // namespace pipesgd::allreduce_detail
