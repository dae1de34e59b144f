// Entry point of the MPI tests: ctest starts this binary under `mpirun -np N` (N = 2..5) and every
// rank runs every test. Rank 0 prints gtest's usual output; the other ranks print only their failed
// assertions, prefixed with their rank. The exit code is non-zero if any rank failed.
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
  const int local_result = RUN_ALL_TESTS();
  transport.reset();  // before MPI_Finalize
  int any_failed = 0;
  MPI_Allreduce(&local_result, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (runtime.rank() == 0 && any_failed && !local_result) {
    std::fprintf(stderr, "a test failed on another rank (see its [rank N] lines)\n");
  }
  return any_failed ? 1 : 0;
}
