#include "pipesgd/comm/transport.h"

#include "pipesgd/core/error.h"

namespace pipesgd {

std::string describe_tag(Tag tag) {
  const TagFields fields = decode_tag(tag);
  const char* names[kChannelCount] = {"gradients", "control", "benchmark", "ps", "planning", "consistency",
                                         "negotiation", "collectives"};
  const std::string channel_name = fields.channel < static_cast<unsigned>(kChannelCount)
                                       ? names[fields.channel]
                                       : concat("channel", fields.channel);
  return concat("tag ", channel_name, ":", fields.sequence, " step ", fields.step, " segment ", fields.segment);
}

std::string describe_message_wait(const char* operation, bool is_send, int peer, Tag tag, int rank) {
  return concat(operation, ": ", is_send ? "send to" : "recv from", " rank ", peer, " (", describe_tag(tag), ") on rank ",
                rank);
}

}  // namespace pipesgd
