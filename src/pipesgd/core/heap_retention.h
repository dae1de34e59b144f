#pragma once
// Keeping freed memory in the process's heap (glibc malloc), for training loops.
//
// LibTorch allocates and frees the same large temporaries (activations, per-parameter gradients)
// every iteration. With glibc's defaults (mmap threshold 128 KiB, adjusted upwards only when an
// mmap'd block is freed; trim threshold twice that), blocks above the threshold are mmap'd and
// unmapped, and a thread arena's free top is given back to the kernel, every iteration: each
// iteration then pays fresh page faults on memory it used a moment ago. Measured here, 4 thread
// workers of the LeNet through the C++ API took 70-280 minor page faults per worker and iteration
// and 5-15% longer iterations (scripts/api-overhead-bench.sh, git show d620cdd:docs/results.md).
//
// keep_freed_memory_in_heap() sets M_MMAP_THRESHOLD to 32 MiB and M_TRIM_THRESHOLD to 1 GiB, for
// the whole process (mallopt; this also ends glibc's dynamic adjustment). Blocks below 32 MiB come
// from the heap and stay there when freed. The price: the process keeps up to its peak use of such
// blocks mapped after they are freed. Any thread may call it, any number of times; a no-op where
// the C library is not glibc. The CLI calls it first thing; the API's run_threads / run_mpi call it
// unless WorldOptions::keep_freed_memory is false.
#include <cstddef>

namespace pipesgd {

inline constexpr std::size_t kHeapMmapThreshold = std::size_t{32} << 20;
inline constexpr std::size_t kHeapTrimThreshold = std::size_t{1} << 30;

// True when the setting was applied (glibc), false where it does not exist.
bool keep_freed_memory_in_heap();

}  // namespace pipesgd
