#pragma once
// The codecs by name, without the codecs themselves (collective/codec.h): their names and the size
// of the message each makes. A header without dependencies, so that timing/ (the model profile's
// codec costs, the planners' gradient bytes on the wire) uses them without depending on the
// codecs' implementation.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace pipesgd {

// "none", "bf16", "int8" (make_codec builds each).
std::vector<std::string> codec_names();

// The exact size of the message that encodes `count` values with the codec `name`
// (Codec::encoded_bytes). Throws UsageError naming the valid codecs for an unknown name, as
// make_codec does.
std::size_t codec_encoded_bytes(std::string_view name, std::size_t count);

}  // namespace pipesgd
