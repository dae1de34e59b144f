#include "pipesgd/comm/launch_environment.h"

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

namespace pipesgd {
namespace {

// The value of a variable that holds a whole number >= `minimum`, else `unknown`.
int number_or(const char* text, int minimum, int unknown) {
  if (text == nullptr) return unknown;
  int value = 0;
  const char* end = text + std::strlen(text);
  const auto [stop, error] = std::from_chars(text, end, value);
  return error == std::errc() && stop == end && stop != text && value >= minimum ? value : unknown;
}

// A variable's value for a one-line message: control characters as '?', at most 64 characters.
std::string printable(const char* text) {
  constexpr std::size_t kLongest = 64;
  std::string value;
  for (const char* c = text; *c != '\0'; ++c) {
    if (value.size() == kLongest) return value + "...";
    const auto byte = static_cast<unsigned char>(*c);
    value.push_back(byte < 0x20 || byte == 0x7f ? '?' : *c);
  }
  return value;
}

// RANK and WORLD_SIZE as torchrun (torch.distributed.run) sets them, and its other variables that
// are set, in a fixed order.
void read_torchrun(const std::function<const char*(const char*)>& lookup, LaunchEnvironment& launch) {
  const int size = number_or(lookup("WORLD_SIZE"), 1, 0);
  const int rank = number_or(lookup("RANK"), 0, -1);
  if (size == 0 || rank < 0) return;
  launch.torchrun_size = size;
  launch.torchrun_rank = rank;
  static constexpr const char* kVariables[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
  for (const char* name : kVariables) {
    const char* value = lookup(name);
    if (value == nullptr) continue;
    if (!launch.torchrun_variables.empty()) launch.torchrun_variables += ' ';
    launch.torchrun_variables += std::string(name) + "=" + printable(value);
  }
}

}  // namespace

LaunchEnvironment read_launch_environment(const std::function<const char*(const char*)>& lookup) {
  struct Launcher {
    const char* name;
    const char* size;  // nullptr: the launcher does not say
    const char* rank;
  };
  static constexpr Launcher kLaunchers[] = {{"mpirun", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
                                            {"a PMI launcher", "PMI_SIZE", "PMI_RANK"},
                                            {"a PMIx launcher", nullptr, "PMIX_RANK"}};
  for (const Launcher& launcher : kLaunchers) {
    const char* size = launcher.size != nullptr ? lookup(launcher.size) : nullptr;
    const char* rank = lookup(launcher.rank);
    if (size == nullptr && rank == nullptr) continue;
    LaunchEnvironment launch;
    launch.launcher = launcher.name;
    launch.size = number_or(size, 1, 0);
    launch.rank = number_or(rank, 0, -1);
    return launch;
  }
  LaunchEnvironment launch;
  read_torchrun(lookup, launch);
  return launch;
}

LaunchEnvironment launch_environment() {
  return read_launch_environment([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace pipesgd
