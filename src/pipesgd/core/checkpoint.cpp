#include "pipesgd/core/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"

namespace pipesgd {

static_assert(std::endian::native == std::endian::little,
              "checkpoint float32 payloads are stored as the host's bytes; the format is little-endian");
static_assert(sizeof(float) == 4);

namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxPartLength = 64;
constexpr std::int64_t kMaxIteration = 999'999'999'999;  // 12 digits
constexpr std::string_view kNamePrefix = "checkpoint-";
constexpr std::string_view kNameSuffix = ".psgd";

// ---- little-endian encoding ----

std::uint32_t load_u32(const std::byte* p) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return value;
}

std::uint64_t load_u64(const std::byte* p) {
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return value;
}

void put_u32(std::vector<std::byte>& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::byte>(value >> (8 * i)));
}

void put_u64(std::vector<std::byte>& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(value >> (8 * i)));
}

std::uint32_t update_crc(std::uint32_t crc, std::span<const std::byte> bytes) {
  const auto* data = reinterpret_cast<const Bytef*>(bytes.data());
  std::size_t left = bytes.size();
  while (left > 0) {
    const std::size_t chunk = std::min<std::size_t>(left, std::size_t{1} << 30);
    crc = static_cast<std::uint32_t>(crc32(crc, data, static_cast<uInt>(chunk)));
    data += chunk;
    left -= chunk;
  }
  return crc;
}

std::uint64_t padding_for(std::uint64_t offset) { return (8 - offset % 8) % 8; }

std::string hex32(std::uint32_t value) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(8) << std::setfill('0') << value;
  return out.str();
}

bool printable(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
}

bool valid_kind(std::uint8_t kind) { return kind >= 1 && kind <= 4; }

// ---- errors ----

std::string errno_text(int error_number) { return std::strerror(error_number); }

// ---- reading ----

struct FormatProblem {
  std::string what;
  std::uint64_t byte;
};

[[noreturn]] void data_error(std::string_view origin, const std::string& what, std::uint64_t byte) {
  throw DataError(concat("checkpoint '", origin, "': ", what, " (byte ", byte, ")"));
}

// ---- directory names ----

bool valid_part(std::string_view part) {
  if (part.empty() || part.size() > kMaxPartLength) return false;
  return std::all_of(part.begin(), part.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

void check_part(const std::string& part) {
  if (!valid_part(part)) {
    throw UsageError(concat("invalid checkpoint part name '", part, "': expected 1..", kMaxPartLength,
                            " characters of [A-Za-z0-9_-]"));
  }
}

using ParsedName = CheckpointName;

// "checkpoint-<12 digits>-<rest>": the iteration and the rest (which may be empty).
std::optional<std::pair<std::int64_t, std::string_view>> split_checkpoint_name(std::string_view name) {
  if (name.size() < kNamePrefix.size() + 12 + 1) return std::nullopt;
  if (name.substr(0, kNamePrefix.size()) != kNamePrefix) return std::nullopt;
  std::int64_t iteration = 0;
  for (std::size_t i = 0; i < 12; ++i) {
    const char c = name[kNamePrefix.size() + i];
    if (c < '0' || c > '9') return std::nullopt;
    iteration = iteration * 10 + (c - '0');
  }
  if (name[kNamePrefix.size() + 12] != '-') return std::nullopt;
  return std::pair{iteration, name.substr(kNamePrefix.size() + 13)};
}

// ".<checkpoint name>.tmp.<anything>": a temporary file of write_atomically (core/atomic_file.h).
std::optional<ParsedName> parse_temp_name(std::string_view name) {
  if (name.empty() || name[0] != '.') return std::nullopt;
  const std::size_t marker = name.find(kAtomicFileTempMarker);
  if (marker == std::string_view::npos) return std::nullopt;
  return parse_checkpoint_name(name.substr(1, marker - 1));
}

struct Listing {
  // iteration -> part -> path, newest first
  std::map<std::int64_t, std::map<std::string, fs::path>, std::greater<>> checkpoints;
  std::map<std::int64_t, std::vector<fs::path>> temporaries;
  std::map<std::int64_t, std::vector<fs::path>> companions;  // of the names asked for
};

Listing list_directory(const fs::path& dir, const std::vector<std::string>& companions = {}) {
  Listing listing;
  std::error_code error;
  const fs::file_status status = fs::status(dir, error);
  if (!fs::exists(status)) return listing;
  if (!fs::is_directory(status)) {
    throw UsageError(concat("checkpoint directory '", dir.string(), "' is not a directory"));
  }
  fs::directory_iterator it(dir, error);
  const fs::directory_iterator end;
  for (; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (auto parsed = parse_checkpoint_name(name)) {
      listing.checkpoints[parsed->iteration][parsed->part] = it->path();
    } else if (auto temp = parse_temp_name(name)) {
      listing.temporaries[temp->iteration].push_back(it->path());
    } else if (auto split = split_checkpoint_name(name);
               split && std::find(companions.begin(), companions.end(), split->second) != companions.end()) {
      listing.companions[split->first].push_back(it->path());
    }
  }
  if (error) {
    throw DataError(concat("cannot list checkpoint directory '", dir.string(), "': ", error.message()));
  }
  return listing;
}

// The parts an iteration must have: `required`, or (if empty) every part present.
std::vector<std::string> needed_parts(const std::map<std::string, fs::path>& files,
                                      const std::vector<std::string>& required) {
  if (!required.empty()) return required;
  std::vector<std::string> parts;
  for (const auto& [part, path] : files) parts.push_back(part);
  return parts;
}

bool complete(const std::map<std::string, fs::path>& files, const std::vector<std::string>& required) {
  if (files.empty()) return false;
  return std::all_of(required.begin(), required.end(),
                     [&](const std::string& part) { return files.count(part) > 0; });
}

// Whether every needed part exists and reads back valid; one warn() line per problem.
bool valid_set(const fs::path& dir, std::int64_t iteration,
               const std::map<std::string, fs::path>& files, const std::vector<std::string>& required,
               const std::function<void(const std::string&)>& warn) {
  const std::vector<std::string> parts = needed_parts(files, required);
  bool all_present = true;
  for (const std::string& part : parts) {
    if (files.count(part) == 0) {
      all_present = false;
      if (warn) {
        warn(concat("skipping checkpoint iteration ", iteration, ": part '", part, "' is missing (no ",
                    checkpoint_path(dir, iteration, part).string(), ")"));
      }
    }
  }
  if (!all_present) return false;
  bool ok = true;
  for (const std::string& part : parts) {
    try {
      (void)CheckpointReader::read_file(files.at(part));
    } catch (const DataError& error) {
      ok = false;
      if (warn) warn(concat("skipping checkpoint iteration ", iteration, ": ", error.what()));
    }
  }
  return ok;
}

}  // namespace

std::optional<CheckpointName> parse_checkpoint_name(std::string_view name) {
  const auto split = split_checkpoint_name(name);
  if (!split) return std::nullopt;
  const std::string_view rest = split->second;
  if (rest.size() < 1 + kNameSuffix.size() || rest.substr(rest.size() - kNameSuffix.size()) != kNameSuffix) {
    return std::nullopt;
  }
  const std::string_view part = rest.substr(0, rest.size() - kNameSuffix.size());
  if (!valid_part(part)) return std::nullopt;
  return CheckpointName{split->first, std::string(part)};
}

const char* checkpoint_kind_name(CheckpointKind kind) {
  switch (kind) {
    case CheckpointKind::float32: return "float32";
    case CheckpointKind::bytes: return "bytes";
    case CheckpointKind::int64: return "int64";
    case CheckpointKind::string: return "string";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// CheckpointWriter

void CheckpointWriter::add_section(std::string name, CheckpointKind kind,
                                   std::vector<std::byte> payload) {
  if (name.empty() || name.size() > kCheckpointMaxNameLength || !printable(name)) {
    throw UsageError(concat("invalid checkpoint section name '", printable(name) ? name : "?",
                            "': expected 1..", kCheckpointMaxNameLength, " printable ASCII characters"));
  }
  for (const Section& section : sections_) {
    if (section.name == name) throw UsageError(concat("duplicate checkpoint section '", name, "'"));
  }
  if (sections_.size() >= kCheckpointMaxSections) {
    throw UsageError(concat("too many checkpoint sections (the limit is ", kCheckpointMaxSections, ")"));
  }
  sections_.push_back(Section{std::move(name), kind, std::move(payload)});
}

void CheckpointWriter::add(std::string name, std::span<const float> values) {
  const auto bytes = std::as_bytes(values);
  add_section(std::move(name), CheckpointKind::float32,
              std::vector<std::byte>(bytes.begin(), bytes.end()));
}

void CheckpointWriter::add(std::string name, std::span<const std::byte> bytes) {
  add_section(std::move(name), CheckpointKind::bytes, std::vector<std::byte>(bytes.begin(), bytes.end()));
}

void CheckpointWriter::add_int(std::string name, std::int64_t value) {
  std::vector<std::byte> payload;
  put_u64(payload, static_cast<std::uint64_t>(value));
  add_section(std::move(name), CheckpointKind::int64, std::move(payload));
}

void CheckpointWriter::add_doubles(std::string name, std::span<const double> values) {
  add(std::move(name), std::as_bytes(values));
}

void CheckpointWriter::add_string(std::string name, std::string value) {
  const auto bytes = std::as_bytes(std::span<const char>(value.data(), value.size()));
  add_section(std::move(name), CheckpointKind::string,
              std::vector<std::byte>(bytes.begin(), bytes.end()));
}

std::uint64_t CheckpointWriter::file_size() const {
  std::uint64_t offset = kCheckpointHeaderLength;
  for (const Section& section : sections_) {
    offset += 4 + section.name.size() + 1 + 8;
    offset += padding_for(offset) + section.payload.size();
  }
  return offset + kCheckpointTrailerLength;
}

void CheckpointWriter::emit(const std::function<void(std::span<const std::byte>)>& sink) const {
  std::uint32_t crc = update_crc(0, {});
  std::uint64_t offset = 0;
  auto out = [&](std::span<const std::byte> chunk) {
    crc = update_crc(crc, chunk);
    offset += chunk.size();
    sink(chunk);
  };
  std::vector<std::byte> head;
  for (char c : kCheckpointMagic) head.push_back(static_cast<std::byte>(c));
  put_u32(head, kCheckpointFormatVersion);
  put_u32(head, static_cast<std::uint32_t>(sections_.size()));
  put_u32(head, kCheckpointHeaderLength);
  out(head);
  for (const Section& section : sections_) {
    head.clear();
    put_u32(head, static_cast<std::uint32_t>(section.name.size()));
    for (char c : section.name) head.push_back(static_cast<std::byte>(c));
    head.push_back(static_cast<std::byte>(section.kind));
    put_u64(head, section.payload.size());
    head.resize(head.size() + padding_for(offset + head.size()), std::byte{0});
    out(head);
    out(section.payload);
  }
  head.clear();
  put_u64(head, offset + kCheckpointTrailerLength);
  out(head);
  head.clear();
  put_u32(head, crc);
  sink(head);
}

std::vector<std::byte> CheckpointWriter::serialize() const {
  std::vector<std::byte> file;
  file.reserve(file_size());
  emit([&](std::span<const std::byte> chunk) { file.insert(file.end(), chunk.begin(), chunk.end()); });
  PIPESGD_ASSERT(file.size() == file_size());
  return file;
}

void CheckpointWriter::write_atomically(const fs::path& path) const {
  write_file_atomically_streaming(path, [&](const AtomicFileSink& sink) { emit(sink); }, "checkpoint");
}

// ---------------------------------------------------------------------------------------------
// CheckpointReader

CheckpointReader CheckpointReader::parse(std::span<const std::byte> bytes, std::string_view origin) {
  return parse_owned(std::vector<std::byte>(bytes.begin(), bytes.end()), std::string(origin));
}

CheckpointReader CheckpointReader::read_file(const fs::path& path) {
  const std::string origin = path.string();
  auto fail = [&](const std::string& what) {
    throw DataError(concat("checkpoint '", origin, "': ", what));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(concat("cannot open: ", errno_text(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat status{};
  if (::fstat(fd, &status) != 0) fail(concat("cannot stat: ", errno_text(errno)));
  if (S_ISDIR(status.st_mode)) fail("is a directory, not a file");
  // One byte more than the size, so that the read reaching the end needs no reallocation.
  std::vector<std::byte> data(status.st_size > 0 ? static_cast<std::size_t>(status.st_size) + 1 : 4096);
  std::size_t used = 0;
  for (;;) {
    if (used == data.size()) data.resize(2 * data.size());
    const ssize_t got = ::read(fd, data.data() + used, data.size() - used);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(concat("read error: ", errno_text(errno)));
    }
    if (got == 0) break;
    used += static_cast<std::size_t>(got);
  }
  data.resize(used);
  return parse_owned(std::move(data), origin);
}

CheckpointReader CheckpointReader::parse_owned(std::vector<std::byte> data, std::string origin) {
  CheckpointReader reader;
  reader.origin_ = std::move(origin);
  const std::byte* const p = data.data();
  const std::uint64_t size = data.size();

  // A file whose trailer states its exact length is complete; if its checksum is then wrong, it was
  // damaged, and a structural problem found below is reported as the checksum mismatch it is.
  bool complete = false;
  bool checksum_ok = false;
  std::uint32_t stored_crc = 0;
  std::uint32_t computed_crc = 0;
  if (size >= kCheckpointTrailerLength) {
    complete = load_u64(p + size - kCheckpointTrailerLength) == size;
    if (complete) {
      stored_crc = load_u32(p + size - 4);
      computed_crc = update_crc(update_crc(0, {}), std::span(p, size - 4));
      checksum_ok = stored_crc == computed_crc;
    }
  }
  const std::string checksum_problem = concat("checksum mismatch: stored crc32 ", hex32(stored_crc),
                                              ", computed ", hex32(computed_crc), " (the file is corrupt)");

  std::uint64_t pos = 0;
  auto need = [&](std::uint64_t count, const std::string& prefix, const std::string& where) {
    if (count > size - pos) throw FormatProblem{concat(prefix, "file ends in ", where), size};
  };
  try {
    if (size == 0) throw FormatProblem{"truncated: empty file", 0};
    const std::size_t magic_available = std::min<std::uint64_t>(size, sizeof kCheckpointMagic);
    if (std::memcmp(p, kCheckpointMagic, magic_available) != 0) {
      throw FormatProblem{"not a checkpoint (bad magic)", 0};
    }
    need(8, "truncated: ", "the magic");
    pos = 8;
    need(4, "truncated: ", "the format version");
    const std::uint32_t version = load_u32(p + pos);
    if (version != kCheckpointFormatVersion) {
      throw FormatProblem{concat("unsupported format version ", version, " (this build reads version ",
                                 kCheckpointFormatVersion, ")"),
                          pos};
    }
    pos += 4;
    need(4, "truncated: ", "the section count");
    const std::uint32_t count = load_u32(p + pos);
    if (count > kCheckpointMaxSections) {
      throw FormatProblem{
          concat("section count ", count, " exceeds the limit ", kCheckpointMaxSections), pos};
    }
    pos += 4;
    need(4, "truncated: ", "the header length");
    const std::uint32_t header_length = load_u32(p + pos);
    if (header_length != kCheckpointHeaderLength) {
      throw FormatProblem{
          concat("header length ", header_length, ", expected ", kCheckpointHeaderLength), pos};
    }
    pos += 4;

    std::vector<const std::string*> order;
    const std::string truncated = concat("truncated: header says ", count, " sections, ");
    for (std::uint32_t index = 0; index < count; ++index) {
      const std::uint32_t number = index + 1;
      need(4, truncated, concat("the name length of section ", number));
      const std::uint32_t name_length = load_u32(p + pos);
      if (name_length == 0 || name_length > kCheckpointMaxNameLength) {
        throw FormatProblem{concat("section ", number, " has name length ", name_length,
                                   " (allowed: 1..", kCheckpointMaxNameLength, ")"),
                            pos};
      }
      pos += 4;
      need(name_length, truncated, concat("the name of section ", number));
      std::string name(reinterpret_cast<const char*>(p + pos), name_length);
      if (!printable(name)) {
        throw FormatProblem{concat("section ", number, " has a name with non-printable bytes"), pos};
      }
      const std::uint64_t name_position = pos;
      pos += name_length;
      const std::string label = concat("section '", name, "' (", number, " of ", count, ")");
      need(1, truncated, concat("the kind of ", label));
      const auto kind_byte = static_cast<std::uint8_t>(p[pos]);
      if (!valid_kind(kind_byte)) {
        throw FormatProblem{concat(label, " has unknown kind ", static_cast<int>(kind_byte)), pos};
      }
      const auto kind = static_cast<CheckpointKind>(kind_byte);
      pos += 1;
      need(8, truncated, concat("the payload length of ", label));
      const std::uint64_t length = load_u64(p + pos);
      if (kind == CheckpointKind::float32 && length % 4 != 0) {
        throw FormatProblem{
            concat(label, " is float32 but has ", length, " payload bytes, not a multiple of 4"), pos};
      }
      if (kind == CheckpointKind::int64 && length != 8) {
        throw FormatProblem{concat(label, " is int64 but has ", length, " payload bytes, not 8"), pos};
      }
      pos += 8;
      const std::uint64_t padding = padding_for(pos);
      need(padding, truncated, concat("the padding of ", label));
      for (std::uint64_t i = 0; i < padding; ++i) {
        if (p[pos + i] != std::byte{0}) {
          throw FormatProblem{concat(label, " has a nonzero padding byte"), pos + i};
        }
      }
      pos += padding;
      if (length > size - pos) {
        throw FormatProblem{concat(truncated, "file ends ", size - pos, " bytes into the ", length,
                                   "-byte payload of ", label),
                            size};
      }
      const auto [it, inserted] = reader.sections_.try_emplace(
          std::move(name), Section{kind, static_cast<std::size_t>(pos),
                                   static_cast<std::size_t>(length), index});
      if (!inserted) {
        throw FormatProblem{concat("duplicate section '", it->first, "' (sections ",
                                   it->second.index + 1, " and ", number, ")"),
                            name_position};
      }
      pos += length;
    }
    if (size - pos < kCheckpointTrailerLength) {
      throw FormatProblem{concat(count == 0 ? "truncated: " : truncated, "file ends in the trailer"),
                          size};
    }
    if (size - pos > kCheckpointTrailerLength) {
      throw FormatProblem{concat(size - pos - kCheckpointTrailerLength,
                                 " unexpected bytes after the last section (beyond the ", kCheckpointTrailerLength,
                                 "-byte trailer)"),
                          pos};
    }
    if (!complete) {
      throw FormatProblem{concat("trailer says the file is ", load_u64(p + pos), " bytes, but it is ",
                                 size),
                          pos};
    }
  } catch (const FormatProblem& problem) {
    if (complete && !checksum_ok) data_error(reader.origin_, checksum_problem, size - 4);
    data_error(reader.origin_, problem.what, problem.byte);
  }
  if (!checksum_ok) data_error(reader.origin_, checksum_problem, size - 4);
  reader.data_ = std::move(data);
  return reader;
}

bool CheckpointReader::has(std::string_view name) const { return sections_.find(name) != sections_.end(); }

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> names(sections_.size());
  for (const auto& [name, section] : sections_) names[section.index] = name;
  return names;
}

CheckpointKind CheckpointReader::kind(std::string_view name) const {
  const auto it = sections_.find(name);
  if (it == sections_.end()) {
    throw DataError(concat("checkpoint '", origin_, "': no section '", name, "'"));
  }
  return it->second.kind;
}

const CheckpointReader::Section& CheckpointReader::find(std::string_view name,
                                                        CheckpointKind expected) const {
  const auto it = sections_.find(name);
  if (it == sections_.end()) {
    throw DataError(concat("checkpoint '", origin_, "': no section '", name, "' (expected ",
                           checkpoint_kind_name(expected), ")"));
  }
  if (it->second.kind != expected) {
    throw DataError(concat("checkpoint '", origin_, "': section '", name, "' is ",
                           checkpoint_kind_name(it->second.kind), ", expected ",
                           checkpoint_kind_name(expected)));
  }
  return it->second;
}

std::span<const float> CheckpointReader::floats(std::string_view name) const {
  const Section& section = find(name, CheckpointKind::float32);
  // The payload starts at a multiple of 8 in a buffer from operator new, so it is aligned.
  return {reinterpret_cast<const float*>(data_.data() + section.offset), section.length / 4};
}

std::span<const std::byte> CheckpointReader::bytes(std::string_view name) const {
  const Section& section = find(name, CheckpointKind::bytes);
  return {data_.data() + section.offset, section.length};
}

std::int64_t CheckpointReader::integer(std::string_view name) const {
  const Section& section = find(name, CheckpointKind::int64);
  return static_cast<std::int64_t>(load_u64(data_.data() + section.offset));
}

bool CheckpointReader::flag(std::string_view name) const {
  const std::int64_t value = integer(name);
  if (value != 0 && value != 1) {
    throw DataError(concat("checkpoint '", origin_, "': section '", name, "' is ", value, ", not 0 or 1"));
  }
  return value == 1;
}

std::span<const float> CheckpointReader::floats(std::string_view name, std::size_t count) const {
  const std::span<const float> values = floats(name);
  if (values.size() != count) {
    throw DataError(concat("checkpoint '", origin_, "': section '", name, "' holds ", values.size(),
                           " values, this run keeps ", count));
  }
  return values;
}

std::string_view CheckpointReader::string(std::string_view name) const {
  const Section& section = find(name, CheckpointKind::string);
  return {reinterpret_cast<const char*>(data_.data() + section.offset), section.length};
}

std::vector<double> CheckpointReader::doubles(std::string_view name) const {
  const std::span<const std::byte> payload = bytes(name);
  if (payload.size() % sizeof(double) != 0) {
    throw DataError(concat("checkpoint '", origin_, "': section '", name, "' holds ", payload.size(),
                           " bytes, not a whole number of doubles"));
  }
  std::vector<double> values(payload.size() / sizeof(double));
  if (!values.empty()) std::memcpy(values.data(), payload.data(), payload.size());
  for (double value : values) {
    if (!std::isfinite(value)) {
      throw DataError(concat("checkpoint '", origin_, "': section '", name, "' holds a non-finite value"));
    }
  }
  return values;
}

std::vector<double> CheckpointReader::doubles(std::string_view name, std::size_t count) const {
  std::vector<double> values = doubles(name);
  if (values.size() != count) {
    throw DataError(concat("checkpoint '", origin_, "': section '", name, "' holds ", values.size(), " doubles, expected ",
                           count));
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// Checkpoint directories

fs::path checkpoint_path(const fs::path& dir, std::int64_t iteration, const std::string& part) {
  if (iteration < 0 || iteration > kMaxIteration) {
    throw UsageError(concat("checkpoint iteration ", iteration, " is outside [0, ", kMaxIteration, "]"));
  }
  check_part(part);
  std::ostringstream name;
  name << kNamePrefix << std::setw(12) << std::setfill('0') << iteration << '-' << part << kNameSuffix;
  return dir / name.str();
}

fs::path checkpoint_companion_path(const fs::path& dir, std::int64_t iteration, std::string_view companion) {
  if (iteration < 0 || iteration > kMaxIteration) {
    throw UsageError(concat("checkpoint iteration ", iteration, " is outside [0, ", kMaxIteration, "]"));
  }
  std::ostringstream name;
  name << kNamePrefix << std::setw(12) << std::setfill('0') << iteration << '-' << companion;
  return dir / name.str();
}

std::optional<CheckpointSet> find_newest_valid_checkpoint(
    const fs::path& dir, const std::vector<std::string>& required_parts,
    const std::function<void(const std::string&)>& warn, std::optional<std::int64_t> older_than) {
  for (const std::string& part : required_parts) check_part(part);
  const Listing listing = list_directory(dir);
  for (const auto& [iteration, files] : listing.checkpoints) {
    if (older_than && iteration >= *older_than) continue;
    if (valid_set(dir, iteration, files, required_parts, warn)) {
      return CheckpointSet{iteration, files};
    }
  }
  return std::nullopt;
}

std::optional<CheckpointSet> find_valid_checkpoint(const fs::path& dir, std::int64_t iteration,
                                                   const std::vector<std::string>& required_parts,
                                                   const std::function<void(const std::string&)>& warn) {
  for (const std::string& part : required_parts) check_part(part);
  const Listing listing = list_directory(dir);
  const auto found = listing.checkpoints.find(iteration);
  if (found == listing.checkpoints.end() || !valid_set(dir, iteration, found->second, required_parts, warn)) {
    return std::nullopt;
  }
  return CheckpointSet{iteration, found->second};
}

std::vector<fs::path> prune_checkpoints(const fs::path& dir, std::size_t keep,
                                        const std::vector<std::string>& required_parts,
                                        const std::vector<std::string>& companions,
                                        std::optional<std::int64_t> written_here) {
  if (keep == 0) throw UsageError("prune_checkpoints: keep must be at least 1");
  for (const std::string& part : required_parts) check_part(part);
  const Listing listing = list_directory(dir, companions);

  std::optional<std::int64_t> oldest_kept;
  std::size_t kept = 0;
  for (const auto& [iteration, files] : listing.checkpoints) {  // newest first
    if (kept == keep) break;
    if (!complete(files, required_parts)) continue;
    oldest_kept = iteration;
    ++kept;
  }
  // The newest valid checkpoint stays, however old: a newer complete one may be corrupt.
  for (const auto& [iteration, files] : listing.checkpoints) {
    if (!complete(files, required_parts)) continue;
    if (iteration == written_here || valid_set(dir, iteration, files, required_parts, nullptr)) {
      if (oldest_kept && iteration < *oldest_kept) oldest_kept = iteration;
      break;
    }
  }
  std::vector<fs::path> deleted;
  if (!oldest_kept) return deleted;

  auto remove = [&](const fs::path& path) {
    std::error_code error;
    if (fs::remove(path, error)) {
      deleted.push_back(path);
    } else if (error && error != std::errc::no_such_file_or_directory) {
      throw DataError(concat("cannot delete old checkpoint '", path.string(), "': ", error.message()));
    }
  };
  for (const auto& [iteration, files] : listing.checkpoints) {
    if (iteration >= *oldest_kept) continue;
    for (const auto& [part, path] : files) remove(path);
  }
  for (const auto& [iteration, paths] : listing.temporaries) {
    if (iteration >= *oldest_kept) continue;
    for (const fs::path& path : paths) remove(path);
  }
  for (const auto& [iteration, paths] : listing.companions) {
    if (iteration >= *oldest_kept) continue;
    for (const fs::path& path : paths) remove(path);
  }
  return deleted;
}

}  // namespace pipesgd
