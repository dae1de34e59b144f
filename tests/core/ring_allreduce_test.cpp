// Tests of RingAllreduce over LocalFabric: exact sums with `none`, derived error bounds with the lossy
// codecs, bit-identical results on every rank, segmenting, reuse. What every algorithm must do
// (errors included) is tested for all of them in allreduce_algorithms_test.cpp.
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
#include "allreduce_test_support.h"
#include "test_world.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

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

struct DisagreementCase {
  int world_size;
  int odd_rank;               // the rank whose count differs
  std::size_t count;          // every other rank's count
  std::size_t odd_count;      // the odd rank's count
};

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
