#pragma once
// Allreduce: every rank ends with the element-wise sum over all ranks of its `data`.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "pipesgd/comm/transport.h"

namespace pipesgd {

// Segmenting of the allreduce's messages (AllreduceOptions::segment_bytes).
inline constexpr std::size_t kDefaultSegmentBytes = 256 * 1024;  // best standalone ring time here
inline constexpr std::size_t kUnsegmented = SIZE_MAX;  // one message per chunk and step
inline constexpr std::size_t kAutoSegmentBytes = 0;    // training methods: pick their own (see algo/)

struct AllreduceOptions {
  Timeout timeout = std::chrono::seconds(120);  // for every single wait on a peer
  // Messages are cut into segments of about this many fp32 bytes so that reducing one segment
  // overlaps the transfer of the next (pipelining within the allreduce, Pipe-SGD Fig. 3a).
  // Each segment costs a message (latency, a wake-up); kUnsegmented sends whole chunks.
  std::size_t segment_bytes = kDefaultSegmentBytes;
};

// Parses a segment size: "auto", "none" (unsegmented) or a size such as 256K or 1M. Throws
// UsageError naming `name` (the option that gave it).
std::size_t parse_segment_bytes(const std::string& text, const char* name = "segment size");
// "256 KiB", "unsegmented" or "auto".
std::string describe_segment_bytes(std::size_t segment_bytes);

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
