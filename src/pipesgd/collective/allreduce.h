#pragma once
// Allreduce: every rank ends with the element-wise sum over all ranks of its `data`.
#include <chrono>
#include <cstddef>
#include <span>
#include <string_view>

#include "pipesgd/comm/transport.h"

namespace pipesgd {

struct AllreduceOptions {
  Timeout timeout = std::chrono::seconds(120);  // for every single wait on a peer
  // Messages are cut into segments of about this many fp32 bytes so that reducing one segment
  // overlaps the transfer of the next (pipelining within the allreduce, Pipe-SGD Fig. 3a).
  std::size_t segment_bytes = 512 * 1024;
};

// An allreduce algorithm, built once for a maximum element count (buffers allocated up front) and
// run many times. Not thread-safe: one thread runs it at a time. Every rank must call run() with the
// same count and tag, in the same order.
class Allreduce {
 public:
  virtual ~Allreduce() = default;
  virtual std::string_view name() const = 0;
  // In-place sum; data.size() <= the maximum count given at construction. Messages of this call
  // carry tags derived from `tag`; concurrent allreduces over one transport need distinct tags.
  virtual void run(std::span<float> data, Tag tag) = 0;
};

}  // namespace pipesgd
