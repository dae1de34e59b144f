#include "pipesgd/core/heap_retention.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace pipesgd {

bool keep_freed_memory_in_heap() {
#if defined(__GLIBC__)
  // mallopt returns 1 on success; both values are within glibc's limits on 64-bit.
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHeapMmapThreshold)) == 1;
  const bool trim_set = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHeapTrimThreshold)) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace pipesgd
