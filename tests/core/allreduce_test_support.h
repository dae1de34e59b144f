#pragma once
// Helpers shared by the allreduce tests: inputs whose sums are known in closed form, the error
// bound of each algorithm with a lossy codec (derived from codec.h's per-encoding bound and the
// number of encodings an element goes through), and result checks. Header-only.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/collective/allreduce.h"
#include "pipesgd/collective/codec.h"

namespace pipesgd {

// Generous: only reached if the allreduce hangs; the test then fails instead of hanging forever.
inline const AllreduceOptions patient_options{std::chrono::seconds(60)};

// Small integers in [-20, 20]: any fp32 sum of at most a few such values is exact, in any order.
inline float integer_value(int rank, std::size_t index) {
  return static_cast<float>(
      static_cast<int>((index * 7 + static_cast<std::size_t>(rank) * 13 + 3) % 41) - 20);
}

// Both signs, magnitudes from 2^-5 to just under 2^7, varying with rank and index.
inline constexpr double largest_mixed_magnitude = 128.0;
inline float mixed_value(int rank, std::size_t index) {
  const std::size_t r = static_cast<std::size_t>(rank);
  const float mantissa = 1.0f + static_cast<float>((index * 31 + r * 17) % 97) / 97.0f;
  const int exponent = static_cast<int>((index * 5 + r * 3) % 12) - 5;
  const float magnitude = std::ldexp(mantissa, exponent);
  return (index + r) % 3 == 0 ? -magnitude : magnitude;
}

inline float value_for(const std::string& codec_name, int rank, std::size_t index) {
  return codec_name == "none" ? integer_value(rank, index) : mixed_value(rank, index);
}

inline std::vector<float> values_of_rank(const std::string& codec_name, int rank,
                                         std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = value_for(codec_name, rank, i);
  return values;
}

// The exact sum over ranks, computed in double. Rank r contributes the values of rank r + shift.
inline std::vector<double> expected_sum(const std::string& codec_name, int world_size,
                                        std::size_t count, int shift = 0) {
  std::vector<double> sum(count, 0.0);
  for (int rank = 0; rank < world_size; ++rank) {
    for (std::size_t i = 0; i < count; ++i) sum[i] += value_for(codec_name, rank + shift, i);
  }
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Per-element error bounds with a lossy codec. Each is built from codec.error_bound(max|chunk being
// encoded|) per encoding and 2^-24 * |sum| per fp32 addition; "largest" bounds |input value|. A
// partial sum over k ranks has magnitude <= k * largest plus the error accumulated so far.

// Ring: an element's result went through p-1 encodings of partial sums in the reduce-scatter, the
// k-th of a sum over k ranks (k = 1..p-1), and one encoding of the final sum over p ranks in the
// allgather: p encodings, each adding at most codec.error_bound(max|chunk being encoded|). A
// partial sum over k ranks has magnitude <= k * largest plus the errors e accumulated so far, so
// with
//   e_0 = 0,  e_k = e_{k-1} + error_bound(k * largest + e_{k-1})   (k = 1..p)
// the codec error is at most e_p (about p(p+1)/2 * error_bound(largest)). The p-1 fp32 additions of
// the fused decode-add each round by at most 2^-24 * (p * largest + e_p). The bound returned is
// their sum.
inline double ring_error_bound(const Codec& codec, int world_size, double largest) {
  double accumulated = 0;
  for (int ranks = 1; ranks <= world_size; ++ranks) {
    accumulated += codec.error_bound(ranks * largest + accumulated);
  }
  return accumulated + world_size * 0x1p-24 * (world_size * largest + accumulated);
}

// A partial sum: bounds of its magnitude and of its error.
struct PartialSumBound {
  double magnitude = 0;
  double error = 0;
  // After one fp32 addition that produced this partial sum.
  void add_rounding() { error += 0x1p-24 * (magnitude + error); }
};

// q: the largest power of two <= world_size.
inline int active_size_of(int world_size) {
  int active_size = 1;
  while (active_size * 2 <= world_size) active_size *= 2;
  return active_size;
}

// The power-of-two fold (allreduce_detail.h) shared by recursive doubling and halving-doubling:
// with p > q, an active rank may hold its own vector plus the decode of its pair's (one encoding):
// magnitude 2 * largest, error error_bound(largest) plus one rounding.
inline PartialSumBound folded_partial_sum(const Codec& codec, int world_size, double largest) {
  PartialSumBound partial{largest, 0};
  if (world_size > active_size_of(world_size)) {
    partial = {2 * largest, codec.error_bound(largest)};
    partial.add_rounding();
  }
  return partial;
}

// Recursive doubling: each of the log2(q) steps adds decode(encode(a)) + decode(encode(b)) of two
// partial sums like the one bounded so far, so both the magnitude and the error double and each
// operand adds one encoding: e' = 2 (e + error_bound(m + e)), m' = 2 m, plus one rounding. The fold
// ranks receive an exact copy (no further error).
inline double recursive_doubling_error_bound(const Codec& codec, int world_size, double largest) {
  PartialSumBound partial = folded_partial_sum(codec, world_size, largest);
  for (int covered = 1; covered < active_size_of(world_size); covered *= 2) {
    partial.error = 2 * (partial.error + codec.error_bound(partial.magnitude + partial.error));
    partial.magnitude *= 2;
    partial.add_rounding();
  }
  return partial.error;
}

// Halving-doubling: each of the log2(q) reduce-scatter steps adds the decode of the partner's
// encoded partial sum to the own one (one encoding): e' = 2 e + error_bound(m + e), m' = 2 m, plus
// one rounding; then the owner's single encoding of the final sum.
inline double halving_doubling_error_bound(const Codec& codec, int world_size, double largest) {
  PartialSumBound partial = folded_partial_sum(codec, world_size, largest);
  for (int covered = 1; covered < active_size_of(world_size); covered *= 2) {
    partial.error = 2 * partial.error + codec.error_bound(partial.magnitude + partial.error);
    partial.magnitude *= 2;
    partial.add_rounding();
  }
  return partial.error + codec.error_bound(partial.magnitude + partial.error);
}

// Tree: rank i's partial sum is its own value plus the decode of each child's encoded partial sum
// (one encoding per edge, one rounding per addition), computed over the actual heap-numbered tree;
// then rank 0's single encoding of the sum.
inline PartialSumBound tree_partial_sum(const Codec& codec, int world_size, double largest,
                                        int rank) {
  PartialSumBound partial{largest, 0};
  for (int child : {2 * rank + 1, 2 * rank + 2}) {
    if (child >= world_size) continue;
    const PartialSumBound below = tree_partial_sum(codec, world_size, largest, child);
    partial.error += below.error + codec.error_bound(below.magnitude + below.error);
    partial.magnitude += below.magnitude;
    partial.add_rounding();
  }
  return partial;
}
inline double tree_error_bound(const Codec& codec, int world_size, double largest) {
  const PartialSumBound sum = tree_partial_sum(codec, world_size, largest, 0);
  return sum.error + codec.error_bound(sum.magnitude + sum.error);
}

// Direct: the owner adds the decode of each other rank's encoded block to its own exact value (one
// encoding per contribution, one rounding per addition), then encodes the sum once.
inline double direct_error_bound(const Codec& codec, int world_size, double largest) {
  PartialSumBound partial{largest, 0};
  for (int other = 1; other < world_size; ++other) {
    partial.error += codec.error_bound(largest);
    partial.magnitude += largest;
    partial.add_rounding();
  }
  return partial.error + codec.error_bound(partial.magnitude + partial.error);
}

// The bound of the algorithm named as in make_allreduce.
inline double allreduce_error_bound(const std::string& algorithm, const Codec& codec,
                                    int world_size, double largest) {
  if (algorithm == "ring") return ring_error_bound(codec, world_size, largest);
  if (algorithm == "recursive-doubling") {
    return recursive_doubling_error_bound(codec, world_size, largest);
  }
  if (algorithm == "halving-doubling")
    return halving_doubling_error_bound(codec, world_size, largest);
  if (algorithm == "tree") return tree_error_bound(codec, world_size, largest);
  if (algorithm == "direct") return direct_error_bound(codec, world_size, largest);
  ADD_FAILURE() << "no error bound for " << algorithm;
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Checks.

// Every rank's result must be bit-identical to rank 0's.
inline void expect_bit_identical_across_ranks(const std::vector<std::vector<float>>& results) {
  for (std::size_t rank = 1; rank < results.size(); ++rank) {
    ASSERT_EQ(results[rank].size(), results[0].size()) << "rank " << rank;
    if (results[0].empty()) continue;
    const int difference =
        std::memcmp(results[rank].data(), results[0].data(), results[0].size() * sizeof(float));
    if (difference != 0) {
      std::size_t first = 0;
      while (std::memcmp(&results[rank][first], &results[0][first], sizeof(float)) == 0) ++first;
      ADD_FAILURE() << "rank " << rank << " differs from rank 0 first at element " << first << ": "
                    << results[rank][first] << " vs " << results[0][first];
    }
  }
}

// Checks one rank's result against the exact sum: exactly for `none`, within `bound` otherwise.
inline void expect_close_to_sum(const std::vector<float>& result,
                                const std::vector<double>& expected, double bound, bool exact) {
  ASSERT_EQ(result.size(), expected.size());
  int reported = 0;
  for (std::size_t i = 0; i < result.size(); ++i) {
    const double error = std::fabs(static_cast<double>(result[i]) - expected[i]);
    const bool good = exact ? static_cast<double>(result[i]) == expected[i] : error <= bound;
    if (!good && reported++ < 10) {
      ADD_FAILURE() << "element " << i << ": got " << result[i] << ", expected " << expected[i]
                    << (exact ? " exactly"
                              : ", error " + std::to_string(error) + " > bound " +
                                    std::to_string(bound));
    }
  }
  EXPECT_EQ(reported, 0) << "elements outside the expected result";
}

// ---------------------------------------------------------------------------------------------
// Element counts of the parameterized tests.

enum class CountKind { zero, one, seven, fewer_than_ranks, thousand, million_and_three };

inline std::size_t count_of(CountKind kind, int world_size) {
  switch (kind) {
    case CountKind::zero:
      return 0;
    case CountKind::one:
      return 1;
    case CountKind::seven:
      return 7;
    case CountKind::fewer_than_ranks:
      return static_cast<std::size_t>(world_size - 1);
    case CountKind::thousand:
      return 1000;
    case CountKind::million_and_three:
      return 1000003;
  }
  return 0;
}

inline std::string name_of(CountKind kind) {
  switch (kind) {
    case CountKind::zero:
      return "Zero";
    case CountKind::one:
      return "One";
    case CountKind::seven:
      return "Seven";
    case CountKind::fewer_than_ranks:
      return "FewerThanRanks";
    case CountKind::thousand:
      return "Thousand";
    case CountKind::million_and_three:
      return "MillionAndThree";
  }
  return "Unknown";
}

// gtest prints test parameters with this (else as "4-byte object <...>").
inline void PrintTo(CountKind kind, std::ostream* out) { *out << name_of(kind); }

}  // namespace pipesgd
