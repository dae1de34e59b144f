#pragma once
// Running another program (`pipesgd report` runs gnuplot): looked up on PATH, run with a time limit,
// its standard error kept for the one-line message of a failure.
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace pipesgd {

// The executable file `name` names: `name` itself if it holds a '/', else the first match on PATH;
// nullopt if there is none.
std::optional<std::filesystem::path> find_program(const std::string& name);

struct ProgramResult {
  int exit_code = -1;          // its exit status; -1 if a signal ended it
  int signal = 0;              // the signal that ended it, 0 if it exited
  bool timed_out = false;      // it ran past the time limit and was killed (SIGKILL)
  std::string standard_error;  // what it wrote on stderr (the first kStandardErrorLimit bytes)
  bool succeeded() const { return exit_code == 0 && !timed_out; }
};

inline constexpr std::size_t kStandardErrorLimit = 64 * 1024;

// Runs `argv` (argv[0] looked up on PATH) with stdin from /dev/null and stdout discarded, and waits
// for it to end, at most `timeout`: then it is killed and reported as timed out. Signals handled
// here are default in it, none blocked. Throws Error naming argv[0] if it cannot be started.
ProgramResult run_program(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

// One line on a run that did not succeed, e.g. "gnuplot exited with status 1: "x.gp" line 3:
// undefined variable: foo" (stderr's non-empty lines joined with " | ", cut at 300 characters).
std::string describe_program_failure(const std::string& program, const ProgramResult& result);

}  // namespace pipesgd
