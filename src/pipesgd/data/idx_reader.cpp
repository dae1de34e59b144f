#include "pipesgd/data/idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <type_traits>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// The payload buffer grows only as data arrives: each read asks for as many bytes as were read so
// far (at least the first size, at most the largest), so a header claiming a huge size cannot make
// us allocate much more memory than the input actually holds, and large files need few
// reallocations.
constexpr std::size_t kFirstPayloadReadBytes = std::size_t{64} << 10;
constexpr std::size_t kLargestPayloadReadBytes = std::size_t{16} << 20;
// Trailing bytes are counted up to this limit; beyond it the message says "more than".
constexpr std::size_t kTrailingBytesCountLimit = std::size_t{1} << 20;

[[noreturn]] void fail(const std::string& source_name, const std::string& problem) {
  throw DataError(concat("data file ", source_name, ": ", problem));
}

std::string hex_byte(std::uint8_t value) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  return std::string{'0', 'x', kDigits[value >> 4], kDigits[value & 0x0F]};
}

const char* idx_type_name(std::uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "16-bit integer";
    case 0x0C:
      return "32-bit integer";
    case 0x0D:
      return "32-bit float";
    case 0x0E:
      return "64-bit float";
    default:
      return "not an IDX type";
  }
}

// A sequential source of decompressed bytes.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Copies up to `count` bytes into `destination`; returns fewer only at the end of the data.
  // Throws DataError on I/O or decompression errors.
  virtual std::size_t read(std::uint8_t* destination, std::size_t count) = 0;
  // Explains an early end of data, e.g. " (the gzip stream is cut off)"; empty if the data simply
  // ended. Valid after read() returned fewer bytes than asked.
  virtual std::string end_note() const { return {}; }
};

class MemorySource final : public ByteSource {
 public:
  explicit MemorySource(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}

  std::size_t read(std::uint8_t* destination, std::size_t count) override {
    const std::size_t available = std::min(count, bytes_.size() - position_);
    if (available > 0) std::memcpy(destination, bytes_.data() + position_, available);
    position_ += available;
    return available;
  }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t position_ = 0;
};

// Reads a gzip-compressed or plain file through zlib (gzread passes plain files through).
class GzipFileSource final : public ByteSource {
 public:
  explicit GzipFileSource(const std::string& path) : path_(path) {
    std::error_code status_error;
    const auto status = std::filesystem::status(path, status_error);
    if (!std::filesystem::exists(status)) fail(path, "not found");
    if (std::filesystem::is_directory(status)) fail(path, "is a directory, not a file");
    errno = 0;
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) {
      fail(path, concat("cannot open: ", errno != 0 ? std::strerror(errno) : "out of memory"));
    }
    gzbuffer(file_.get(), 1u << 17);  // larger than the 8 KiB default; must precede the first read
  }

  std::size_t read(std::uint8_t* destination, std::size_t count) override {
    std::size_t total = 0;
    while (total < count) {
      const std::size_t request = std::min<std::size_t>(count - total, 1u << 30);
      const int got = gzread(file_.get(), destination + total, static_cast<unsigned>(request));
      if (got < 0) fail(path_, describe_zlib_error());
      if (got == 0) break;
      total += static_cast<std::size_t>(got);
    }
    if (total < count) {
      int error_number = Z_OK;
      gzerror(file_.get(), &error_number);
      // Z_BUF_ERROR: the compressed stream ended before its end marker.
      stream_cut_off_ = error_number == Z_BUF_ERROR;
      if (error_number != Z_OK && error_number != Z_BUF_ERROR) {
        fail(path_, describe_zlib_error());
      }
    }
    return total;
  }

  std::string end_note() const override {
    return stream_cut_off_ ? " (the gzip stream is cut off)" : "";
  }

 private:
  struct GzipCloser {
    void operator()(gzFile file) const { gzclose(file); }
  };

  // The current zlib error as a problem description. zlib's own message loses its "<path>: "
  // prefix, since our messages already name the file.
  std::string describe_zlib_error() const {
    int error_number = Z_OK;
    const char* message = gzerror(file_.get(), &error_number);
    if (error_number == Z_ERRNO) return concat("read error: ", std::strerror(errno));
    std::string text = message != nullptr ? message : "unknown zlib error";
    const std::string prefix = path_ + ": ";
    if (text.compare(0, prefix.size(), prefix) == 0) text.erase(0, prefix.size());
    if (error_number == Z_DATA_ERROR) return concat("corrupt gzip data: ", text);
    return concat("read error: ", text);
  }

  std::string path_;
  std::unique_ptr<std::remove_pointer_t<gzFile>, GzipCloser> file_;
  bool stream_cut_off_ = false;
};

std::string describe_dims(const std::vector<std::uint32_t>& dims) {
  std::string text;
  for (std::size_t index = 0; index < dims.size(); ++index) {
    if (index > 0) text += 'x';
    text += std::to_string(dims[index]);
  }
  return text;
}

// "60000x28x28 = 47040000 bytes" for several dimensions, "10000 bytes" for one.
std::string describe_payload(const std::vector<std::uint32_t>& dims, std::size_t element_count) {
  if (dims.size() == 1) return concat(element_count, " bytes");
  return concat(describe_dims(dims), " = ", element_count, " bytes");
}

IdxArray parse_from(ByteSource& source, const std::string& source_name) {
  std::array<std::uint8_t, 4> magic{};
  const std::size_t magic_got = source.read(magic.data(), magic.size());
  if (magic_got < magic.size()) {
    fail(source_name, concat("truncated: header needs 4 bytes of magic number, found ", magic_got,
                             source.end_note()));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    fail(source_name, concat("not an IDX file: magic number starts with ", hex_byte(magic[0]), " ",
                             hex_byte(magic[1]), ", expected two zero bytes"));
  }
  const std::uint8_t element_type = magic[2];
  if (element_type != kIdxTypeUnsignedByte) {
    fail(source_name, concat("unsupported element type ", hex_byte(element_type), " (",
                             idx_type_name(element_type), "); only ",
                             hex_byte(kIdxTypeUnsignedByte), " (unsigned byte) is supported"));
  }
  const std::size_t dimension_count = magic[3];
  if (dimension_count < 1 || dimension_count > kIdxMaxDimensions) {
    fail(source_name, concat("unsupported number of dimensions ", dimension_count,
                             "; expected 1 to ", kIdxMaxDimensions));
  }

  std::array<std::uint8_t, 4 * kIdxMaxDimensions> dimension_bytes{};
  const std::size_t dimension_bytes_expected = 4 * dimension_count;
  const std::size_t dimension_bytes_got =
      source.read(dimension_bytes.data(), dimension_bytes_expected);
  if (dimension_bytes_got < dimension_bytes_expected) {
    fail(source_name, concat("truncated: header says ", dimension_count, " dimensions (",
                             dimension_bytes_expected, " bytes of sizes), found ",
                             dimension_bytes_got, source.end_note()));
  }

  IdxArray array;
  array.element_type = element_type;
  array.dims.resize(dimension_count);
  std::size_t element_count = 1;
  for (std::size_t index = 0; index < dimension_count; ++index) {
    const std::uint8_t* bytes = dimension_bytes.data() + 4 * index;
    const std::uint32_t size = (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
                               (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
    array.dims[index] = size;
  }
  for (std::size_t index = 0; index < dimension_count; ++index) {
    if (array.dims[index] == 0) {
      fail(source_name,
           concat("dimension ", index, " is zero (header sizes ", describe_dims(array.dims), ")"));
    }
  }
  for (std::uint32_t size : array.dims) {
    if (element_count > std::numeric_limits<std::size_t>::max() / size) {
      fail(source_name,
           concat("header sizes ", describe_dims(array.dims), " overflow the element count"));
    }
    element_count *= size;
  }

  std::size_t payload_got = 0;
  while (payload_got < element_count) {
    const std::size_t read_size =
        std::clamp(payload_got, kFirstPayloadReadBytes, kLargestPayloadReadBytes);
    const std::size_t request = std::min(element_count - payload_got, read_size);
    array.data.resize(payload_got + request);
    const std::size_t got = source.read(array.data.data() + payload_got, request);
    payload_got += got;
    if (got < request) {
      fail(source_name,
           concat("truncated: header says ", describe_payload(array.dims, element_count),
                  " of data, found ", payload_got, source.end_note()));
    }
  }
  PIPESGD_ASSERT(array.data.size() == element_count);

  std::array<std::uint8_t, 4096> trailing{};
  std::size_t trailing_count = 0;
  while (trailing_count <= kTrailingBytesCountLimit) {
    const std::size_t got = source.read(trailing.data(), trailing.size());
    trailing_count += got;
    if (got < trailing.size()) break;
  }
  if (trailing_count > kTrailingBytesCountLimit) {
    fail(source_name,
         concat("more than ", kTrailingBytesCountLimit, " unexpected trailing bytes after ",
                element_count, " bytes of data (header sizes ", describe_dims(array.dims), ")"));
  }
  if (trailing_count > 0) {
    fail(source_name, concat(trailing_count, " unexpected trailing bytes after ", element_count,
                             " bytes of data (header sizes ", describe_dims(array.dims), ")"));
  }
  // The data is complete, but a gzip stream cut off before its checksum is still damaged.
  const std::string end_note = source.end_note();
  if (!end_note.empty()) {
    fail(source_name, concat("truncated after ", element_count, " bytes of data", end_note));
  }
  return array;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  GzipFileSource source(path);
  return parse_from(source, path);
}

IdxArray parse_idx(std::span<const std::uint8_t> bytes, const std::string& source_name) {
  MemorySource source(bytes);
  return parse_from(source, source_name);
}

}  // namespace pipesgd
