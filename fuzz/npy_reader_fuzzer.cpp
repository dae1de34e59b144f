// Fuzzes the .npy reader (data/npy_reader.h) on arbitrary bytes, through both entry points, and the
// decoding of an accepted array into a data set's inputs and labels/targets.
//
// Input layout: byte 0 is the mode, the rest is the content.
//   mode & 1 == 0  parse_npy(content)
//   mode & 1 == 1  read_npy of a file holding content, which must agree with parse_npy
// Then, for an accepted array, decode_npy_inputs and decode_npy_targets.
// Expected outcome: an NpyArray (data size = product of shape x item size) or DataError with a
// non-empty one-line message; decoded inputs/targets of consistent sizes or DataError. Anything
// else (another exception, an ASan/UBSan report, an abort, a hang, a huge allocation) is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>

#include "fuzz_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/data/npy_reader.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "npy_reader_fuzzer: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

// A file of our own in tmpfs when there is one; written for every input and removed after reading.
const std::string& temp_path() {
  static const std::string path = pipesgd_fuzz::temp_file_path("pipesgd_npy_fuzz", ".npy");
  return path;
}

void write_file(const std::string& path, std::span<const std::uint8_t> bytes) {
  if (const char* failure = pipesgd_fuzz::write_whole_file(path, bytes)) finding(failure, path);
}

void check_message(const pipesgd::DataError& error) {
  const std::string message = error.what();
  if (message.empty()) finding("DataError with an empty message");
  if (message.find('\n') != std::string::npos) finding("DataError message is not one line", message);
}

// Runs `step`; nullopt for a DataError (after checking its message). Other exceptions escape.
template <typename Step>
auto outcome(Step step) -> std::optional<decltype(step())> {
  try {
    return step();
  } catch (const pipesgd::DataError& error) {
    check_message(error);
    return std::nullopt;
  }
}

void check_array(const pipesgd::NpyArray& array) {
  std::size_t elements = 1;
  for (std::size_t dimension : array.shape) elements *= dimension;  // the reader checked the product
  const std::size_t item = array.dtype.size() > 2 ? std::stoul(array.dtype.substr(2)) : 0;
  if (array.data.size() != elements * item) finding("data size differs from the product of shape and item size");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::span<const std::uint8_t> content(data + 1, size - 1);
  const auto in_memory = outcome([&] { return pipesgd::parse_npy(content, "<fuzz input>"); });
  if (mode & 1) {
    write_file(temp_path(), content);
    const auto from_file = outcome([] { return pipesgd::read_npy(temp_path()); });
    std::remove(temp_path().c_str());
    if (in_memory.has_value() != from_file.has_value()) finding("read_npy and parse_npy disagree on acceptance");
    if (in_memory && (in_memory->dtype != from_file->dtype || in_memory->shape != from_file->shape ||
                      in_memory->data != from_file->data)) {
      finding("read_npy and parse_npy return different arrays");
    }
  }
  if (!in_memory) return 0;
  check_array(*in_memory);
  if (const auto inputs = outcome([&] { return pipesgd::decode_npy_inputs(*in_memory, "<fuzz input>"); })) {
    std::size_t features = 1;
    for (std::int64_t dimension : inputs->example_shape) features *= static_cast<std::size_t>(dimension);
    if (inputs->count == 0 || features != inputs->features || inputs->values.size() != inputs->count * features) {
      finding("decoded inputs of inconsistent size");
    }
  }
  if (const auto targets = outcome([&] { return pipesgd::decode_npy_targets(*in_memory, "<fuzz input>"); })) {
    const bool consistent = targets->count > 0 &&
                            (targets->regression() ? targets->labels.empty() &&
                                                         targets->targets.size() == targets->count * targets->target_features
                                                   : targets->labels.size() == targets->count && targets->targets.empty());
    if (!consistent) finding("decoded labels/targets of inconsistent size");
    for (std::int32_t label : targets->labels) {
      if (label < 0) finding("a negative label was accepted");
    }
  }
  return 0;
}
