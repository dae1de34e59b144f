#pragma once
// Checkpoint files: a small container of named, typed sections, written atomically and read back
// with every byte validated; plus discovery of the newest complete and valid checkpoint in a
// directory and pruning of old ones. This layer knows nothing about models or training methods:
// callers decide which sections a checkpoint holds.
//
// File format, version 1. All integers are little-endian (float32 payloads are the host's IEEE-754
// bit patterns; the build requires a little-endian host, so they are little-endian too).
//
//   offset  size  field
//   0       8     magic "PSGDCKPT"
//   8       4     u32 format version (kCheckpointFormatVersion = 1)
//   12      4     u32 section count (at most kCheckpointMaxSections)
//   16      4     u32 header length: bytes of this fixed header = 20, where the sections start
//   20      ...   sections, back to back, each:
//                   u32  name length (1..kCheckpointMaxNameLength)
//                   ...  name bytes (printable ASCII 0x20..0x7e)
//                   u8   kind (CheckpointKind: 1 float32, 2 bytes, 3 int64, 4 string)
//                   u64  payload length in bytes (float32: a multiple of 4; int64: exactly 8)
//                   ...  0..7 zero bytes of padding, so that the payload starts at a file offset
//                        that is a multiple of 8 (float32 payloads can then be used in place)
//                   ...  payload
//   end-12  8     u64 total file length (trailer included)
//   end-4   4     u32 CRC-32 (zlib crc32) of every byte before this field
//
// Section names are unique within a file. Nothing follows the trailer.
//
// Atomicity: CheckpointWriter::write_atomically writes through write_file_atomically_streaming
// (core/atomic_file.h): a temporary file in the destination's directory
// (".<file name>.tmp.<pid>.<random>"), fsynced, renamed over the destination, then the directory
// fsynced. A crash at any moment leaves either the old file or the complete new file
// under the final name (possibly plus a leftover temporary file, which discovery ignores and pruning
// eventually removes).
//
// Validation: CheckpointReader rejects every malformed input with a DataError of one line,
//   checkpoint '<origin>': <what is wrong> (byte N)
// where N is the file offset of the problem (for truncation: the file's length). No input makes the
// reader read out of bounds; it allocates at most one copy of the input plus O(section count).
//
// Thread safety: writers and readers are independent value objects without shared state; use one
// per thread (a const CheckpointReader may be read from several threads at once). Several processes
// may write different files of one directory concurrently.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pipesgd {

inline constexpr char kCheckpointMagic[8] = {'P', 'S', 'G', 'D', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t kCheckpointFormatVersion = 1;
inline constexpr std::uint32_t kCheckpointHeaderLength = 20;
inline constexpr std::uint32_t kCheckpointTrailerLength = 12;
inline constexpr std::uint32_t kCheckpointMaxSections = 1u << 16;
inline constexpr std::uint32_t kCheckpointMaxNameLength = 1024;

enum class CheckpointKind : std::uint8_t { float32 = 1, bytes = 2, int64 = 3, string = 4 };

// "float32", "bytes", "int64", "string".
const char* checkpoint_kind_name(CheckpointKind kind);

// Collects named sections and writes them as one checkpoint file. The payloads are copied on add.
class CheckpointWriter {
 public:
  // Each add throws UsageError if `name` is empty, longer than kCheckpointMaxNameLength, has a byte
  // outside printable ASCII, is already used, or the section count would exceed the limit.
  void add(std::string name, std::span<const float> values);
  void add(std::string name, std::span<const std::byte> bytes);
  void add_int(std::string name, std::int64_t value);
  void add_string(std::string name, std::string value);
  // Doubles, bit for bit (a bytes section of 8 bytes per value).
  void add_doubles(std::string name, std::span<const double> values);
  void add_double(std::string name, double value) { add_doubles(std::move(name), std::span<const double>(&value, 1)); }

  std::size_t section_count() const { return sections_.size(); }
  // The size in bytes of the file serialize()/write_atomically() produce.
  std::uint64_t file_size() const;

  // The whole file in memory (tests, fuzzing corpora).
  std::vector<std::byte> serialize() const;

  // Writes the file atomically (see the top of this header). Throws UsageError when the
  // destination's directory does not exist or is not a directory, DataError for any other failure
  // (permission, disk full, I/O error, rename); the message names the path and the errno text. On
  // failure the temporary file is removed and an existing file at `path` is left untouched.
  void write_atomically(const std::filesystem::path& path) const;

 private:
  struct Section {
    std::string name;
    CheckpointKind kind;
    std::vector<std::byte> payload;
  };
  void add_section(std::string name, CheckpointKind kind, std::vector<std::byte> payload);
  // Feeds the file to `sink` in order, chunk by chunk (header, sections, trailer).
  void emit(const std::function<void(std::span<const std::byte>)>& sink) const;

  std::vector<Section> sections_;
};

// A validated checkpoint held in memory. Accessors return views into the reader's own buffer; they
// stay valid as long as the reader (moving the reader keeps them valid).
class CheckpointReader {
 public:
  // Validates `bytes` (copied) as a checkpoint file; `origin` names it in error messages (a path,
  // or e.g. "<memory>"). Throws DataError.
  static CheckpointReader parse(std::span<const std::byte> bytes, std::string_view origin);
  // Reads and validates the file at `path`. Throws DataError (also when it cannot be read).
  static CheckpointReader read_file(const std::filesystem::path& path);

  const std::string& origin() const { return origin_; }
  bool has(std::string_view name) const;
  // Section names in file order.
  std::vector<std::string> names() const;
  // Throws DataError naming the section if it is missing.
  CheckpointKind kind(std::string_view name) const;

  // Each throws DataError naming the section if it is missing or of another kind.
  std::span<const float> floats(std::string_view name) const;
  std::span<const std::byte> bytes(std::string_view name) const;
  std::int64_t integer(std::string_view name) const;
  // An int64 section that must be 0 or 1 (written as add_int(name, flag ? 1 : 0)).
  bool flag(std::string_view name) const;
  // A float32 section of exactly `count` values (the size of the buffer it restores). Throws
  // DataError naming the section otherwise.
  std::span<const float> floats(std::string_view name, std::size_t count) const;
  std::string_view string(std::string_view name) const;
  // A section written by add_doubles / add_double: its values (`count` of them, when given), each
  // finite. Throws DataError naming the section otherwise.
  std::vector<double> doubles(std::string_view name) const;
  std::vector<double> doubles(std::string_view name, std::size_t count) const;
  double real(std::string_view name) const { return doubles(name, 1)[0]; }

 private:
  struct Section {
    CheckpointKind kind;
    std::size_t offset;  // of the payload in data_
    std::size_t length;
    std::size_t index;   // position in the file
  };
  static CheckpointReader parse_owned(std::vector<std::byte> data, std::string origin);
  const Section& find(std::string_view name, CheckpointKind expected) const;

  std::string origin_;
  std::vector<std::byte> data_;
  std::map<std::string, Section, std::less<>> sections_;
};

// ---- Checkpoint directories ----
// One checkpoint = one iteration = one file per part ("shared", "rank0", "rank1", ...), named
//   checkpoint-<iteration, 12 digits zero-padded>-<part>.psgd
// A part name is 1..64 characters of [A-Za-z0-9_-].

// dir / "checkpoint-000000000042-rank3.psgd". Throws UsageError for an iteration outside
// [0, 10^12) or an invalid part name.
std::filesystem::path checkpoint_path(const std::filesystem::path& dir, std::int64_t iteration,
                                      const std::string& part);

// A checkpoint file's name split: "checkpoint-000000000042-rank3.psgd" -> {42, "rank3"}; nullopt for
// any other name (a temporary file's included).
struct CheckpointName {
  std::int64_t iteration = 0;
  std::string part;
};
std::optional<CheckpointName> parse_checkpoint_name(std::string_view file_name);

// A set's companion file: dir / "checkpoint-000000000042-<name>" (e.g. name "model.pt"), not a
// part (never required, never validated), deleted with its iteration by prune_checkpoints.
std::filesystem::path checkpoint_companion_path(const std::filesystem::path& dir, std::int64_t iteration,
                                                std::string_view name);

struct CheckpointSet {
  std::int64_t iteration = 0;
  std::map<std::string, std::filesystem::path> parts;  // every part file found for the iteration
};

// The newest iteration in `dir` whose checkpoint is usable: every required part exists and reads
// back valid (structure and CRC). The parts are validated, not merely listed; parts present but not
// required are returned unvalidated (with `required_parts` empty, every part present is required).
// Newer unusable iterations are skipped with one warn() line per problem, naming the file (or the
// missing part) and the reason. Files not named like a checkpoint (leftover temporary files
// included) are ignored silently. A missing directory or one without a usable checkpoint gives
// nullopt. Throws UsageError if `dir` exists but is not a directory or a required part name is
// invalid, DataError if it cannot be listed. With `older_than`, only the iterations before it count.
std::optional<CheckpointSet> find_newest_valid_checkpoint(
    const std::filesystem::path& dir, const std::vector<std::string>& required_parts,
    const std::function<void(const std::string&)>& warn, std::optional<std::int64_t> older_than = std::nullopt);

// The checkpoint of `iteration` in `dir` if it is usable as find_newest_valid_checkpoint judges (warn()
// lines for what is wrong with it), else nullopt.
std::optional<CheckpointSet> find_valid_checkpoint(const std::filesystem::path& dir, std::int64_t iteration,
                                                   const std::vector<std::string>& required_parts,
                                                   const std::function<void(const std::string&)>& warn);

// Deletes old checkpoints from `dir`, keeping the newest `keep` complete iterations (every required
// part present; with `required_parts` empty, any part present makes an iteration complete) and
// always the newest valid one (validated as find_newest_valid_checkpoint does, so a corrupt newest
// checkpoint never causes the last good one to be deleted). Deleted: every checkpoint file, and every
// leftover temporary file, of an iteration older than the oldest kept one; iterations newer than it
// (for example one other ranks are still writing) are never touched; nor is any other file, except
// the `companions` (checkpoint_companion_path) of the iterations deleted. Returns the deleted paths.
// `written_here`: an iteration whose parts this run wrote itself, each atomically (renamed into
// place whole), so its complete set counts as valid without being read again.
// Throws UsageError for keep == 0, DataError if a file cannot be deleted or the directory listed.
std::vector<std::filesystem::path> prune_checkpoints(const std::filesystem::path& dir,
                                                     std::size_t keep,
                                                     const std::vector<std::string>& required_parts,
                                                     const std::vector<std::string>& companions = {},
                                                     std::optional<std::int64_t> written_here = std::nullopt);

}  // namespace pipesgd
