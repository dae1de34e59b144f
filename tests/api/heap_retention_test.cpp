// WorldOptions::keep_freed_memory: run_threads keeps freed memory in glibc's heap (as the CLI does),
// and leaves the C library alone when told not to. Observed through glibc's own statistics
// (mallinfo2: `hblks` counts the blocks served by a mapping of their own, `fordblks` the free bytes
// the heap keeps).
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pipesgd/pipesgd.h"

namespace {

// Below the 32 MiB threshold the API sets, far above glibc's default of 128 KiB (and above anything
// LibTorch's start-up frees, which could raise glibc's dynamic threshold).
constexpr std::size_t kBlockBytes = std::size_t{24} << 20;

struct BlockFate {
  bool mapped = false;           // malloc served it by an mmap of its own
  bool kept_after_free = false;  // after free, the heap still holds at least its bytes as free memory
};

// Allocates, touches and frees one block of kBlockBytes on the calling thread (the main arena).
BlockFate allocate_and_free_block() {
  BlockFate fate;
  const std::size_t mapped_before = mallinfo2().hblks;
  void* block = std::malloc(kBlockBytes);
  if (block == nullptr) throw std::bad_alloc();
  std::memset(block, 1, kBlockBytes);
  fate.mapped = mallinfo2().hblks > mapped_before;
  std::free(block);
  fate.kept_after_free = mallinfo2().fordblks >= kBlockBytes;
  return fate;
}

void run_trivial_world(bool keep_freed_memory) {
  pipesgd::WorldOptions options;
  options.workers = 2;
  options.keep_freed_memory = keep_freed_memory;
  pipesgd::run_threads(options, [](pipesgd::Worker& worker) { worker.barrier(); });
}

TEST(HeapRetention, RunThreadsKeepsFreedMemoryInTheHeapByDefault) {
  run_trivial_world(pipesgd::WorldOptions{}.keep_freed_memory);
  const BlockFate fate = allocate_and_free_block();
  EXPECT_FALSE(fate.mapped) << "a 24 MiB block was mmap'd: the 32 MiB mmap threshold is not in effect";
  EXPECT_TRUE(fate.kept_after_free) << "the freed 24 MiB block was trimmed: the 1 GiB trim threshold is not in effect";
}

// In a fresh process (a death test re-executes this binary): glibc's defaults must still be in
// force after a world created with keep_freed_memory = false, so the same block is mmap'd.
TEST(HeapRetention, RunThreadsLeavesTheAllocatorAloneWhenAsked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        run_trivial_world(false);
        const BlockFate fate = allocate_and_free_block();
        std::fprintf(stderr, "block %s\n", fate.mapped ? "mmapped" : "from the heap");
        std::_Exit(0);
      },
      testing::ExitedWithCode(0), "block mmapped");
}

}  // namespace
