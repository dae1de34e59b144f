// The launch environment (comm/launch_environment.h): which launcher started the process and with
// how many ranks, from OpenMPI's, PMI's and PMIx's variables; the CLI refuses a launch of several
// ranks without --transport mpi. A torchrun-style launch (RANK and WORLD_SIZE, no MPI launcher's
// variables) of more than one process, which the CLI refuses, and its variables as the CLI names them.
#include <gtest/gtest.h>

#include <map>
#include <ostream>
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

// gtest prints a failing case by this (the name, then what the case expects).
void PrintTo(const LaunchCase& c, std::ostream* out) {
  *out << c.name << " (launcher '" << c.launcher << "', size " << c.size << ", rank " << c.rank << ")";
}

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

struct TorchrunCase {
  std::string name;
  std::map<std::string, std::string> environment;
  int size;
  int rank;
  std::string variables;
  bool world;  // torchrun_world(): refused by the CLI
};

void PrintTo(const TorchrunCase& c, std::ostream* out) {
  *out << c.name << " (size " << c.size << ", rank " << c.rank << ", variables '" << c.variables << "')";
}

// As torchrun --nproc_per_node 2 sets them for its second process.
const std::map<std::string, std::string> kTorchrunRank1 = {
    {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
    {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"GROUP_RANK", "0"},
    {"TORCHELASTIC_RUN_ID", "none"}};

std::map<std::string, std::string> with(std::map<std::string, std::string> environment,
                                        const std::map<std::string, std::string>& more) {
  for (const auto& [name, value] : more) environment[name] = value;
  return environment;
}

std::vector<TorchrunCase> torchrun_cases() {
  const std::string rank1 = "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500";
  return {
      {"torchrun_rank1_of_2", kTorchrunRank1, 2, 1, rank1, true},
      {"torchrun_rank0_of_4", with(kTorchrunRank1, {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}), 4, 0,
       "RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500", true},
      {"rank_and_world_size_only", {{"RANK", "1"}, {"WORLD_SIZE", "2"}}, 2, 1, "RANK=1 WORLD_SIZE=2", true},
      {"torchrun_of_one_process_is_plain", with(kTorchrunRank1, {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}}),
       1, 0, "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500", false},
      {"world_size_without_rank", {{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, 0, -1, "", false},
      {"rank_without_world_size", {{"RANK", "1"}, {"LOCAL_RANK", "1"}}, 0, -1, "", false},
      {"world_size_not_a_number", {{"RANK", "1"}, {"WORLD_SIZE", "two"}}, 0, -1, "", false},
      {"rank_not_a_number", {{"RANK", "first"}, {"WORLD_SIZE", "2"}}, 0, -1, "", false},
      {"world_size_zero", {{"RANK", "0"}, {"WORLD_SIZE", "0"}}, 0, -1, "", false},
      // Under an MPI launcher, its variables tell the ranks; RANK and WORLD_SIZE are not read.
      {"mpirun_wins", with(kTorchrunRank1, {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}}), 0, -1, "",
       false},
      {"pmi_wins", with(kTorchrunRank1, {{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}}), 0, -1, "", false},
      {"pmix_wins", with(kTorchrunRank1, {{"PMIX_RANK", "1"}}), 0, -1, "", false},
      // A value is named on one line: control characters as '?', a long value cut at 64 characters.
      {"value_with_newline", {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a\nb"}}, 2, 1,
       "RANK=1 WORLD_SIZE=2 MASTER_ADDR=a?b", true},
      {"long_value", {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", std::string(70, 'h')}}, 2, 1,
       "RANK=1 WORLD_SIZE=2 MASTER_ADDR=" + std::string(64, 'h') + "...", true},
  };
}

class TorchrunEnvironments : public testing::TestWithParam<TorchrunCase> {};

TEST_P(TorchrunEnvironments, TellATorchrunStyleLaunch) {
  const TorchrunCase& c = GetParam();
  const LaunchEnvironment launch = read_launch_environment([&](const char* name) -> const char* {
    const auto found = c.environment.find(name);
    return found == c.environment.end() ? nullptr : found->second.c_str();
  });
  EXPECT_EQ(launch.torchrun_size, c.size);
  EXPECT_EQ(launch.torchrun_rank, c.rank);
  EXPECT_EQ(launch.torchrun_variables, c.variables);
  EXPECT_EQ(launch.torchrun_world(), c.world);
  if (launch.torchrun_size > 0) {  // no MPI launcher: neither launched nor several MPI ranks
    EXPECT_FALSE(launch.launched());
    EXPECT_FALSE(launch.several_ranks());
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, TorchrunEnvironments, testing::ValuesIn(torchrun_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pipesgd
