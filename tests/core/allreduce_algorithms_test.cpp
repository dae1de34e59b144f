// Tests of every allreduce algorithm of make_allreduce (ring, recursive doubling, halving-doubling,
// tree, direct) over LocalFabric: exact sums with `none`, derived error bounds with the lossy codecs,
// bit-identical results on every rank, for any world size (powers of two or not) and any count;
// reuse, segmenting (tree), the factory, every entry of the list (allreduce_algorithms.h), and error
// handling.
#include "pipesgd/collective/allreduce_factory.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "allreduce_test_support.h"
#include "pipesgd/collective/allreduce_algorithms.h"
#include "pipesgd/collective/allreduce_rounds.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/collective/halving_doubling_allreduce.h"
#include "pipesgd/collective/recursive_doubling_allreduce.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/collective/tree_allreduce.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/core/error.h"
#include "pipesgd/timing/allreduce_cost_model.h"
#include "test_world.h"

namespace pipesgd {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> algorithms = {"ring", "recursive-doubling", "halving-doubling",
                                             "tree", "direct"};

// "recursive-doubling" -> "recursive_doubling" (test names allow only letters, digits and '_').
std::string identifier_of(std::string name) {
  for (char& character : name) {
    if (character == '-') character = '_';
  }
  return name;
}

AllreduceOptions with_segment_bytes(std::size_t segment_bytes) {
  AllreduceOptions options = patient_options;
  options.segment_bytes = segment_bytes;
  return options;
}

// Runs one allreduce of `count` elements on every rank; returns each rank's result.
std::vector<std::vector<float>> run_allreduce(const std::string& algorithm, int world_size,
                                              std::size_t count, const std::string& codec_name,
                                              const AllreduceOptions& options = patient_options) {
  const std::unique_ptr<Codec> codec = make_codec(codec_name);
  std::vector<std::vector<float>> results(static_cast<std::size_t>(world_size));
  run_ranks(world_size, [&](int rank, Transport& transport) {
    std::vector<float> data = values_of_rank(codec_name, rank, count);
    const std::unique_ptr<Allreduce> allreduce =
        make_allreduce(algorithm, transport, count, *codec, options);
    allreduce->run(data, /*tag=*/7);
    results[static_cast<std::size_t>(rank)] = std::move(data);
  });
  return results;
}

// Runs the allreduce and checks rank 0 against the closed-form sum and every rank against rank 0.
void expect_sum_on_every_rank(const std::string& algorithm, int world_size, std::size_t count,
                              const std::string& codec_name,
                              const AllreduceOptions& options = patient_options) {
  const std::vector<std::vector<float>> results =
      run_allreduce(algorithm, world_size, count, codec_name, options);
  const std::unique_ptr<Codec> codec = make_codec(codec_name);
  const bool exact = codec_name == "none";
  const double bound =
      exact ? 0.0 : allreduce_error_bound(algorithm, *codec, world_size, largest_mixed_magnitude);
  expect_close_to_sum(results[0], expected_sum(codec_name, world_size, count), bound, exact);
  expect_bit_identical_across_ranks(results);
}

// ---------------------------------------------------------------------------------------------
// Parameterized correctness over algorithm x codec x world size x count.

using SumCase = std::tuple<std::string, std::string, int, CountKind>;

std::string name_of_sum_case(const ::testing::TestParamInfo<SumCase>& info) {
  const auto& [algorithm, codec_name, world_size, count_kind] = info.param;
  return identifier_of(algorithm) + "_" + codec_name + "_Ranks" + std::to_string(world_size) +
         "_Count" + name_of(count_kind);
}

class AllreduceAlgorithmSum : public ::testing::TestWithParam<SumCase> {};

TEST_P(AllreduceAlgorithmSum, EveryRankEndsWithTheSameSumOverRanks) {
  const auto& [algorithm, codec_name, world_size, count_kind] = GetParam();
  expect_sum_on_every_rank(algorithm, world_size, count_of(count_kind, world_size), codec_name);
}

INSTANTIATE_TEST_SUITE_P(AlgorithmsCodecsWorldSizesAndCounts, AllreduceAlgorithmSum,
                         ::testing::Combine(::testing::ValuesIn(algorithms),
                                            ::testing::Values("none", "bf16", "int8"),
                                            ::testing::Values(1, 2, 3, 4, 5, 7, 8),
                                            ::testing::Values(CountKind::zero, CountKind::one,
                                                              CountKind::fewer_than_ranks,
                                                              CountKind::thousand)),
                         name_of_sum_case);

// The grid of the MPI tests (tests/mpi/mpi_allreduce_test.cpp runs it over MpiTransport with 2-5
// ranks), here over LocalTransport: counts 0, 1, 7 and 1000003 for world sizes 2 to 5.
INSTANTIATE_TEST_SUITE_P(SameGridAsTheMpiTests, AllreduceAlgorithmSum,
                         ::testing::Combine(::testing::ValuesIn(algorithms),
                                            ::testing::Values("none", "bf16", "int8"),
                                            ::testing::Values(2, 3, 4, 5),
                                            ::testing::Values(CountKind::zero, CountKind::one,
                                                              CountKind::seven,
                                                              CountKind::million_and_three)),
                         name_of_sum_case);

// Large vectors: a subset of world sizes (folds of one and of three pairs, a power of two).
INSTANTIATE_TEST_SUITE_P(AlgorithmsCodecsAndLargeCounts, AllreduceAlgorithmSum,
                         ::testing::Combine(::testing::ValuesIn(algorithms),
                                            ::testing::Values("none", "bf16", "int8"),
                                            ::testing::Values(5, 7, 8),
                                            ::testing::Values(CountKind::million_and_three)),
                         name_of_sum_case);

TEST(AllreduceAlgorithmErrorBound, IsTightEnoughToCatchAMissingRank) {
  // The lossy comparison must still fail if one rank's contribution were lost: the largest values
  // must exceed the bound, for every algorithm at every world size tested.
  for (const std::string& algorithm : algorithms) {
    for (const char* codec_name : {"bf16", "int8"}) {
      const std::unique_ptr<Codec> codec = make_codec(codec_name);
      for (int world_size = 2; world_size <= 8; ++world_size) {
        EXPECT_LT(allreduce_error_bound(algorithm, *codec, world_size, largest_mixed_magnitude),
                  largest_mixed_magnitude / 2)
            << algorithm << ", " << codec_name << " with " << world_size << " ranks";
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bytes sent per rank, as documented in each algorithm's header.

// What rank `rank` sends in an allreduce of n elements (n divisible by the world size) whose codec
// encodes k elements into k * bytes_per_element bytes.
std::uint64_t documented_bytes_sent(const std::string& algorithm, int world_size, int rank,
                                    std::uint64_t n, std::uint64_t bytes_per_element) {
  const std::uint64_t p = static_cast<std::uint64_t>(world_size);
  const std::uint64_t vector_bytes = n * bytes_per_element;
  std::uint64_t q = 1;
  int steps = 0;
  while (q * 2 <= p) {
    q *= 2;
    ++steps;
  }
  const bool paired = static_cast<std::uint64_t>(rank) < 2 * (p - q);
  const bool sits_out = paired && rank % 2 == 0;
  if (algorithm == "ring" || algorithm == "direct") return 2 * (p - 1) * vector_bytes / p;
  if (algorithm == "recursive-doubling") {
    if (sits_out) return vector_bytes;
    return steps * vector_bytes + (paired ? n * sizeof(float) : 0);  // the result as exact fp32
  }
  if (algorithm == "halving-doubling") {
    if (sits_out) return vector_bytes;
    return 2 * (q - 1) * vector_bytes / q + (paired ? vector_bytes : 0);
  }
  if (algorithm == "tree") {
    std::uint64_t children = 0;
    for (int child : {2 * rank + 1, 2 * rank + 2}) children += child < world_size ? 1 : 0;
    return (rank > 0 ? vector_bytes : 0) + children * vector_bytes;
  }
  ADD_FAILURE() << "unknown algorithm " << algorithm;
  return 0;
}

TEST(AllreduceAlgorithmBytes, EveryRankSendsTheDocumentedBytes) {
  constexpr std::size_t count = 1000 * 8 * 7 * 5 * 3;  // divisible by every world size tested
  for (const std::string& algorithm : algorithms) {
    for (const char* codec_name : {"none", "bf16"}) {
      const std::unique_ptr<Codec> codec = make_codec(codec_name);
      const std::uint64_t bytes_per_element = codec->encoded_bytes(1);
      for (int world_size : {1, 2, 3, 5, 7, 8}) {
        std::vector<std::uint64_t> sent(static_cast<std::size_t>(world_size));
        run_ranks(world_size, [&](int rank, Transport& transport) {
          std::vector<float> data = values_of_rank(codec_name, rank, count);
          const std::unique_ptr<Allreduce> allreduce =
              make_allreduce(algorithm, transport, count, *codec, patient_options);
          const std::uint64_t before = transport.bytes_sent();
          allreduce->run(data, 1);
          sent[static_cast<std::size_t>(rank)] = transport.bytes_sent() - before;
        });
        for (int rank = 0; rank < world_size; ++rank) {
          EXPECT_EQ(sent[static_cast<std::size_t>(rank)],
                    world_size == 1 ? 0
                                    : documented_bytes_sent(algorithm, world_size, rank, count,
                                                            bytes_per_element))
              << algorithm << ", " << codec_name << ", rank " << rank << " of " << world_size;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tree segmenting (AllreduceOptions::segment_bytes): many small segments pipelined up and down.

using SegmentCase = std::tuple<std::string, std::size_t>;

class AllreduceAlgorithmTreeSegments : public ::testing::TestWithParam<SegmentCase> {};

TEST_P(AllreduceAlgorithmTreeSegments, SmallSegmentsStillGiveTheSumOnEveryRank) {
  const auto& [codec_name, segment_bytes] = GetParam();
  for (int world_size : {2, 3, 6}) {
    // 10007 elements in one-element segments exceed the cap on segments per message.
    for (std::size_t count : {0, 1, 97, 1000, 10007}) {
      SCOPED_TRACE(::testing::Message() << world_size << " ranks, " << count << " elements");
      expect_sum_on_every_rank("tree", world_size, count, codec_name,
                               with_segment_bytes(segment_bytes));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    CodecsAndSegmentSizes, AllreduceAlgorithmTreeSegments,
    ::testing::Combine(::testing::Values("none", "bf16", "int8"),
                       // 0 is kAutoSegmentBytes: the tree then uses kDefaultSegmentBytes.
                       ::testing::Values(std::size_t{0}, std::size_t{4}, std::size_t{60},
                                         std::size_t{1000}, kUnsegmented)),
    [](const ::testing::TestParamInfo<SegmentCase>& info) {
      const std::size_t segment_bytes = std::get<1>(info.param);
      return std::get<0>(info.param) + "_SegmentBytes" +
             (segment_bytes == kUnsegmented ? std::string("Unsegmented")
                                            : std::to_string(segment_bytes));
    });

TEST(AllreduceAlgorithmTreeSegments, ResultDoesNotDependOnSegmentingForElementWiseCodecs) {
  // The summation order is fixed by the tree (by the rank order, for direct); `none` and `bf16`
  // code element by element, so the result must be bit-identical whatever the segment size.
  // (int8's scale is per segment.)
  for (const char* algorithm : {"tree", "direct"}) {
    for (const char* codec_name : {"none", "bf16"}) {
      for (int world_size : {3, 6}) {
        SCOPED_TRACE(::testing::Message()
                     << algorithm << ", " << codec_name << ", " << world_size << " ranks");
        const std::vector<float> whole = run_allreduce(algorithm, world_size, 5003, codec_name)[0];
        for (std::size_t segment_bytes : {std::size_t{36}, kUnsegmented}) {
          const std::vector<float> segmented = run_allreduce(
              algorithm, world_size, 5003, codec_name, with_segment_bytes(segment_bytes))[0];
          ASSERT_EQ(whole.size(), segmented.size());
          EXPECT_EQ(std::memcmp(whole.data(), segmented.data(), whole.size() * sizeof(float)), 0)
              << segment_bytes << " segment bytes";
        }
      }
    }
  }
}

// Forwards to another rank's transport and records, in order, every send this rank posts and every
// receive whose wait has returned. Lets a test check the order of a rank's steps without timing.
class RecordingTransport final : public Transport {
 public:
  struct Event {
    bool is_send;  // a send posted, or a receive completed
    int peer;
    int step;
    std::size_t segment;
  };

  explicit RecordingTransport(Transport& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Request send(int peer, Tag tag, std::span<const std::byte> bytes,
               const char* operation) override {
    record({true, peer, step_of(tag), segment_of(tag)});
    return inner_.send(peer, tag, bytes, operation);
  }
  Request recv(int peer, Tag tag, std::span<std::byte> buffer, const char* operation) override {
    auto state =
        std::make_shared<RecordedReceive>(*this, Event{false, peer, step_of(tag), segment_of(tag)},
                                          inner_.recv(peer, tag, buffer, operation));
    return Request(std::move(state));
  }
  void report_failure(const std::string& reason) override { inner_.report_failure(reason); }
  std::uint64_t bytes_sent() const override { return inner_.bytes_sent(); }
  std::string describe() const override { return "recording " + inner_.describe(); }

  // Position of the first event matching, or events().size() if none.
  std::size_t position_of(bool is_send, int peer, int step, std::size_t segment) const {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < events_.size(); ++i) {
      const Event& event = events_[i];
      if (event.is_send == is_send && event.peer == peer && event.step == step &&
          event.segment == segment) {
        return i;
      }
    }
    return events_.size();
  }

 private:
  class RecordedReceive final : public RequestState {
   public:
    RecordedReceive(RecordingTransport& owner, Event event, Request inner)
        : owner_(owner), event_(event), inner_(std::move(inner)) {}
    std::size_t wait(Timeout timeout) override {
      const std::size_t bytes = inner_.wait(timeout);
      owner_.record(event_);
      return bytes;
    }
    bool test() override { return inner_.test(); }
    void cancel() override { inner_ = Request(); }

   private:
    RecordingTransport& owner_;
    Event event_;
    Request inner_;
  };

  static int step_of(Tag tag) { return static_cast<int>((tag >> 12) & 0xfff); }
  static std::size_t segment_of(Tag tag) { return static_cast<std::size_t>(tag & 0xfff); }
  void record(const Event& event) {
    std::lock_guard lock(mutex_);
    events_.push_back(event);
  }

  Transport& inner_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
};

TEST(AllreduceAlgorithmTreeSegments, SegmentsPipelineUpAndDownTheTree) {
  // 7 ranks: rank 0 has children 1 and 2; rank 1 has children 3 and 4 and parent 0. 100 segments.
  // Pipelining means: a rank sends segment 0 on (up, or down from rank 0) before its children's
  // last segment has even arrived, instead of after a whole-vector phase.
  constexpr int world_size = 7;
  constexpr std::size_t count = 10000;
  constexpr std::size_t last_segment = 99;
  constexpr int reduce_step = 0;
  constexpr int broadcast_step = 1;
  const std::unique_ptr<Codec> codec = make_codec("int8");
  std::vector<std::unique_ptr<RecordingTransport>> recorders(world_size);
  run_ranks(world_size, [&](int rank, Transport& transport) {
    recorders[static_cast<std::size_t>(rank)] = std::make_unique<RecordingTransport>(transport);
    RecordingTransport& recorder = *recorders[static_cast<std::size_t>(rank)];
    std::vector<float> data = values_of_rank("int8", rank, count);
    TreeAllreduce allreduce(recorder, count, *codec, with_segment_bytes(100 * sizeof(float)));
    allreduce.run(data, 1);
  });
  const RecordingTransport& root = *recorders[0];
  const RecordingTransport& inner = *recorders[1];
  for (int child : {1, 2}) {
    EXPECT_LT(root.position_of(true, child, broadcast_step, 0),
              root.position_of(false, child, reduce_step, last_segment))
        << "rank 0 broadcast segment 0 to rank " << child << " only after the last segment arrived";
  }
  EXPECT_LT(inner.position_of(true, 0, reduce_step, 0),
            inner.position_of(false, 3, reduce_step, last_segment))
      << "rank 1 sent segment 0 up only after the last segment arrived";
  EXPECT_LT(inner.position_of(false, 3, reduce_step, last_segment),
            inner.position_of(true, 3, broadcast_step, last_segment))
      << "the recording is incomplete";
}

// ---------------------------------------------------------------------------------------------
// Reuse and concurrency.

using AlgorithmAndCodec = std::tuple<std::string, std::string>;

std::string name_of_algorithm_and_codec(const ::testing::TestParamInfo<AlgorithmAndCodec>& info) {
  return identifier_of(std::get<0>(info.param)) + "_" + std::get<1>(info.param);
}

class AllreduceAlgorithmReuse : public ::testing::TestWithParam<AlgorithmAndCodec> {};

TEST_P(AllreduceAlgorithmReuse, OneObjectRunsManyTimesWithDifferentCountsAndTags) {
  const auto& [algorithm, codec_name] = GetParam();
  const std::unique_ptr<Codec> codec = make_codec(codec_name);
  constexpr std::size_t max_count = 5000;
  const std::vector<std::size_t> counts = {5000, 17, 0, 4999, 3, 1234, 1};
  const std::vector<Tag> tags = {1, 2, 3, 1000, 1, 0xffff, 4};
  for (int world_size : {4, 6}) {
    std::vector<std::vector<std::vector<float>>> results(
        counts.size(), std::vector<std::vector<float>>(static_cast<std::size_t>(world_size)));
    run_ranks(world_size, [&](int rank, Transport& transport) {
      // Small segments, so that the tree's segment count varies between calls too.
      const std::unique_ptr<Allreduce> allreduce =
          make_allreduce(algorithm, transport, max_count, *codec, with_segment_bytes(4000));
      for (std::size_t call = 0; call < counts.size(); ++call) {
        // Vary the data between calls so that stale results from an earlier call would show.
        std::vector<float> data =
            values_of_rank(codec_name, rank + static_cast<int>(call), counts[call]);
        allreduce->run(data, tags[call]);
        results[call][static_cast<std::size_t>(rank)] = std::move(data);
      }
    });
    const double bound = codec_name == "none" ? 0.0
                                              : allreduce_error_bound(algorithm, *codec, world_size,
                                                                      largest_mixed_magnitude);
    for (std::size_t call = 0; call < counts.size(); ++call) {
      SCOPED_TRACE(::testing::Message()
                   << world_size << " ranks, call " << call << ", count " << counts[call]);
      const std::vector<double> expected =
          expected_sum(codec_name, world_size, counts[call], static_cast<int>(call));
      expect_close_to_sum(results[call][0], expected, bound, codec_name == "none");
      expect_bit_identical_across_ranks(results[call]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AlgorithmsAndCodecs, AllreduceAlgorithmReuse,
                         ::testing::Combine(::testing::ValuesIn(algorithms),
                                            ::testing::Values("none", "bf16", "int8")),
                         name_of_algorithm_and_codec);

class AllreduceAlgorithmConcurrency : public ::testing::TestWithParam<std::string> {};

TEST_P(AllreduceAlgorithmConcurrency,
       TwoAllreducesWithDistinctTagsRunConcurrentlyOverOneTransport) {
  // E.g. a training method's comm thread and compute thread each running one.
  const std::string algorithm = GetParam();
  constexpr int world_size = 5;
  constexpr std::size_t count = 3001;
  const std::unique_ptr<Codec> codec = make_codec("none");
  std::vector<std::vector<float>> first(world_size), second(world_size);
  run_ranks(world_size, [&](int rank, Transport& transport) {
    auto repeat_allreduce = [&](int shift, Tag tag) {
      const std::unique_ptr<Allreduce> allreduce =
          make_allreduce(algorithm, transport, count, *codec, with_segment_bytes(400));
      std::vector<float> data;
      for (int repeat = 0; repeat < 3; ++repeat) {
        data = values_of_rank("none", rank + shift, count);
        allreduce->run(data, tag);
      }
      return data;
    };
    std::thread other([&] { second[static_cast<std::size_t>(rank)] = repeat_allreduce(10, 2); });
    try {
      first[static_cast<std::size_t>(rank)] = repeat_allreduce(0, 1);
    } catch (...) {
      other.join();
      throw;
    }
    other.join();
  });
  expect_close_to_sum(first[0], expected_sum("none", world_size, count), 0.0, true);
  expect_close_to_sum(second[0], expected_sum("none", world_size, count, 10), 0.0, true);
  expect_bit_identical_across_ranks(first);
  expect_bit_identical_across_ranks(second);
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllreduceAlgorithmConcurrency, ::testing::ValuesIn(algorithms),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return identifier_of(info.param);
                         });

// ---------------------------------------------------------------------------------------------
// The list (allreduce_algorithms.h): every entry, with no test code of its own.

// Each entry's make builds an allreduce of its name whose result is the closed-form sum on every
// rank, bit-identical, at world sizes 1, 2, 3, 5 and counts 0, 1, one fewer than the ranks, one more
// and 1000; its rounds and cost coefficients exist and are what allreduce_rounds and
// allreduce_coefficients answer for its name.
TEST(AllreduceAlgorithmList, EveryEntryMakesAnExactAllreduceAndHasItsModel) {
  ASSERT_FALSE(allreduce_algorithms().empty());
  const std::unique_ptr<Codec> codec = make_codec("none");
  std::set<std::string_view> names;
  for (const AllreduceAlgorithm& entry : allreduce_algorithms()) {
    SCOPED_TRACE(std::string(entry.name));
    EXPECT_TRUE(names.insert(entry.name).second) << "a second entry named " << entry.name;
    EXPECT_EQ(find_allreduce_algorithm(entry.name), &entry);
    ASSERT_NE(entry.make, nullptr);
    ASSERT_NE(entry.rounds, nullptr);
    ASSERT_NE(entry.coefficients, nullptr);
    for (const int p : {1, 2, 3, 5}) {
      const std::size_t ranks = static_cast<std::size_t>(p);
      for (const std::size_t count : {std::size_t{0}, std::size_t{1}, ranks - 1, ranks + 1, std::size_t{1000}}) {
        SCOPED_TRACE(concat(p, " ranks, ", count, " elements"));
        std::vector<std::vector<float>> results(ranks);
        std::vector<std::string> built(ranks);
        run_ranks(p, [&](int rank, Transport& transport) {
          std::vector<float> data = values_of_rank("none", rank, count);
          const std::unique_ptr<Allreduce> allreduce = entry.make(transport, count, *codec, patient_options);
          built[static_cast<std::size_t>(rank)] = std::string(allreduce->name());
          allreduce->run(data, /*tag=*/7);
          results[static_cast<std::size_t>(rank)] = std::move(data);
        });
        for (const std::string& name : built) EXPECT_EQ(name, entry.name);
        expect_close_to_sum(results[0], expected_sum("none", p, count), 0.0, /*exact=*/true);
        expect_bit_identical_across_ranks(results);
      }
      if (p == 1) {
        EXPECT_TRUE(allreduce_rounds(entry.name, p).empty());
        EXPECT_EQ(allreduce_coefficients(entry.name, p).messages, 0);
        continue;
      }
      const std::vector<AllreduceRound> rounds = entry.rounds(p);
      EXPECT_FALSE(rounds.empty());
      EXPECT_EQ(allreduce_rounds(entry.name, p), rounds);
      const AllreduceCoefficients coefficients = entry.coefficients(p);
      EXPECT_GT(coefficients.messages, 0);
      EXPECT_GT(coefficients.transferred, 0);
      EXPECT_GT(coefficients.reduced, 0);
      EXPECT_EQ(allreduce_coefficients(entry.name, p).messages, coefficients.messages);
      EXPECT_EQ(allreduce_coefficients(entry.name, p).transferred, coefficients.transferred);
      EXPECT_EQ(allreduce_coefficients(entry.name, p).reduced, coefficients.reduced);
    }
  }
  EXPECT_EQ(find_allreduce_algorithm("butterfly"), nullptr);
}

// ---------------------------------------------------------------------------------------------
// The factory.

TEST(AllreduceAlgorithmFactory, BuildsEveryNamedAlgorithm) {
  EXPECT_EQ(allreduce_algorithm_names(), algorithms);
  const std::unique_ptr<Codec> codec = make_codec("none");
  LocalFabric fabric(1);
  for (const std::string& name : allreduce_algorithm_names()) {
    const std::unique_ptr<Allreduce> allreduce =
        make_allreduce(name, fabric.endpoint(0), 10, *codec);
    ASSERT_NE(allreduce, nullptr) << name;
    EXPECT_EQ(allreduce->name(), name);
  }
  EXPECT_NE(
      dynamic_cast<RingAllreduce*>(make_allreduce("ring", fabric.endpoint(0), 1, *codec).get()),
      nullptr);
  EXPECT_NE(dynamic_cast<RecursiveDoublingAllreduce*>(
                make_allreduce("recursive-doubling", fabric.endpoint(0), 1, *codec).get()),
            nullptr);
  EXPECT_NE(dynamic_cast<HalvingDoublingAllreduce*>(
                make_allreduce("halving-doubling", fabric.endpoint(0), 1, *codec).get()),
            nullptr);
  EXPECT_NE(
      dynamic_cast<TreeAllreduce*>(make_allreduce("tree", fabric.endpoint(0), 1, *codec).get()),
      nullptr);
}

TEST(AllreduceAlgorithmFactory, UnknownNameThrowsUsageErrorListingTheValidNames) {
  const std::unique_ptr<Codec> codec = make_codec("none");
  LocalFabric fabric(1);
  for (const char* bad : {"butterfly", "", "Ring", "recursive_doubling"}) {
    try {
      make_allreduce(bad, fabric.endpoint(0), 10, *codec);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const UsageError& error) {
      EXPECT_EQ(std::string(error.what()),
                "unknown allreduce algorithm '" + std::string(bad) +
                    "' (expected ring, recursive-doubling, halving-doubling, tree, direct)");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Errors.

class AllreduceAlgorithmErrors : public ::testing::TestWithParam<std::string> {};

TEST_P(AllreduceAlgorithmErrors, CountAboveTheMaximumThrowsUsageErrorOnEveryRank) {
  const std::string algorithm = GetParam();
  const std::unique_ptr<Codec> codec = make_codec("none");
  for (int world_size : {1, 3}) {
    std::vector<std::string> outcome(static_cast<std::size_t>(world_size), "no exception");
    run_ranks(world_size, [&](int rank, Transport& transport) {
      const std::unique_ptr<Allreduce> allreduce =
          make_allreduce(algorithm, transport, 10, *codec, patient_options);
      std::vector<float> data(11, 1.0f);
      try {
        allreduce->run(data, 1);
      } catch (const UsageError& error) {
        outcome[static_cast<std::size_t>(rank)] = "UsageError";
        EXPECT_NE(std::string(error.what()).find("11"), std::string::npos) << error.what();
      }
    });
    EXPECT_EQ(outcome, std::vector<std::string>(static_cast<std::size_t>(world_size), "UsageError"))
        << world_size << " ranks";
  }
}

TEST_P(AllreduceAlgorithmErrors, ARankThatNeverJoinsMakesTheOthersTimeOutNamingOperationAndPeer) {
  const std::string algorithm = GetParam();
  const std::string operation = algorithm + " allreduce";
  const std::unique_ptr<Codec> codec = make_codec("bf16");
  AllreduceOptions short_options = patient_options;
  short_options.timeout = 200ms;
  // 2 ranks: rank 0 can only be waiting for rank 1. 5 ranks: the first rank to time out may be
  // waiting for rank 4 or for a rank that is itself stuck; either way a timeout of this operation.
  for (int world_size : {2, 5}) {
    const int missing = world_size - 1;
    SCOPED_TRACE(::testing::Message() << world_size << " ranks, rank " << missing << " missing");
    try {
      run_ranks(world_size, [&](int rank, Transport& transport) {
        if (rank == missing) return;
        const std::unique_ptr<Allreduce> allreduce =
            make_allreduce(algorithm, transport, 1000, *codec, short_options);
        std::vector<float> data = values_of_rank("bf16", rank, 1000);
        allreduce->run(data, 5);
      });
      ADD_FAILURE() << "the allreduce succeeded without rank " << missing;
    } catch (const CommTimeoutError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(operation), std::string::npos) << message;
      // The given 200 ms timeout fired, not a longer one.
      EXPECT_NE(message.find("timed out after 0.2 s"), std::string::npos) << message;
      if (world_size == 2) {
        EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
      }
    }
  }
}

struct DisagreementCase {
  int world_size;
  int odd_rank;           // the rank whose count differs
  std::size_t count;      // every other rank's count
  std::size_t odd_count;  // the odd rank's count
};

TEST_P(AllreduceAlgorithmErrors, RanksThatDisagreeOnTheCountFailWithCommErrorInsteadOfHanging) {
  const std::string algorithm = GetParam();
  const std::vector<DisagreementCase> cases = {
      {2, 1, 10, 11}, {2, 0, 10, 9}, {3, 2, 3, 4}, {3, 0, 4, 3},      {4, 3, 1000, 0},
      {4, 1, 1, 2},   {5, 0, 8, 9},  {7, 5, 6, 7}, {7, 2, 100, 1000},
  };
  // Short, but far longer than detecting the disagreement takes: a timeout here means a hang.
  const AllreduceOptions short_options{5s};
  for (const char* codec_name : {"none", "bf16", "int8"}) {
    const std::unique_ptr<Codec> codec = make_codec(codec_name);
    for (const DisagreementCase& disagreement : cases) {
      SCOPED_TRACE(::testing::Message()
                   << codec_name << ", " << disagreement.world_size << " ranks, rank "
                   << disagreement.odd_rank << " has " << disagreement.odd_count
                   << " elements, the others " << disagreement.count);
      try {
        run_ranks(disagreement.world_size, [&](int rank, Transport& transport) {
          const std::size_t count =
              rank == disagreement.odd_rank ? disagreement.odd_count : disagreement.count;
          std::vector<float> data = values_of_rank(codec_name, rank, count);
          const std::unique_ptr<Allreduce> allreduce =
              make_allreduce(algorithm, transport, 1000, *codec, short_options);
          allreduce->run(data, 3);
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

TEST_P(AllreduceAlgorithmErrors, AFailedRunLeavesNothingPostedIntoTheCallersData) {
  // transport.h: a recv's buffer belongs to the transport only until its Request has completed or
  // been destroyed. Once run() has returned, by an exception too, the caller owns `data` again and
  // may free it; no message may land in it later, and no send may still read from it.
  const std::string algorithm = GetParam();
  for (const char* codec_name : {"none", "int8"}) {
    SCOPED_TRACE(codec_name);
    LocalFabric fabric(2);
    const std::unique_ptr<Codec> codec = make_codec(codec_name);
    AllreduceOptions short_options = patient_options;
    short_options.timeout = 50ms;
    const std::unique_ptr<Allreduce> failing =
        make_allreduce(algorithm, fabric.endpoint(0), 4, *codec, short_options);
    std::vector<float> data = {1, 2, 3, 4};
    EXPECT_THROW(failing->run(data, 1), CommTimeoutError);  // rank 1 has not joined yet
    const std::vector<float> after_failure = data;

    // Rank 1 joins late: it must not be able to complete any step with rank 0's failed call.
    const std::unique_ptr<Allreduce> late =
        make_allreduce(algorithm, fabric.endpoint(1), 4, *codec, short_options);
    std::vector<float> late_data = {10, 20, 30, 40};
    EXPECT_THROW(late->run(late_data, 1), CommError);
    EXPECT_EQ(data, after_failure)
        << "a message of rank 1 landed in rank 0's data after run() threw";
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllreduceAlgorithmErrors, ::testing::ValuesIn(algorithms),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return identifier_of(info.param);
                         });

}  // namespace
}  // namespace pipesgd
