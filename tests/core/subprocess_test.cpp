// core/subprocess.h: a program found on PATH, its exit status and stderr, the time limit that kills
// it, and the one-line description of a failure.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "pipesgd/core/error.h"
#include "pipesgd/core/subprocess.h"

namespace pipesgd {
namespace {

using std::chrono::milliseconds;

TEST(FindProgram, OnPathOrByItsPath) {
  const std::optional<std::filesystem::path> shell = find_program("sh");
  ASSERT_TRUE(shell);
  EXPECT_EQ(shell->filename(), "sh");
  EXPECT_EQ(find_program("/bin/sh"), std::filesystem::path("/bin/sh"));
  EXPECT_EQ(find_program("pipesgd-no-such-program"), std::nullopt);
  EXPECT_EQ(find_program("/nonexistent/sh"), std::nullopt);
  EXPECT_EQ(find_program(""), std::nullopt);
}

TEST(RunProgram, ReportsExitStatusAndStandardError) {
  const ProgramResult result = run_program({"sh", "-c", "echo to-stdout; echo first >&2; echo second >&2; exit 3"},
                                           milliseconds(10000));
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.signal, 0);
  EXPECT_FALSE(result.timed_out);
  EXPECT_FALSE(result.succeeded());
  EXPECT_EQ(result.standard_error, "first\nsecond\n");
  EXPECT_EQ(describe_program_failure("sh", result), "sh exited with status 3: first | second");
  EXPECT_TRUE(run_program({"true"}, milliseconds(10000)).succeeded());
}

TEST(RunProgram, KillsAProgramPastItsTimeLimit) {
  // Killed (SIGKILL) by the limit, not ended by itself: no time is asserted (a hang would be the
  // test's own timeout).
  const ProgramResult result = run_program({"sleep", "30"}, milliseconds(200));
  EXPECT_TRUE(result.timed_out);
  EXPECT_FALSE(result.succeeded());
  EXPECT_EQ(result.signal, SIGKILL);
  EXPECT_EQ(describe_program_failure("sleep", result), "sleep did not finish in time and was stopped");
}

TEST(RunProgram, AProgramThatClosesStderrEarlyIsStillWaitedFor) {
  const ProgramResult result = run_program({"sh", "-c", "exec 2>&-; sleep 0.2; exit 4"}, milliseconds(10000));
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 4);
}

TEST(RunProgram, AMissingProgramIsAnErrorNamingIt) {
  try {
    run_program({"pipesgd-no-such-program", "x"}, milliseconds(1000));
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot run pipesgd-no-such-program"), std::string::npos) << error.what();
  }
}

TEST(DescribeProgramFailure, OneLineCutShort) {
  ProgramResult result;
  result.exit_code = 1;
  result.standard_error = "\n  \"r.gp\" line 3: undefined variable: x  \n\n" + std::string(1000, 'y') + "\n";
  const std::string line = describe_program_failure("gnuplot", result);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line.rfind("gnuplot exited with status 1: \"r.gp\" line 3: undefined variable: x | yyy", 0), 0u) << line;
  EXPECT_LT(line.size(), 400u);
  result.exit_code = -1;
  result.signal = 9;
  result.standard_error.clear();
  EXPECT_EQ(describe_program_failure("gnuplot", result), "gnuplot was killed by signal 9");
}

}  // namespace
}  // namespace pipesgd
