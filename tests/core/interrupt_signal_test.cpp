// SIGINT / SIGTERM handling (core/interrupt.h): the first request sets the flag and the process goes
// on; the same request delivered twice stays one; a second request ends the process with the
// signal's default action. Each case runs in a child process (a death test): the handlers and the
// flag are the process's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <thread>

#include "pipesgd/core/error_line.h"
#include "pipesgd/core/interrupt.h"

namespace pipesgd {
namespace {

// Exits with 0 if the flag holds `expected`, else 1.
[[noreturn]] void exit_with_flag(int expected) { ::_exit(interrupt_signal().load() == expected ? 0 : 1); }

void pause_for(std::chrono::milliseconds duration) { std::this_thread::sleep_for(duration); }

TEST(InterruptSignalDeathTest, TheFirstRequestSetsTheFlagAndTheProcessGoesOn) {
  EXPECT_EXIT(
      {
        install_interrupt_handlers();
        if (interrupt_signal().load() != 0) ::_exit(2);
        std::raise(SIGTERM);
        exit_with_flag(SIGTERM);
      },
      ::testing::ExitedWithCode(0), "");
}

// coreutils timeout signals the process, then its process group: one request.
TEST(InterruptSignalDeathTest, TheSameSignalTwiceAtOnceIsOneRequest) {
  EXPECT_EXIT(
      {
        install_interrupt_handlers();
        std::raise(SIGINT);
        std::raise(SIGINT);
        exit_with_flag(SIGINT);
      },
      ::testing::ExitedWithCode(0), "");
}

// mpirun answers the terminal's SIGINT with SIGTERM: one request; the flag keeps the first.
TEST(InterruptSignalDeathTest, TheOtherSignalSoonAfterIsTheSameRequest) {
  EXPECT_EXIT(
      {
        install_interrupt_handlers();
        std::raise(SIGINT);
        pause_for(std::chrono::milliseconds(300));
        std::raise(SIGTERM);
        exit_with_flag(SIGINT);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(InterruptSignalDeathTest, ASecondCtrlCEndsTheProcess) {
  EXPECT_EXIT(
      {
        install_interrupt_handlers();
        std::raise(SIGINT);
        pause_for(std::chrono::milliseconds(300));
        std::raise(SIGINT);
        ::_exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGINT), "");
}

TEST(InterruptSignalDeathTest, ALaterSignalOfTheOtherKindEndsTheProcess) {
  EXPECT_EXIT(
      {
        install_interrupt_handlers();
        std::raise(SIGINT);
        pause_for(std::chrono::milliseconds(1300));
        std::raise(SIGTERM);
        ::_exit(0);  // not reached
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

TEST(InterruptSignal, Names) {
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGHUP), "signal 1");
}

TEST(Interruption, ANoticeReadsAsTheSignalAndIsFoundInAFailure) {
  EXPECT_EQ(interruption_notice(SIGTERM), "interrupted by SIGTERM");
  EXPECT_EQ(interruption_in("recv from rank 1 (tag ...) on rank 0 aborted: rank 2 failed: interrupted by SIGINT"), SIGINT);
  EXPECT_EQ(interruption_in("x aborted: rank 2 failed: interrupted by SIGTERM"), SIGTERM);
  EXPECT_EQ(interruption_in("x aborted: rank 2 failed: recv from rank 1 timed out after 4 s"), std::nullopt);
  EXPECT_EQ(interruption_in("interrupted by SIGTERM"), std::nullopt);  // not a rank's failure
}

TEST(InterruptSignalDeathTest, TimeSinceTheFirstRequestCounts) {
  EXPECT_EXIT(
      {
        install_interrupt_handlers();
        if (time_since_interrupt()) std::_Exit(3);
        ::kill(::getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        const auto since = time_since_interrupt();
        std::_Exit(since && *since >= std::chrono::milliseconds(40) && *since < std::chrono::seconds(30) ? 0 : 4);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(ErrorLineDeathTest, AProcessWritesItsErrorLineOnce) {
  EXPECT_EXIT(
      {
        const bool first = write_error_line("rank 1: the first");
        const bool second = write_error_line("rank 1: the second");
        std::_Exit(first && !second ? 0 : 5);
      },
      ::testing::ExitedWithCode(0), "^pipesgd: error: rank 1: the first\n$");
}

}  // namespace
}  // namespace pipesgd
