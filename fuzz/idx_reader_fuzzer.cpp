// Fuzzes the IDX reader (data/idx_reader.h) on arbitrary bytes, through both entry points:
// parse_idx (in memory) and read_idx (a file, plain or gzip-compressed, read through zlib).
//
// Input layout: byte 0 is the mode, the rest is the content.
//   mode & 3 == 0  parse_idx(content)
//   mode & 3 == 1  read_idx of a file holding content as is (plain, or gzip if it happens to be)
//   mode & 3 == 2  read_idx of a file holding gzip(content)
//   mode & 3 == 3  the same, cut short by 1 + (mode >> 2) bytes (a truncated gzip stream)
// Expected outcome: an IdxArray, or DataError with a non-empty one-line message. Checked as well:
// the returned array is consistent (dims within 1..4, each >= 1, data size = product of dims), and
// the file path agrees with parse_idx on the same decompressed content (same array, or both throw).
// Anything else (another exception, an ASan/UBSan report, an abort, a hang) is a finding.
#include <unistd.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fuzz_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/data/idx_reader.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "idx_reader_fuzzer: %s%s%s\n", what, detail.empty() ? "" : ": ",
               detail.c_str());
  std::abort();
}

// A file of our own in tmpfs when there is one; written for every input and removed after reading.
const std::string& temp_path() {
  static const std::string path = pipesgd_fuzz::temp_file_path("pipesgd_idx_fuzz", ".idx");
  return path;
}

void write_file(const std::string& path, std::span<const std::uint8_t> bytes) {
  if (const char* failure = pipesgd_fuzz::write_whole_file(path, bytes)) finding(failure, path);
}

std::vector<std::uint8_t> gzip(std::span<const std::uint8_t> bytes) {
  z_stream stream{};
  if (deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    finding("deflateInit2 failed");
  }
  std::vector<std::uint8_t> out(deflateBound(&stream, bytes.size()) + 32);
  stream.next_in = const_cast<Bytef*>(bytes.data());
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) finding("deflate failed");
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

// The outcome of one read: the array, or nullopt for a DataError (after checking its message).
template <typename Read>
std::optional<pipesgd::IdxArray> outcome(Read read) {
  try {
    pipesgd::IdxArray array = read();
    if (array.element_type != pipesgd::kIdxTypeUnsignedByte) finding("wrong element type");
    if (array.dims.empty() || array.dims.size() > pipesgd::kIdxMaxDimensions) {
      finding("dimension count out of range");
    }
    std::size_t product = 1;
    for (std::uint32_t size : array.dims) {
      if (size == 0) finding("a zero dimension was accepted");
      product *= size;
    }
    if (array.data.size() != product) finding("data size differs from the product of dims");
    return array;
  } catch (const pipesgd::DataError& error) {
    const std::string message = error.what();
    if (message.empty()) finding("DataError with an empty message");
    if (message.find('\n') != std::string::npos)
      finding("DataError message is not one line", message);
    return std::nullopt;
  }
  // Any other exception escapes: libFuzzer reports it as a crash (uncaught exception).
}

// read_idx of a file holding `bytes`.
std::optional<pipesgd::IdxArray> read_as_file(std::span<const std::uint8_t> bytes) {
  write_file(temp_path(), bytes);
  auto result = outcome([] { return pipesgd::read_idx(temp_path()); });
  std::remove(temp_path().c_str());
  return result;
}

bool same(const std::optional<pipesgd::IdxArray>& a, const std::optional<pipesgd::IdxArray>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->dims == b->dims && a->data == b->data);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::span<const std::uint8_t> content(data + 1, size - 1);
  const auto in_memory = outcome([&] { return pipesgd::parse_idx(content, "<fuzz input>"); });

  switch (mode & 3) {
    case 0:
      return 0;
    case 1: {
      const auto from_file = read_as_file(content);
      // zlib passes a plain file through unless it starts with the gzip magic number.
      const bool plain = content.size() < 2 || content[0] != 0x1f || content[1] != 0x8b;
      if (plain && !same(in_memory, from_file)) finding("read_idx of a plain file != parse_idx");
      return 0;
    }
    case 2: {
      const auto from_file = read_as_file(gzip(content));
      if (!same(in_memory, from_file)) finding("read_idx of a gzip file != parse_idx");
      return 0;
    }
    default: {
      std::vector<std::uint8_t> compressed = gzip(content);
      const std::size_t cut = std::min<std::size_t>(compressed.size(), 1 + (mode >> 2));
      compressed.resize(compressed.size() - cut);
      // A cut-off stream must never be accepted: its checksum (the last 8 bytes) is missing.
      if (read_as_file(compressed)) {
        finding("read_idx accepted a truncated gzip file");
      }
      return 0;
    }
  }
}
