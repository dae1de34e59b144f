// Tests of RingAllreduce over LocalFabric: exact sums with `none`, derived error bounds with the lossy
// codecs, bit-identical results on every rank, reuse, and error handling.
#include "pipesgd/collective/ring_allreduce.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "pipesgd/collective/codec.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/core/error.h"
#include "test_world.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

// Generous: only reached if the allreduce hangs; the test then fails instead of hanging forever.
const AllreduceOptions patient_options{60s};

// Small integers in [-20, 20]: any fp32 sum of at most a few such values is exact, in any order.
float integer_value(int rank, std::size_t index) {
  return static_cast<float>(static_cast<int>((index * 7 + static_cast<std::size_t>(rank) * 13 + 3) % 41) -
                            20);
}

// Both signs, magnitudes from 2^-5 to just under 2^7, varying with rank and index.
constexpr double largest_mixed_magnitude = 128.0;
float mixed_value(int rank, std::size_t index) {
  const std::size_t r = static_cast<std::size_t>(rank);
  const float mantissa = 1.0f + static_cast<float>((index * 31 + r * 17) % 97) / 97.0f;
  const int exponent = static_cast<int>((index * 5 + r * 3) % 12) - 5;
  const float magnitude = std::ldexp(mantissa, exponent);
  return (index + r) % 3 == 0 ? -magnitude : magnitude;
}

float value_for(const std::string& codec_name, int rank, std::size_t index) {
  return codec_name == "none" ? integer_value(rank, index) : mixed_value(rank, index);
}

std::vector<float> values_of_rank(const std::string& codec_name, int rank, std::size_t count) {
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = value_for(codec_name, rank, i);
  return values;
}

// The exact sum over ranks, computed in double.
std::vector<double> expected_sum(const std::string& codec_name, int world_size, std::size_t count) {
  std::vector<double> sum(count, 0.0);
  for (int rank = 0; rank < world_size; ++rank) {
    for (std::size_t i = 0; i < count; ++i) sum[i] += value_for(codec_name, rank, i);
  }
  return sum;
}

// Per-element error bound of a ring allreduce with a lossy codec, from codec.h's per-encoding bound.
//
// An element's result went through p-1 encodings of partial sums (reduce-scatter; only p-2 of them
// are re-encodings of earlier decoded values, but the bound does not need that) and one encoding of
// the final sum (allgather), i.e. at most p encodings, each adding at most
// codec.error_bound(max|chunk being encoded|). Every partial sum is a sum over ranks of values of
// magnitude <= largest (S = p * largest) plus the errors e accumulated so far, so with
//   e_0 = 0,  e_k = e_{k-1} + error_bound(S + e_{k-1})   (k = 1..p)
// the codec error is at most e_p (about p * error_bound(S)). The p-1 fp32 additions of the fused
// decode-add each round by at most 2^-24 * (S + e_p). The bound returned is their sum.
double ring_error_bound(const Codec& codec, int world_size, double largest) {
  const double sum_of_maxima = world_size * largest;
  double accumulated = 0;
  for (int encoding = 0; encoding < world_size; ++encoding) {
    accumulated += codec.error_bound(sum_of_maxima + accumulated);
  }
  return accumulated + world_size * 0x1p-24 * (sum_of_maxima + accumulated);
}

// Runs one allreduce of `count` elements on every rank; returns each rank's result.
std::vector<std::vector<float>> run_allreduce(int world_size, std::size_t count,
                                              const std::string& codec_name,
                                              const AllreduceOptions& options = patient_options) {
  const std::unique_ptr<Codec> codec = make_codec(codec_name);
  std::vector<std::vector<float>> results(static_cast<std::size_t>(world_size));
  run_ranks(world_size, [&](int rank, Transport& transport) {
    std::vector<float> data = values_of_rank(codec_name, rank, count);
    RingAllreduce allreduce(transport, count, *codec, options);
    allreduce.run(data, /*tag=*/7);
    results[static_cast<std::size_t>(rank)] = std::move(data);
  });
  return results;
}

// Every rank's result must be bit-identical to rank 0's.
void expect_bit_identical_across_ranks(const std::vector<std::vector<float>>& results) {
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
void expect_close_to_sum(const std::vector<float>& result, const std::vector<double>& expected,
                         double bound, bool exact) {
  ASSERT_EQ(result.size(), expected.size());
  int reported = 0;
  for (std::size_t i = 0; i < result.size(); ++i) {
    const double error = std::fabs(static_cast<double>(result[i]) - expected[i]);
    const bool good = exact ? static_cast<double>(result[i]) == expected[i] : error <= bound;
    if (!good && reported++ < 10) {
      ADD_FAILURE() << "element " << i << ": got " << result[i] << ", expected " << expected[i]
                    << (exact ? " exactly" : ", error " + std::to_string(error) + " > bound " +
                                                 std::to_string(bound));
    }
  }
  EXPECT_EQ(reported, 0) << "elements outside the expected result";
}

// ---------------------------------------------------------------------------------------------
// Parameterized correctness over world size x count x codec.

enum class CountKind { zero, one, fewer_than_ranks, thousand, million_and_three };

std::size_t count_of(CountKind kind, int world_size) {
  switch (kind) {
    case CountKind::zero: return 0;
    case CountKind::one: return 1;
    case CountKind::fewer_than_ranks: return static_cast<std::size_t>(world_size - 1);
    case CountKind::thousand: return 1000;
    case CountKind::million_and_three: return 1000003;
  }
  return 0;
}

std::string name_of(CountKind kind) {
  switch (kind) {
    case CountKind::zero: return "Zero";
    case CountKind::one: return "One";
    case CountKind::fewer_than_ranks: return "FewerThanRanks";
    case CountKind::thousand: return "Thousand";
    case CountKind::million_and_three: return "MillionAndThree";
  }
  return "Unknown";
}

using RingCase = std::tuple<int, CountKind, std::string>;

class RingAllreduceSum : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingAllreduceSum, EveryRankEndsWithTheSameSumOverRanks) {
  const auto& [world_size, count_kind, codec_name] = GetParam();
  const std::size_t count = count_of(count_kind, world_size);
  const std::vector<std::vector<float>> results = run_allreduce(world_size, count, codec_name);
  const std::vector<double> expected = expected_sum(codec_name, world_size, count);

  const std::unique_ptr<Codec> codec = make_codec(codec_name);
  const bool exact = codec_name == "none";
  const double bound = exact ? 0.0 : ring_error_bound(*codec, world_size, largest_mixed_magnitude);
  expect_close_to_sum(results[0], expected, bound, exact);
  expect_bit_identical_across_ranks(results);
}

INSTANTIATE_TEST_SUITE_P(
    WorldSizesCountsAndCodecs, RingAllreduceSum,
    ::testing::Combine(::testing::Values(1, 2, 3, 4, 7),
                       ::testing::Values(CountKind::zero, CountKind::one,
                                         CountKind::fewer_than_ranks, CountKind::thousand,
                                         CountKind::million_and_three),
                       ::testing::Values("none", "bf16", "int8")),
    [](const ::testing::TestParamInfo<RingCase>& info) {
      return "Ranks" + std::to_string(std::get<0>(info.param)) + "_Count" +
             name_of(std::get<1>(info.param)) + "_" + std::get<2>(info.param);
    });

TEST(RingAllreduceErrorBound, IsTightEnoughToCatchAMissingRank) {
  // The lossy comparison must still fail if one rank's contribution were lost: the largest values
  // must exceed the bound, at every world size tested.
  for (const char* codec_name : {"bf16", "int8"}) {
    const std::unique_ptr<Codec> codec = make_codec(codec_name);
    for (int world_size : {2, 3, 4, 7}) {
      EXPECT_LT(ring_error_bound(*codec, world_size, largest_mixed_magnitude),
                largest_mixed_magnitude / 2)
          << codec_name << " with " << world_size << " ranks";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Segmenting (AllreduceOptions::segment_bytes): many small messages per chunk.

AllreduceOptions with_segment_bytes(std::size_t segment_bytes) {
  AllreduceOptions options = patient_options;
  options.segment_bytes = segment_bytes;
  return options;
}

using SegmentCase = std::tuple<std::string, std::size_t>;

class RingAllreduceSegments : public ::testing::TestWithParam<SegmentCase> {};

TEST_P(RingAllreduceSegments, SmallSegmentsStillGiveTheSumOnEveryRank) {
  const auto& [codec_name, segment_bytes] = GetParam();
  const std::unique_ptr<Codec> codec = make_codec(codec_name);
  for (int world_size : {2, 3, 5}) {
    // On 2 ranks, 10007 elements in segments of one element exceed the cap on segments per chunk.
    std::vector<std::size_t> counts = {0, 1, 97, 1000};
    if (world_size == 2) counts.push_back(10007);
    for (std::size_t count : counts) {
      SCOPED_TRACE(::testing::Message() << world_size << " ranks, " << count << " elements");
      const std::vector<std::vector<float>> results =
          run_allreduce(world_size, count, codec_name, with_segment_bytes(segment_bytes));
      const bool exact = codec_name == "none";
      const double bound =
          exact ? 0.0 : ring_error_bound(*codec, world_size, largest_mixed_magnitude);
      expect_close_to_sum(results[0], expected_sum(codec_name, world_size, count), bound, exact);
      expect_bit_identical_across_ranks(results);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    CodecsAndSegmentSizes, RingAllreduceSegments,
    ::testing::Combine(::testing::Values("none", "bf16", "int8"),
                       // 0 is kAutoSegmentBytes: the ring then uses kDefaultSegmentBytes.
                       ::testing::Values(std::size_t{0}, std::size_t{60}, std::size_t{1000})),
    [](const ::testing::TestParamInfo<SegmentCase>& info) {
      return std::get<0>(info.param) + "_SegmentBytes" + std::to_string(std::get<1>(info.param));
    });

TEST(RingAllreduceSegments, ResultDoesNotDependOnSegmentingForElementWiseCodecs) {
  // The summation order is fixed by the ring; `none` and `bf16` code element by element, so the
  // result must be bit-identical whatever the segment size. (int8's scale is per segment.)
  for (const char* codec_name : {"none", "bf16"}) {
    for (int world_size : {3, 4}) {
      SCOPED_TRACE(::testing::Message() << codec_name << ", " << world_size << " ranks");
      const std::vector<float> whole = run_allreduce(world_size, 5003, codec_name)[0];
      const std::vector<float> segmented =
          run_allreduce(world_size, 5003, codec_name, with_segment_bytes(36))[0];
      const std::vector<float> unsegmented =
          run_allreduce(world_size, 5003, codec_name, with_segment_bytes(kUnsegmented))[0];
      ASSERT_EQ(whole.size(), segmented.size());
      EXPECT_EQ(std::memcmp(whole.data(), segmented.data(), whole.size() * sizeof(float)), 0);
      ASSERT_EQ(whole.size(), unsegmented.size());
      EXPECT_EQ(std::memcmp(whole.data(), unsegmented.data(), whole.size() * sizeof(float)), 0);
    }
  }
}

TEST(RingAllreduce, TwoAllreducesWithDistinctTagsRunConcurrentlyOverOneTransport) {
  // E.g. a training method's comm thread and compute thread each running one.
  constexpr int world_size = 3;
  constexpr std::size_t count = 3001;
  const std::unique_ptr<Codec> codec = make_codec("none");
  std::vector<std::vector<float>> first(world_size), second(world_size);
  run_ranks(world_size, [&](int rank, Transport& transport) {
    std::thread other([&] {
      std::vector<float> data = values_of_rank("none", rank + 10, count);
      RingAllreduce allreduce(transport, count, *codec, with_segment_bytes(400));
      for (int repeat = 0; repeat < 3; ++repeat) {
        data = values_of_rank("none", rank + 10, count);
        allreduce.run(data, 2);
      }
      second[static_cast<std::size_t>(rank)] = std::move(data);
    });
    try {
      std::vector<float> data;
      RingAllreduce allreduce(transport, count, *codec, with_segment_bytes(400));
      for (int repeat = 0; repeat < 3; ++repeat) {
        data = values_of_rank("none", rank, count);
        allreduce.run(data, 1);
      }
      first[static_cast<std::size_t>(rank)] = std::move(data);
    } catch (...) {
      other.join();
      throw;
    }
    other.join();
  });
  std::vector<double> expected_first(count, 0.0), expected_second(count, 0.0);
  for (int rank = 0; rank < world_size; ++rank) {
    for (std::size_t i = 0; i < count; ++i) {
      expected_first[i] += integer_value(rank, i);
      expected_second[i] += integer_value(rank + 10, i);
    }
  }
  expect_close_to_sum(first[0], expected_first, 0.0, true);
  expect_close_to_sum(second[0], expected_second, 0.0, true);
  expect_bit_identical_across_ranks(first);
  expect_bit_identical_across_ranks(second);
}

// ---------------------------------------------------------------------------------------------
// Reuse and errors.

class RingAllreduceReuse : public ::testing::TestWithParam<std::string> {};

TEST_P(RingAllreduceReuse, OneObjectRunsManyTimesWithDifferentCountsAndTags) {
  const std::string codec_name = GetParam();
  const std::unique_ptr<Codec> codec = make_codec(codec_name);
  constexpr int world_size = 4;
  constexpr std::size_t max_count = 5000;
  const std::vector<std::size_t> counts = {5000, 17, 0, 4999, 3, 1234};
  const std::vector<Tag> tags = {1, 2, 3, 1000, 1, 0xffff};
  std::vector<std::vector<std::vector<float>>> results(
      counts.size(), std::vector<std::vector<float>>(world_size));

  run_ranks(world_size, [&](int rank, Transport& transport) {
    RingAllreduce allreduce(transport, max_count, *codec, patient_options);
    for (std::size_t call = 0; call < counts.size(); ++call) {
      // Vary the data between calls so that stale results from an earlier call would show.
      std::vector<float> data = values_of_rank(codec_name, rank + static_cast<int>(call), counts[call]);
      allreduce.run(data, tags[call]);
      results[call][static_cast<std::size_t>(rank)] = std::move(data);
    }
  });

  const double bound =
      codec_name == "none" ? 0.0 : ring_error_bound(*codec, world_size, largest_mixed_magnitude);
  for (std::size_t call = 0; call < counts.size(); ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call << ", count " << counts[call]);
    std::vector<double> expected(counts[call], 0.0);
    for (int rank = 0; rank < world_size; ++rank) {
      for (std::size_t i = 0; i < counts[call]; ++i) {
        expected[i] += value_for(codec_name, rank + static_cast<int>(call), i);
      }
    }
    expect_close_to_sum(results[call][0], expected, bound, codec_name == "none");
    expect_bit_identical_across_ranks(results[call]);
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, RingAllreduceReuse, ::testing::Values("none", "bf16", "int8"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(RingAllreduce, CountAboveTheMaximumThrowsUsageErrorOnEveryRank) {
  const std::unique_ptr<Codec> codec = make_codec("none");
  for (int world_size : {1, 3}) {
    std::vector<std::string> outcome(static_cast<std::size_t>(world_size), "no exception");
    run_ranks(world_size, [&](int rank, Transport& transport) {
      RingAllreduce allreduce(transport, 10, *codec, patient_options);
      std::vector<float> data(11, 1.0f);
      try {
        allreduce.run(data, 1);
      } catch (const UsageError& error) {
        outcome[static_cast<std::size_t>(rank)] = "UsageError";
        EXPECT_NE(std::string(error.what()).find("11"), std::string::npos) << error.what();
      }
    });
    EXPECT_EQ(outcome, std::vector<std::string>(static_cast<std::size_t>(world_size), "UsageError"))
        << world_size << " ranks";
  }
}

struct DisagreementCase {
  int world_size;
  int odd_rank;               // the rank whose count differs
  std::size_t count;          // every other rank's count
  std::size_t odd_count;      // the odd rank's count
};

TEST(RingAllreduce, RanksThatDisagreeOnTheCountFailWithCommErrorInsteadOfHanging) {
  const std::vector<DisagreementCase> cases = {
      {2, 1, 10, 11}, {2, 0, 10, 9}, {3, 2, 3, 4}, {3, 0, 4, 3}, {4, 3, 1000, 0}, {4, 1, 1, 2},
      {7, 5, 6, 7},   {7, 2, 100, 1000},
  };
  // Short, but far longer than detecting the disagreement takes: a timeout here means a hang.
  const AllreduceOptions short_options{5s};
  for (const char* codec_name : {"none", "bf16", "int8"}) {
    const std::unique_ptr<Codec> codec = make_codec(codec_name);
    for (const DisagreementCase& disagreement : cases) {
      SCOPED_TRACE(::testing::Message()
                   << codec_name << ", " << disagreement.world_size << " ranks, rank "
                   << disagreement.odd_rank << " has " << disagreement.odd_count << " elements, the others "
                   << disagreement.count);
      try {
        run_ranks(disagreement.world_size, [&](int rank, Transport& transport) {
          const std::size_t count =
              rank == disagreement.odd_rank ? disagreement.odd_count : disagreement.count;
          std::vector<float> data = values_of_rank(codec_name, rank, count);
          RingAllreduce allreduce(transport, 1000, *codec, short_options);
          allreduce.run(data, 3);
        });
        ADD_FAILURE() << "the allreduce succeeded";
      } catch (const CommTimeoutError& error) {
        ADD_FAILURE() << "detected only by a timeout: " << error.what();
      } catch (const PeerFailedError& error) {
        ADD_FAILURE() << "the root cause was not a CommError of the allreduce: " << error.what();
      } catch (const CommError& error) {
        SUCCEED() << error.what();
      }
    }
  }
}

TEST(RingAllreduce, RanksThatDisagreeOnTheNumberOfSegmentsFailWithCommError) {
  // With 4-element segments, 16 vs 18 elements on 2 ranks give chunks of 8 vs 9 elements: 2 vs 3
  // segments whose first two have equal sizes. A missing segment can only be noticed by a timeout,
  // so here any CommError is accepted (but no success and no hang).
  AllreduceOptions options = with_segment_bytes(16);
  options.timeout = 200ms;
  const std::unique_ptr<Codec> codec = make_codec("none");
  EXPECT_THROW(run_ranks(2,
                         [&](int rank, Transport& transport) {
                           std::vector<float> data = values_of_rank("none", rank, rank == 0 ? 16 : 18);
                           RingAllreduce allreduce(transport, 100, *codec, options);
                           allreduce.run(data, 3);
                         }),
               CommError);
}

TEST(RingAllreduce, AFailedRunLeavesNothingPostedIntoTheCallersData) {
  // transport.h: a recv's buffer belongs to the transport only until its Request has completed or
  // been destroyed. Once run() has returned, by an exception too, the caller owns `data` again and
  // may free it; no message may land in it later, and no send may still read from it.
  LocalFabric fabric(2);
  const std::unique_ptr<Codec> codec = make_codec("none");
  AllreduceOptions short_options = patient_options;
  short_options.timeout = 50ms;
  RingAllreduce failing(fabric.endpoint(0), 4, *codec, short_options);
  std::vector<float> data = {1, 2, 3, 4};
  EXPECT_THROW(failing.run(data, 1), CommTimeoutError);  // rank 1 has not joined yet
  const std::vector<float> after_failure = data;

  // Rank 1 joins late: it must not be able to complete any step with rank 0's failed call.
  RingAllreduce late(fabric.endpoint(1), 4, *codec, short_options);
  std::vector<float> late_data = {10, 20, 30, 40};
  EXPECT_THROW(late.run(late_data, 1), CommError);
  EXPECT_EQ(data, after_failure) << "a message of rank 1 landed in rank 0's data after run() threw";
}

}  // namespace
}  // namespace pipesgd

namespace pipesgd {
TEST(SegmentBytesFlag, ParsesAutoNoneAndSizes) {
  EXPECT_EQ(parse_segment_bytes("auto"), kAutoSegmentBytes);
  EXPECT_EQ(parse_segment_bytes("none"), kUnsegmented);
  EXPECT_EQ(parse_segment_bytes("256K"), 256u * 1024);
  EXPECT_EQ(parse_segment_bytes("1M"), 1024u * 1024);
  EXPECT_EQ(parse_segment_bytes("4096"), 4096u);
  for (const char* bad : {"", "fast", "2", "1X", "-5K", "0"}) {
    EXPECT_THROW(parse_segment_bytes(bad), UsageError) << bad;
  }
  EXPECT_EQ(describe_segment_bytes(kUnsegmented), "unsegmented");
  EXPECT_EQ(describe_segment_bytes(256 * 1024), "256 KiB");
}
}  // namespace pipesgd
