// The launch environment (comm/launch_environment.h): which launcher started the process and with
// how many ranks, from OpenMPI's, PMI's and PMIx's variables; the CLI refuses a launch of several
// ranks without --transport mpi.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "pipesgd/comm/launch_environment.h"

namespace pipesgd {
namespace {

struct LaunchCase {
  std::string name;
  std::map<std::string, std::string> environment;
  std::string launcher;  // "" : not launched
  int size;
  int rank;
  bool several;
};

std::vector<LaunchCase> launch_cases() {
  return {
      {"plain_process", {}, "", 0, -1, false},
      {"mpirun_two_ranks_rank0", {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}}, "mpirun", 2, 0, true},
      {"mpirun_two_ranks_rank1", {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}}, "mpirun", 2, 1, true},
      {"mpirun_one_rank", {{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}}, "mpirun", 1, 0, false},
      {"mpirun_wins_over_pmix", {{"OMPI_COMM_WORLD_SIZE", "3"}, {"OMPI_COMM_WORLD_RANK", "2"}, {"PMIX_RANK", "0"}},
       "mpirun", 3, 2, true},
      {"pmi_three_ranks", {{"PMI_SIZE", "3"}, {"PMI_RANK", "0"}}, "a PMI launcher", 3, 0, true},
      {"pmix_rank0_cannot_tell", {{"PMIX_RANK", "0"}}, "a PMIx launcher", 0, 0, false},
      {"pmix_rank1_is_not_alone", {{"PMIX_RANK", "1"}}, "a PMIx launcher", 0, 1, true},
      {"garbage_size_is_unknown", {{"OMPI_COMM_WORLD_SIZE", "2x"}, {"OMPI_COMM_WORLD_RANK", "0"}}, "mpirun", 0, 0, false},
      {"size_zero_is_unknown", {{"PMI_SIZE", "0"}}, "a PMI launcher", 0, -1, false},
      {"negative_rank_is_unknown", {{"PMI_SIZE", "4"}, {"PMI_RANK", "-1"}}, "a PMI launcher", 4, -1, true},
  };
}

class LaunchEnvironments : public testing::TestWithParam<LaunchCase> {};

TEST_P(LaunchEnvironments, TellTheLauncherAndItsRanks) {
  const LaunchCase& c = GetParam();
  const LaunchEnvironment launch = read_launch_environment([&](const char* name) -> const char* {
    const auto found = c.environment.find(name);
    return found == c.environment.end() ? nullptr : found->second.c_str();
  });
  EXPECT_EQ(launch.launcher, c.launcher);
  EXPECT_EQ(launch.launched(), !c.launcher.empty());
  EXPECT_EQ(launch.size, c.size);
  EXPECT_EQ(launch.rank, c.rank);
  EXPECT_EQ(launch.several_ranks(), c.several);
}

INSTANTIATE_TEST_SUITE_P(Cases, LaunchEnvironments, testing::ValuesIn(launch_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pipesgd
