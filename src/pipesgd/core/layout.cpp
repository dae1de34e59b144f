#include "pipesgd/core/layout.h"

namespace pipesgd {

std::size_t Layout::add(std::string name, std::size_t count) {
  segments_.push_back(Segment{std::move(name), total_, count});
  total_ += count;
  return segments_.size() - 1;
}

}  // namespace pipesgd
