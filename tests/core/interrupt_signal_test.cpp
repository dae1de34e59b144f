// SIGINT / SIGTERM handling (core/interrupt.h): the first request sets the flag and the process goes
// on; the same request delivered twice stays one; a second request ends the process with the
// signal's default action. Each case runs in a child process (a death test): the handlers and the
// flag are the process's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

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

}  // namespace
}  // namespace pipesgd
