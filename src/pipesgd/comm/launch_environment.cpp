#include "pipesgd/comm/launch_environment.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

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
    return LaunchEnvironment{launcher.name, number_or(size, 1, 0), number_or(rank, 0, -1)};
  }
  return {};
}

LaunchEnvironment launch_environment() {
  return read_launch_environment([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace pipesgd
