#pragma once
// Layout of a flat fp32 buffer: one Segment per layer, in forward order, contiguous and without gaps.
// All parameters of a replica live in one buffer and all gradients in another of the same layout, so
// a bucket of consecutive layers is one contiguous range.
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace pipesgd {

struct Segment {
  std::string name;    // e.g. "fc1" (weight and bias of one layer)
  std::size_t offset;  // first element in the flat buffer
  std::size_t count;   // number of fp32 elements
};

class Layout {
 public:
  // Appends a segment right after the previous one; returns its index.
  std::size_t add(std::string name, std::size_t count);

  const std::vector<Segment>& segments() const { return segments_; }
  const Segment& segment(std::size_t index) const { return segments_.at(index); }
  std::size_t segment_count() const { return segments_.size(); }
  std::size_t total() const { return total_; }

  // The elements of segment `index` inside a buffer laid out by this layout.
  template <typename T>
  std::span<T> slice(std::span<T> buffer, std::size_t index) const {
    const Segment& s = segments_.at(index);
    return buffer.subspan(s.offset, s.count);
  }

 private:
  std::vector<Segment> segments_;
  std::size_t total_ = 0;
};

}  // namespace pipesgd
