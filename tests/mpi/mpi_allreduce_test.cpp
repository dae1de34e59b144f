// Every allreduce algorithm x codec x count over MpiTransport (ctest runs this with 2, 3, 4 and 5
// ranks), against the closed-form sum and against MPI_Allreduce on the same inputs; every rank must
// end bit-identical.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <tuple>
#include <vector>

#include "../core/allreduce_test_support.h"
#include "mpi_test_world.h"
#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/core/checksum.h"
#include "pipesgd/mpi/mpi_library_allreduce.h"

namespace pipesgd {
namespace {

using AlgorithmCase = std::tuple<std::string, std::string, std::size_t>;  // algorithm, codec, count

class MpiAllreduceTest : public ::testing::TestWithParam<AlgorithmCase> {};

TEST_P(MpiAllreduceTest, MatchesClosedFormAndMpiAllreduce) {
  const auto& [algorithm, codec_name, count] = GetParam();
  MpiTransport& transport = *test_mpi_transport;
  const int p = transport.size(), rank = transport.rank();
  auto codec = make_codec(codec_name);
  auto allreduce = make_allreduce(algorithm, transport, count, *codec, patient_options);
  static std::uint64_t sequence = 0;

  std::vector<float> ours = values_of_rank(codec_name, rank, count);
  std::vector<float> theirs = ours;
  allreduce->run(ours, collective_tag(Channel::kGradients, sequence++));
  allreduce->run(ours, collective_tag(Channel::kGradients, sequence++));  // the same object again
  // The second run summed the sums: compare with p times the closed form.
  MpiLibraryAllreduce library(*test_mpi_runtime);
  library.run(theirs, 0);
  library.run(theirs, 0);

  std::vector<double> expected = expected_sum(codec_name, p, count);
  for (double& value : expected) value *= p;
  // EXPECT, never ASSERT, before the collective below: every rank must reach it (mpi_test_main.cpp).
  // Each loop reports its first wrong element only.
  if (codec->is_identity()) {
    for (std::size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(expected[i]);
      EXPECT_EQ(ours[i], want) << "element " << i << " (the first wrong one)";
      if (ours[i] != want) break;
    }
    EXPECT_TRUE(ours == theirs) << "differs from MPI_Allreduce";
  } else {
    // Two runs: the second starts from the first's result (error e1, magnitude p * largest) and
    // adds its own error for inputs of magnitude p * largest + e1, times p ranks' copies of e1.
    const double first = allreduce_error_bound(algorithm, *codec, p, largest_mixed_magnitude);
    const double second =
        allreduce_error_bound(algorithm, *codec, p, p * largest_mixed_magnitude + first);
    const double bound = p * first + second;
    for (std::size_t i = 0; i < count; ++i) {
      const double from_expected = std::fabs(ours[i] - expected[i]);
      const double from_theirs = std::fabs(static_cast<double>(ours[i]) - theirs[i]);
      EXPECT_LE(from_expected, bound) << "element " << i << " (the first wrong one)";
      EXPECT_LE(from_theirs, bound) << "element " << i << " (the first wrong one)";
      if (!(from_expected <= bound && from_theirs <= bound)) break;
    }
  }
  // Bit-identical on every rank.
  const std::uint64_t mine = checksum_of(ours);
  std::vector<std::uint64_t> all(p);
  MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (int r = 0; r < p; ++r) EXPECT_EQ(all[r], mine) << "rank " << r << " ended with other values";
}

std::string case_name(const ::testing::TestParamInfo<AlgorithmCase>& info) {
  std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" +
                     std::to_string(std::get<2>(info.param));
  for (char& c : name) {
    if (c == '-') c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    EveryAlgorithmCodecCount, MpiAllreduceTest,
    ::testing::Combine(::testing::Values("ring", "recursive-doubling", "halving-doubling", "tree", "direct"),
                       ::testing::Values("none", "bf16", "int8"),
                       ::testing::Values(std::size_t{0}, std::size_t{1}, std::size_t{7},
                                         std::size_t{1000003})),
    case_name);

TEST(MpiAllreduceFactory, KnowsEveryAlgorithmOfTheSuite) {
  EXPECT_EQ(allreduce_algorithm_names(),
            (std::vector<std::string>{"ring", "recursive-doubling", "halving-doubling", "tree", "direct"}));
}

}  // namespace
}  // namespace pipesgd
