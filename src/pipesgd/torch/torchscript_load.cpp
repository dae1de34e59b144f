#include "pipesgd/torch/torchscript_load.h"

#include <caffe2/serialize/inline_container.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <sstream>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {

std::string torch_error_line(const std::exception& error) {
  std::string text = error.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) text = c10_error->what_without_backtrace();
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
  }
  if (lines.empty()) return "no message";
  const bool script_traceback = text.find("Traceback of TorchScript") != std::string::npos;
  return script_traceback ? lines.back() : lines.front();
}

namespace {

// LibTorch 1.13's unpickler trusts the numbers in a pickle: a memo index (BINPUT, LONG_BINPUT) sizes
// its memo table and a length prefix sizes a string before the bytes are read, so a 5 KB file can make
// it allocate and fill gigabytes (the process is then killed; found by fuzz/torchscript_load). This
// walks each pickle's opcodes (Python's pickle protocol 2-5 argument formats) before LibTorch reads
// it and returns why it refuses it: an unknown opcode, an argument running past the record, a length
// larger than the rest of the record, or a memo index larger than the record. It does not interpret
// the pickle; LibTorch does.
std::optional<std::string> pickle_problem(const std::uint8_t* data, std::size_t size) {
  std::size_t at = 0;
  const auto take = [&](std::size_t bytes) -> std::optional<std::uint64_t> {
    if (bytes > size - at) return std::nullopt;
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < bytes; ++i) value |= std::uint64_t{data[at + i]} << (8 * i);
    at += bytes;
    return value;
  };
  const auto skip_line = [&]() -> std::optional<std::string> {
    const void* end = std::memchr(data + at, '\n', size - at);
    if (end == nullptr) return std::nullopt;
    const std::size_t length = static_cast<const std::uint8_t*>(end) - (data + at);
    std::string line(reinterpret_cast<const char*>(data + at), length);
    at += length + 1;
    return line;
  };
  while (at < size) {
    const std::uint8_t opcode = data[at++];
    std::size_t fixed = 0, length_bytes = 0, lines = 0;
    bool memo_index = false;
    switch (opcode) {
      case '.': return std::nullopt;  // STOP
      case 0x80: case 'K': case 0x82: case 'h': fixed = 1; break;
      case 'M': case 0x83: fixed = 2; break;
      case 'J': case 'j': case 0x84: fixed = 4; break;
      case 'G': case 0x95: fixed = 8; break;
      case 'q': fixed = 1; memo_index = true; break;
      case 'r': fixed = 4; memo_index = true; break;
      case 'U': case 'C': case 0x8c: case 0x8a: length_bytes = 1; break;
      case 'T': case 'X': case 'B': case 0x8b: length_bytes = 4; break;
      case 0x8d: case 0x8e: case 0x96: length_bytes = 8; break;
      case 'c': case 'i': lines = 2; break;
      case 'I': case 'L': case 'S': case 'V': case 'F': case 'g': case 'P': lines = 1; break;
      case 'p': lines = 1; memo_index = true; break;
      case '(': case '0': case '1': case '2': case 'N': case 0x88: case 0x89: case 'a': case 'e': case 'b':
      case 'd': case '}': case 'l': case ']': case 'o': case 'R': case 's': case 'u': case 't': case ')':
      case 0x85: case 0x86: case 0x87: case 0x81: case 'Q': case 0x8f: case 0x90: case 0x91: case 0x92:
      case 0x93: case 0x94: case 0x97: case 0x98:
        break;
      default: return concat("unknown pickle opcode ", static_cast<int>(opcode), " at byte ", at - 1);
    }
    if (fixed > 0) {
      const std::optional<std::uint64_t> value = take(fixed);
      if (!value) return concat("pickle ends inside an argument at byte ", at);
      if (memo_index && *value > size) return concat("pickle memo index ", *value, " beyond its ", size, " bytes");
    }
    if (length_bytes > 0) {
      const std::optional<std::uint64_t> length = take(length_bytes);
      if (!length || *length > size - at) return concat("pickle length runs past its end at byte ", at);
      at += static_cast<std::size_t>(*length);
    }
    for (std::size_t line = 0; line < lines; ++line) {
      const std::optional<std::string> text = skip_line();
      if (!text) return concat("pickle ends inside a text argument at byte ", at);
      if (memo_index && (text->size() > 18 || std::strtoull(text->c_str(), nullptr, 10) > size)) {
        return concat("pickle memo index beyond its ", size, " bytes");
      }
    }
  }
  return std::string("pickle has no STOP opcode");
}

// The `width`-byte little-endian integer at data[at] (the zip format's integers).
std::uint64_t read_le(const std::uint8_t* data, std::uint64_t at, int width) {
  std::uint64_t value = 0;
  for (int i = 0; i < width; ++i) value |= std::uint64_t{data[at + i]} << (8 * i);
  return value;
}

// One entry of a zip's central directory, its sizes and offset as zip64 gives them where it does.
struct ZipEntry {
  std::string name;
  std::uint64_t method = 0, compressed = 0, uncompressed = 0, local_header = 0, crc32 = 0;
};

// Reads the central directory the way LibTorch 1.13's miniz 2.1 does: the last end-of-central-directory
// signature with a whole record after it, then the zip64 locator and record if there are any, then
// each entry with its zip64 extended information field (id 1) for the fields marked 0xFFFFFFFF.
// nullopt for a directory miniz would refuse itself (a structural error it reports).
std::optional<std::vector<ZipEntry>> read_zip_directory(std::string_view bytes) {
  const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const std::uint64_t size = bytes.size();
  const auto le = [data](std::uint64_t at, int width) { return read_le(data, at, width); };
  constexpr std::uint64_t kEndRecordSize = 22, kLocatorSize = 20, kZip64EndRecordSize = 56, kEntrySize = 46;
  constexpr std::uint64_t kMax32 = 0xFFFFFFFFu;
  if (size < kEndRecordSize) return std::nullopt;
  std::uint64_t end_record = size - kEndRecordSize + 1;
  do {
    --end_record;
  } while (end_record > 0 && le(end_record, 4) != 0x06054b50u);
  if (le(end_record, 4) != 0x06054b50u) return std::nullopt;
  std::uint64_t entries = le(end_record + 10, 2), directory_size = le(end_record + 12, 4);
  std::uint64_t directory = le(end_record + 16, 4);
  if (end_record >= kLocatorSize + kZip64EndRecordSize && le(end_record - kLocatorSize, 4) == 0x07064b50u) {
    const std::uint64_t zip64_end = le(end_record - kLocatorSize + 8, 8);
    if (zip64_end <= size - kZip64EndRecordSize && le(zip64_end, 4) == 0x06064b50u) {
      entries = le(zip64_end + 32, 8);
      directory_size = le(zip64_end + 40, 8);
      directory = le(zip64_end + 48, 8);
    }
  }
  if (directory > size || directory_size > size - directory) return std::nullopt;
  std::vector<ZipEntry> result;
  std::uint64_t at = directory;
  const std::uint64_t directory_end = directory + directory_size;
  for (std::uint64_t entry = 0; entry < entries; ++entry) {
    if (directory_end - at < kEntrySize || le(at, 4) != 0x02014b50u) return std::nullopt;
    ZipEntry record;
    record.method = le(at + 10, 2);
    record.crc32 = le(at + 16, 4);
    record.compressed = le(at + 20, 4);
    record.uncompressed = le(at + 24, 4);
    const std::uint64_t name_size = le(at + 28, 2), extra_size = le(at + 30, 2), comment_size = le(at + 32, 2);
    record.local_header = le(at + 42, 4);
    if (kEntrySize + name_size + extra_size + comment_size > directory_end - at) return std::nullopt;
    record.name = std::string(bytes.substr(at + kEntrySize, name_size));
    if (std::max({record.compressed, record.uncompressed, record.local_header}) == kMax32) {
      for (std::uint64_t field = at + kEntrySize + name_size, extra_end = field + extra_size;
           extra_end - field >= 4;) {
        const std::uint64_t id = le(field, 2), field_size = le(field + 2, 2);
        if (field_size > extra_end - field - 4) break;
        if (id == 1) {  // the 8-byte values of the marked fields, in this order
          std::uint64_t value = field + 4;
          const std::uint64_t value_end = value + field_size;
          for (std::uint64_t* marked : {&record.uncompressed, &record.compressed, &record.local_header}) {
            if (*marked == kMax32 && value_end - value >= 8) *marked = le(value, 8), value += 8;
          }
          break;
        }
        field += 4 + field_size;
      }
    }
    result.push_back(std::move(record));
    at += kEntrySize + name_size + extra_size + comment_size;
  }
  return result;
}

// Why the bytes of `record` are not what its directory entry says, or nullopt: its local header
// missing, its data past the end of the file, a deflate stream that does not inflate to exactly the
// declared size, or a CRC-32 other than the declared one. Reads the record in place (inflating through
// a fixed buffer), so it allocates nothing the size of the record.
std::optional<std::string> zip_record_content_problem(std::string_view bytes, const ZipEntry& record) {
  const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const std::uint64_t size = bytes.size();
  constexpr std::uint64_t kLocalHeaderSize = 30;
  const std::uint64_t header = record.local_header;
  if (header > size || size - header < kLocalHeaderSize || read_le(data, header, 4) != 0x04034b50u) {
    return concat("zip record ", record.name, " has no local header at byte ", header);
  }
  const std::uint64_t name_and_extra = read_le(data, header + 26, 2) + read_le(data, header + 28, 2);
  const std::uint64_t start = header + kLocalHeaderSize + name_and_extra;
  if (start > size || record.compressed > size - start) {
    return concat("zip record ", record.name, " runs past the end of the file");
  }
  std::uint64_t crc = 0;
  if (record.method == 0) {
    crc = crc32_z(0, data + start, static_cast<z_size_t>(record.compressed));
  } else {
    z_stream stream{};
    if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) throw std::runtime_error("zlib: inflateInit2 failed");
    std::vector<std::uint8_t> buffer(std::size_t{1} << 16);
    std::uint64_t inflated = 0, input_left = record.compressed;
    const std::uint8_t* input = data + start;
    int status = Z_OK;
    while (status == Z_OK && inflated <= record.uncompressed) {
      if (stream.avail_in == 0 && input_left > 0) {
        const auto chunk = static_cast<uInt>(std::min<std::uint64_t>(input_left, 1u << 30));
        stream.next_in = const_cast<Bytef*>(input);
        stream.avail_in = chunk;
        input += chunk;
        input_left -= chunk;
      }
      stream.next_out = buffer.data();
      stream.avail_out = static_cast<uInt>(buffer.size());
      status = inflate(&stream, Z_NO_FLUSH);  // Z_BUF_ERROR: the stream ends before its end marker
      const std::uint64_t produced = buffer.size() - stream.avail_out;
      crc = crc32_z(crc, buffer.data(), static_cast<z_size_t>(produced));
      inflated += produced;
    }
    inflateEnd(&stream);
    if (status != Z_STREAM_END || inflated != record.uncompressed) {
      return concat("zip record ", record.name, " does not inflate to its declared ", record.uncompressed, " bytes");
    }
  }
  if (crc != record.crc32) return concat("zip record ", record.name, " fails its CRC-32 check (the file is damaged)");
  return std::nullopt;
}

// LibTorch 1.13's zip reader (its bundled miniz) allocates the uncompressed size a record's central
// directory entry declares before it reads the record, and PyTorchStreamReader's constructor already
// reads the "version" record; so a 5 KB file declaring 4.2 GB made it allocate 4.2 GB; and it is built
// without miniz's CRC-32 checks, so a damaged code/*.py record reached TorchScript's source parser,
// which crashed on it (SEGV; both found by fuzz/torchscript_load). This returns why it refuses the
// file before LibTorch sees it: first any entry with a method miniz cannot extract (other than 0
// stored, 8 deflate), a compressed size past the file, or an uncompressed size the compressed bytes
// cannot hold (stored: equal; deflate: at most kDeflateMaxRatio times); then any record whose bytes
// are not what its entry says (zip_record_content_problem). Structural errors of the directory it
// leaves to miniz, which reports them.
std::optional<std::string> zip_record_problem(std::string_view bytes) {
  constexpr std::uint64_t kDeflateMaxRatio = 1032;  // 258 bytes per 2-bit length/distance pair
  const std::optional<std::vector<ZipEntry>> entries = read_zip_directory(bytes);
  if (!entries) return std::nullopt;
  for (const ZipEntry& record : *entries) {
    if (record.method != 0 && record.method != 8) {
      return concat("zip record ", record.name, " has compression method ", record.method);
    }
    if (record.compressed > bytes.size()) {
      return concat("zip record ", record.name, " declares ", record.compressed, " compressed bytes in a ",
                    bytes.size(), "-byte file");
    }
    const std::uint64_t most = record.method == 0 ? record.compressed : record.compressed * kDeflateMaxRatio;
    if (record.uncompressed > most) {
      return concat("zip record ", record.name, " declares ", record.uncompressed, " bytes from ", record.compressed,
                    record.method == 0 ? " stored bytes" : " deflated bytes");
    }
  }
  for (const ZipEntry& record : *entries) {
    if (std::optional<std::string> problem = zip_record_content_problem(bytes, record)) return problem;
  }
  return std::nullopt;
}

// Opens the zip container with LibTorch's reader and checks every pickle in it (pickle_problem),
// .debug_pkl records included (a corrupt one made LibTorch allocate 1.8 GB; fuzz/torchscript_load).
void check_container(std::string_view bytes) {
  if (const std::optional<std::string> problem = zip_record_problem(bytes)) throw std::runtime_error(*problem);
  std::istringstream stream{std::string(bytes)};
  caffe2::serialize::PyTorchStreamReader reader(&stream);
  for (const std::string& record : reader.getAllRecords()) {
    // data.pkl, constants.pkl and the source-range records code/....debug_pkl: all unpickled.
    if (record.size() < 3 || record.compare(record.size() - 3, 3, "pkl") != 0) continue;
    auto [data, size] = reader.getRecord(record);
    if (const std::optional<std::string> problem = pickle_problem(static_cast<const std::uint8_t*>(data.get()), size)) {
      throw std::runtime_error(concat(record, ": ", *problem));
    }
  }
}

}  // namespace

torch::jit::Module load_torchscript(std::string_view bytes, const std::string& name) {
  try {
    check_container(bytes);
    std::istringstream stream{std::string(bytes)};
    return torch::jit::load(stream, torch::kCPU);
  } catch (const std::exception& error) {
    throw DataError(concat("model file '", name, "' is not a TorchScript module saved by torch.jit.save (",
                           torch_error_line(error), ")"));
  }
}

void check_torchscript_bytes(std::string_view bytes, const std::string& name) { (void)load_torchscript(bytes, name); }

}  // namespace pipesgd
