#include "pipesgd/comm/transport.h"

#include "pipesgd/core/error.h"

namespace pipesgd {

std::string describe_tag(Tag tag) {
  const auto channel = static_cast<unsigned>(tag >> 56);
  const char* names[kChannelCount] = {"gradients", "control", "benchmark", "ps", "planning", "consistency"};
  const std::string channel_name =
      channel < static_cast<unsigned>(kChannelCount) ? names[channel] : concat("channel", channel);
  return concat("tag ", channel_name, ":", (tag >> 24) & 0xffffffffu, " step ", (tag >> 12) & 0xfff,
                " segment ", tag & 0xfff);
}

}  // namespace pipesgd
