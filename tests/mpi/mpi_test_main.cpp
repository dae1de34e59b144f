// Entry point of the MPI tests: ctest starts this binary under `mpirun -np N` (N = 2..5) and every
// rank runs every test. Rank 0 prints gtest's usual output; the other ranks print only their failed
// assertions, prefixed with their rank. The exit code is non-zero if any rank failed.
//
// A fatal failure (ASSERT_*, FAIL(), an exception out of a test) on one rank ends the job at once
// (MPI_Abort, with a line naming the rank, the test and the failure): that rank leaves the test
// early, so the others would wait for it in the test's next collective until ctest's timeout, and
// a clean failure would become a 10-minute hang. Tests therefore check with EXPECT_* wherever the
// ranks still have a collective to enter together, so that a failed check fails the test on that
// rank and the job goes on (the exit code gathers every rank's result).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "mpi_test_world.h"

namespace pipesgd {

MpiRuntime* test_mpi_runtime = nullptr;
MpiTransport* test_mpi_transport = nullptr;

namespace {

// Prints failed assertions of a non-zero rank (gtest's default printer is removed there).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  int rank_;
};

// Ends the whole job at a fatal failure on this rank (see the top of this file).
class AbortOnFatalFailure : public ::testing::EmptyTestEventListener {
 public:
  explicit AbortOnFatalFailure(int rank) : rank_(rank) {}
  // Remembered here: UnitTest::current_test_info() takes a lock gtest holds while it reports.
  void OnTestStart(const ::testing::TestInfo& test) override { test_ = &test; }
  void OnTestEnd(const ::testing::TestInfo&) override { test_ = nullptr; }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.fatally_failed()) return;
    const ::testing::TestInfo* test = test_;
    std::fflush(stdout);
    // The failure itself is printed above (by gtest on rank 0, by RankFailurePrinter elsewhere).
    std::fprintf(stderr,
                 "[rank %d] fatal failure in %s.%s at %s:%d: ending every rank (MPI_Abort), since the "
                 "others would wait for this one in the test's next collective\n",
                 rank_, test ? test->test_suite_name() : "?", test ? test->name() : "?",
                 result.file_name() ? result.file_name() : "?", result.line_number());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

 private:
  int rank_;
  const ::testing::TestInfo* test_ = nullptr;
};

}  // namespace
}  // namespace pipesgd

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  pipesgd::MpiRuntime runtime(&argc, &argv);
  pipesgd::test_mpi_runtime = &runtime;
  auto transport = std::make_unique<pipesgd::MpiTransport>(runtime);
  pipesgd::test_mpi_transport = transport.get();
  if (runtime.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new pipesgd::RankFailurePrinter(runtime.rank()));
  }
  // After the printers, so the failure is printed before the job ends.
  ::testing::UnitTest::GetInstance()->listeners().Append(new pipesgd::AbortOnFatalFailure(runtime.rank()));
  const int local_result = RUN_ALL_TESTS();
  transport.reset();  // before MPI_Finalize
  int any_failed = 0;
  MPI_Allreduce(&local_result, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (runtime.rank() == 0 && any_failed && !local_result) {
    std::fprintf(stderr, "a test failed on another rank (see its [rank N] lines)\n");
  }
  return any_failed ? 1 : 0;
}
