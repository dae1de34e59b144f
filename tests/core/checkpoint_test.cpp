// Tests of the checkpoint file layer (checkpoint.h): the container format, atomic writes, validated
// reads (truncation, bit flips, crafted headers), and discovery/pruning of checkpoint directories.
#include "pipesgd/core/checkpoint.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

// ---- helpers ----

std::vector<float> random_floats(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  return values;
}

Bytes bytes_of(const std::string& text) {
  Bytes bytes;
  for (char c : text) bytes.push_back(static_cast<std::byte>(c));
  return bytes;
}

Bytes read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void write_all(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

std::uint64_t load_le(const Bytes& bytes, std::size_t offset, int width) {
  std::uint64_t value = 0;
  for (int i = 0; i < width; ++i) value |= static_cast<std::uint64_t>(bytes.at(offset + i)) << (8 * i);
  return value;
}

void store_le(Bytes& bytes, std::size_t offset, std::uint64_t value, int width) {
  for (int i = 0; i < width; ++i) bytes.at(offset + i) = static_cast<std::byte>(value >> (8 * i));
}

// Rewrites the trailer (length and CRC) so that a crafted file passes the integrity checks and only
// its structure is judged.
void fix_trailer(Bytes& bytes) {
  store_le(bytes, bytes.size() - 12, bytes.size(), 8);
  const std::uint32_t crc = static_cast<std::uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
  store_le(bytes, bytes.size() - 4, crc, 4);
}

// Runs `action`, expects a DataError, returns its message.
std::string data_error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const DataError& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected DataError, got another exception: " << error.what();
    return {};
  }
  ADD_FAILURE() << "expected DataError, nothing was thrown";
  return {};
}

std::string parse_error(const Bytes& bytes, const std::string& origin = "test.psgd") {
  return data_error_of([&] { (void)CheckpointReader::parse(bytes, origin); });
}

#define EXPECT_CONTAINS(text, part)                                                    \
  do {                                                                                \
    const std::string contains_text_ = (text);                                        \
    const std::string contains_part_ = (part);                                        \
    EXPECT_NE(contains_text_.find(contains_part_), std::string::npos)                 \
        << "message: " << contains_text_ << "\nexpected to contain: " << contains_part_; \
  } while (false)

// A writer with every kind, small and empty payloads and an odd-length one (exercises padding).
// The int is negative so its bytes can never be mistaken for a trailer's length field.
CheckpointWriter sample_writer(std::size_t float_count = 1000) {
  CheckpointWriter writer;
  writer.add_int("step", -123456789);
  writer.add_string("label", "method=pipe-sgd lr=0.1");
  writer.add("empty_floats", std::span<const float>());
  writer.add_string("empty_string", "");
  const Bytes blob = bytes_of("an odd-length blob: 37 bytes long....");
  writer.add("blob", std::span<const std::byte>(blob));
  const std::vector<float> weights = random_floats(float_count, 7);
  writer.add("weights", std::span<const float>(weights));
  return writer;
}

// Offset of the first payload of sample_writer()'s file: header (20), name length (4), "step" (4),
// kind (1), payload length (8) = 37, padded to 40.
constexpr std::size_t kSampleFirstPayload = 40;

// ---- format ----

TEST(CheckpointFormat, RoundTripsEveryKind) {
  const std::vector<float> large = random_floats(1 << 20, 3);
  const std::vector<float> specials = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(),
                                       std::numeric_limits<float>::quiet_NaN(),
                                       std::numeric_limits<float>::denorm_min(),
                                       std::numeric_limits<float>::max()};
  Bytes binary(300);
  for (std::size_t i = 0; i < binary.size(); ++i) binary[i] = static_cast<std::byte>(i * 7);
  using namespace std::string_literals;
  const std::string text = "line one\nline two \xc3\xa9 with a \0 inside"s;

  CheckpointWriter writer;
  writer.add("large", std::span<const float>(large));
  writer.add("specials", std::span<const float>(specials));
  writer.add("empty_floats", std::span<const float>());
  writer.add("binary", std::span<const std::byte>(binary));
  writer.add("empty_bytes", std::span<const std::byte>());
  writer.add_int("zero", 0);
  writer.add_int("min", std::numeric_limits<std::int64_t>::min());
  writer.add_int("max", std::numeric_limits<std::int64_t>::max());
  writer.add_int("minus_one", -1);
  writer.add_string("text", text);
  writer.add_string("empty_string", "");
  EXPECT_EQ(writer.section_count(), 11u);

  TempDir dir;
  const fs::path path = dir.file("all.psgd");
  writer.write_atomically(path);
  EXPECT_EQ(fs::file_size(path), writer.file_size());
  EXPECT_EQ(read_all(path), writer.serialize());

  for (const CheckpointReader& reader :
       {CheckpointReader::read_file(path), CheckpointReader::parse(writer.serialize(), "<memory>")}) {
    const auto got_large = reader.floats("large");
    ASSERT_EQ(got_large.size(), large.size());
    EXPECT_TRUE(std::equal(got_large.begin(), got_large.end(), large.begin()));
    const auto got_specials = reader.floats("specials");
    ASSERT_EQ(got_specials.size(), specials.size());
    for (std::size_t i = 0; i < specials.size(); ++i) {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(got_specials[i]), std::bit_cast<std::uint32_t>(specials[i]));
    }
    EXPECT_TRUE(reader.floats("empty_floats").empty());
    const auto got_binary = reader.bytes("binary");
    EXPECT_TRUE(std::equal(got_binary.begin(), got_binary.end(), binary.begin(), binary.end()));
    EXPECT_TRUE(reader.bytes("empty_bytes").empty());
    EXPECT_EQ(reader.integer("zero"), 0);
    EXPECT_EQ(reader.integer("min"), std::numeric_limits<std::int64_t>::min());
    EXPECT_EQ(reader.integer("max"), std::numeric_limits<std::int64_t>::max());
    EXPECT_EQ(reader.integer("minus_one"), -1);
    EXPECT_EQ(reader.string("text"), text);
    EXPECT_EQ(reader.string("text").size(), 36u);
    EXPECT_EQ(reader.string("empty_string"), "");
    EXPECT_TRUE(reader.has("large"));
    EXPECT_FALSE(reader.has("nope"));
    EXPECT_EQ(reader.kind("binary"), CheckpointKind::bytes);
    EXPECT_EQ(reader.names(), (std::vector<std::string>{"large", "specials", "empty_floats", "binary",
                                                        "empty_bytes", "zero", "min", "max",
                                                        "minus_one", "text", "empty_string"}));
  }
}

TEST(CheckpointFormat, EmptyCheckpointRoundTrips) {
  const CheckpointWriter writer;
  const Bytes bytes = writer.serialize();
  EXPECT_EQ(bytes.size(), 32u);
  EXPECT_TRUE(CheckpointReader::parse(bytes, "empty").names().empty());
}

TEST(CheckpointFormat, ReaderViewsSurviveAMove) {
  const CheckpointWriter writer = sample_writer();
  CheckpointReader first = CheckpointReader::parse(writer.serialize(), "m");
  const auto view = first.floats("weights");
  const CheckpointReader second = std::move(first);
  EXPECT_EQ(view.data(), second.floats("weights").data());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(view.data()) % alignof(float), 0u);
}

// Pins the documented byte layout (checkpoint.h) so that a format change cannot go unnoticed.
TEST(CheckpointFormat, ByteLayoutMatchesTheDocumentation) {
  CheckpointWriter writer;
  writer.add_int("it", 0x0102030405060708);
  const float value = 1.0f;
  writer.add("w", std::span<const float>(&value, 1));
  const Bytes bytes = writer.serialize();
  // 20 header + (4 + 2 + 1 + 8 = 15, pad 5 to 40) + 8 payload = 48; (4 + 1 + 1 + 8 = 14 -> 62, pad 2
  // to 64) + 4 payload = 68; + 12 trailer = 80.
  ASSERT_EQ(bytes.size(), 80u);
  EXPECT_EQ(std::memcmp(bytes.data(), "PSGDCKPT", 8), 0);
  EXPECT_EQ(load_le(bytes, 8, 4), 1u);   // version
  EXPECT_EQ(load_le(bytes, 12, 4), 2u);  // sections
  EXPECT_EQ(load_le(bytes, 16, 4), 20u); // header length
  EXPECT_EQ(load_le(bytes, 20, 4), 2u);  // name length
  EXPECT_EQ(static_cast<char>(bytes[24]), 'i');
  EXPECT_EQ(static_cast<char>(bytes[25]), 't');
  EXPECT_EQ(load_le(bytes, 26, 1), 3u);  // int64
  EXPECT_EQ(load_le(bytes, 27, 8), 8u);  // payload length
  EXPECT_EQ(load_le(bytes, 35, 5), 0u);  // padding
  EXPECT_EQ(load_le(bytes, 40, 8), 0x0102030405060708u);
  EXPECT_EQ(load_le(bytes, 48, 4), 1u);
  EXPECT_EQ(static_cast<char>(bytes[52]), 'w');
  EXPECT_EQ(load_le(bytes, 53, 1), 1u);  // float32
  EXPECT_EQ(load_le(bytes, 54, 8), 4u);
  EXPECT_EQ(load_le(bytes, 62, 2), 0u);
  EXPECT_EQ(load_le(bytes, 64, 4), std::bit_cast<std::uint32_t>(1.0f));
  EXPECT_EQ(load_le(bytes, 68, 8), 80u);  // trailer: file length
  const auto crc = crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), 76);
  EXPECT_EQ(load_le(bytes, 76, 4), crc);
}

// ---- validation ----

TEST(CheckpointValidation, TruncationAtEveryHeaderOffsetIsReported) {
  const Bytes full = sample_writer().serialize();
  // The header region: magic through the first section's header and padding, and one payload byte.
  for (std::size_t cut = 0; cut <= kSampleFirstPayload + 1; ++cut) {
    const Bytes prefix(full.begin(), full.begin() + cut);
    const std::string message = parse_error(prefix, "ckpt/cut.psgd");
    EXPECT_CONTAINS(message, "checkpoint 'ckpt/cut.psgd': truncated");
    EXPECT_CONTAINS(message, "(byte " + std::to_string(cut) + ")");
    EXPECT_EQ(message.find('\n'), std::string::npos);
    if (cut > 20) EXPECT_CONTAINS(message, "header says 6 sections");
  }
  EXPECT_CONTAINS(parse_error(Bytes(full.begin(), full.begin() + 28)),
                  "truncated: header says 6 sections, file ends in the kind of section 'step' (1 of 6) "
                  "(byte 28)");
  EXPECT_CONTAINS(parse_error(Bytes(full.begin(), full.begin() + 44)),
                  "file ends 4 bytes into the 8-byte payload of section 'step' (1 of 6) (byte 44)");
}

TEST(CheckpointValidation, TruncationAtRandomBodyOffsetsIsReported) {
  const Bytes full = sample_writer().serialize();
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::size_t> offset(kSampleFirstPayload, full.size() - 1);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t cut = offset(rng);
    const std::string message = parse_error(Bytes(full.begin(), full.begin() + cut), "body.psgd");
    EXPECT_CONTAINS(message, "checkpoint 'body.psgd': truncated");
    EXPECT_CONTAINS(message, "(byte " + std::to_string(cut) + ")");
  }
  EXPECT_CONTAINS(parse_error(Bytes(full.begin(), full.end() - 1)), "file ends in the trailer");
}

TEST(CheckpointValidation, EverySingleBitFlipIsDetected) {
  const Bytes full = sample_writer().serialize();
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::size_t> position(0, full.size() - 1);
  std::uniform_int_distribution<int> bit(0, 7);
  std::vector<std::size_t> positions;
  for (std::size_t i = 0; i < 48; ++i) positions.push_back(i);                 // the whole header
  for (std::size_t i = full.size() - 12; i < full.size(); ++i) positions.push_back(i);  // trailer
  while (positions.size() < 200) positions.push_back(position(rng));
  for (const std::size_t at : positions) {
    Bytes flipped = full;
    flipped[at] ^= static_cast<std::byte>(1u << bit(rng));
    const std::string message = parse_error(flipped, "flip.psgd");
    EXPECT_CONTAINS(message, "checkpoint 'flip.psgd': ");
    const bool named = message.find("checksum mismatch") != std::string::npos ||
                       message.find("trailer says the file is") != std::string::npos ||
                       message.find("truncated") != std::string::npos;
    EXPECT_TRUE(named) << "flip at byte " << at << ": " << message;
  }
}

TEST(CheckpointValidation, BitFlipInAPayloadIsAChecksumMismatch) {
  Bytes bytes = sample_writer().serialize();
  bytes[bytes.size() - 100] ^= std::byte{0x10};
  const std::string message = parse_error(bytes, "p.psgd");
  EXPECT_CONTAINS(message, "checkpoint 'p.psgd': checksum mismatch: stored crc32 0x");
  EXPECT_CONTAINS(message, "(byte " + std::to_string(bytes.size() - 4) + ")");
}

TEST(CheckpointValidation, BadMagicIsNotACheckpoint) {
  EXPECT_CONTAINS(parse_error(bytes_of("this is a text file, not a checkpoint at all\n"), "notes.txt"),
                  "checkpoint 'notes.txt': not a checkpoint (bad magic) (byte 0)");
  EXPECT_CONTAINS(parse_error(bytes_of("PSGX")), "not a checkpoint (bad magic)");
  EXPECT_CONTAINS(parse_error(bytes_of("PSGD")), "truncated: file ends in the magic (byte 4)");
  EXPECT_CONTAINS(parse_error(Bytes{}), "truncated: empty file (byte 0)");
  Bytes crafted = sample_writer().serialize();
  crafted[3] = std::byte{'X'};
  fix_trailer(crafted);
  EXPECT_CONTAINS(parse_error(crafted), "not a checkpoint (bad magic) (byte 0)");
}

TEST(CheckpointValidation, UnsupportedVersionIsNamed) {
  Bytes bytes = sample_writer().serialize();
  store_le(bytes, 8, 7, 4);
  fix_trailer(bytes);
  EXPECT_CONTAINS(parse_error(bytes, "v.psgd"),
                  "checkpoint 'v.psgd': unsupported format version 7 (this build reads version 1) "
                  "(byte 8)");
}

TEST(CheckpointValidation, TrailerLengthMismatchIsNamed) {
  const Bytes good = sample_writer().serialize();
  Bytes bytes = good;
  fix_trailer(bytes);
  ASSERT_EQ(bytes, good);  // the helper computes what the writer wrote
  store_le(bytes, bytes.size() - 12, bytes.size() + 5, 8);
  const std::uint32_t crc = static_cast<std::uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
  store_le(bytes, bytes.size() - 4, crc, 4);
  EXPECT_CONTAINS(parse_error(bytes), "trailer says the file is " + std::to_string(bytes.size() + 5) +
                                          " bytes, but it is " + std::to_string(bytes.size()));

  Bytes appended = good;
  appended.resize(appended.size() + 3, std::byte{0});
  EXPECT_CONTAINS(parse_error(appended), "3 unexpected bytes after the last section");
}

TEST(CheckpointValidation, DuplicateSectionIsRejected) {
  CheckpointWriter writer;
  writer.add_int("alpha", 1);
  writer.add_int("alphb", 2);
  Bytes bytes = writer.serialize();
  // Section 2's name starts at 48 + 4; its last letter is at 56.
  ASSERT_EQ(static_cast<char>(bytes[56]), 'b');
  bytes[56] = std::byte{'a'};
  fix_trailer(bytes);
  EXPECT_CONTAINS(parse_error(bytes, "d.psgd"),
                  "checkpoint 'd.psgd': duplicate section 'alpha' (sections 1 and 2) (byte 52)");
}

TEST(CheckpointValidation, CraftedHeadersAreRejectedWithoutOverreading) {
  CheckpointWriter writer;
  writer.add_int("alpha", 1);
  const float value = 2.0f;
  writer.add("w", std::span<const float>(&value, 1));
  const Bytes good = writer.serialize();
  // Layout: count at 12; section 1: name length 20, name 24..28, kind 29, payload length 30, pad
  // 38..39, payload 40; section 2 header at 48: name length 48, name 52, kind 53, payload length 54.
  auto crafted = [&](std::size_t offset, std::uint64_t value, int width) {
    Bytes bytes = good;
    store_le(bytes, offset, value, width);
    fix_trailer(bytes);
    return parse_error(bytes);
  };
  EXPECT_CONTAINS(crafted(12, 70000, 4), "section count 70000 exceeds the limit 65536 (byte 12)");
  EXPECT_CONTAINS(crafted(12, 0xffffffff, 4), "exceeds the limit");
  EXPECT_CONTAINS(crafted(12, 3, 4), "truncated: header says 3 sections");
  EXPECT_CONTAINS(crafted(12, 1, 4), "unexpected bytes after the last section");
  EXPECT_CONTAINS(crafted(16, 24, 4), "header length 24, expected 20 (byte 16)");
  EXPECT_CONTAINS(crafted(20, 5000, 4), "section 1 has name length 5000 (allowed: 1..1024) (byte 20)");
  EXPECT_CONTAINS(crafted(20, 0, 4), "section 1 has name length 0");
  EXPECT_CONTAINS(crafted(20, 0xffffffff, 4), "section 1 has name length 4294967295");
  EXPECT_CONTAINS(crafted(24, 0x0a, 1), "section 1 has a name with non-printable bytes (byte 24)");
  EXPECT_CONTAINS(crafted(29, 9, 1), "section 'alpha' (1 of 2) has unknown kind 9 (byte 29)");
  EXPECT_CONTAINS(crafted(29, 0, 1), "has unknown kind 0");
  EXPECT_CONTAINS(crafted(30, 7, 8), "section 'alpha' (1 of 2) is int64 but has 7 payload bytes, not 8");
  EXPECT_CONTAINS(crafted(30, std::numeric_limits<std::uint64_t>::max(), 8), "is int64 but has");
  EXPECT_CONTAINS(crafted(54, 6, 8), "is float32 but has 6 payload bytes, not a multiple of 4");
  EXPECT_CONTAINS(crafted(54, std::uint64_t{1} << 62, 8),
                  "file ends 16 bytes into the 4611686018427387904-byte payload of section 'w'");
  EXPECT_CONTAINS(crafted(54, std::numeric_limits<std::uint64_t>::max() - 3, 8), "truncated");
  EXPECT_CONTAINS(crafted(38, 1, 1), "section 'alpha' (1 of 2) has a nonzero padding byte (byte 38)");
}

// Structural corruption that the checksum does not catch (the trailer is fixed after each mutation):
// every result is either a valid checkpoint or a DataError, never a crash or another exception.
TEST(CheckpointValidation, RandomStructuralCorruptionNeverCrashes) {
  const Bytes good = sample_writer(20).serialize();
  std::mt19937 rng(99);
  std::uniform_int_distribution<std::size_t> position(0, good.size() - 13);
  std::uniform_int_distribution<int> byte(0, 255);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    Bytes bytes = good;
    const int edits = 1 + trial % 4;
    for (int e = 0; e < edits; ++e) bytes[position(rng)] = static_cast<std::byte>(byte(rng));
    if (trial % 3 == 0) bytes.resize(bytes.size() - 1 - trial % 40);
    if (bytes.size() >= 12) fix_trailer(bytes);
    try {
      const CheckpointReader reader = CheckpointReader::parse(bytes, "fuzz");
      for (const std::string& name : reader.names()) (void)reader.kind(name);
    } catch (const DataError& error) {
      ++rejected;
      EXPECT_CONTAINS(error.what(), "checkpoint 'fuzz': ");
    }
  }
  EXPECT_GT(rejected, 100);
  // Pure noise too.
  for (int trial = 0; trial < 500; ++trial) {
    Bytes noise(static_cast<std::size_t>(trial));
    for (std::byte& b : noise) b = static_cast<std::byte>(byte(rng));
    if (trial % 2 == 0 && noise.size() >= 8) std::memcpy(noise.data(), "PSGDCKPT", 8);
    EXPECT_THROW((void)CheckpointReader::parse(noise, "noise"), DataError);
  }
}

TEST(CheckpointValidation, MissingSectionAndKindMismatchAreNamed) {
  const CheckpointReader reader = CheckpointReader::parse(sample_writer().serialize(), "run/ck.psgd");
  EXPECT_CONTAINS(data_error_of([&] { (void)reader.floats("momentum"); }),
                  "checkpoint 'run/ck.psgd': no section 'momentum' (expected float32)");
  EXPECT_CONTAINS(data_error_of([&] { (void)reader.integer("missing"); }), "no section 'missing'");
  EXPECT_CONTAINS(data_error_of([&] { (void)reader.kind("missing"); }), "no section 'missing'");
  EXPECT_CONTAINS(data_error_of([&] { (void)reader.floats("step"); }),
                  "checkpoint 'run/ck.psgd': section 'step' is int64, expected float32");
  EXPECT_CONTAINS(data_error_of([&] { (void)reader.integer("weights"); }),
                  "section 'weights' is float32, expected int64");
  EXPECT_CONTAINS(data_error_of([&] { (void)reader.string("blob"); }),
                  "section 'blob' is bytes, expected string");
  EXPECT_CONTAINS(data_error_of([&] { (void)reader.bytes("label"); }),
                  "section 'label' is string, expected bytes");
}

TEST(CheckpointValidation, WriterRejectsBadSectionNames) {
  CheckpointWriter writer;
  writer.add_int("step", 1);
  EXPECT_THROW(writer.add_int("step", 2), UsageError);
  EXPECT_THROW(writer.add_string("", "x"), UsageError);
  EXPECT_THROW(writer.add_string("new\nline", "x"), UsageError);
  EXPECT_THROW(writer.add_string(std::string(kCheckpointMaxNameLength + 1, 'n'), "x"), UsageError);
  writer.add_string(std::string(kCheckpointMaxNameLength, 'n'), "x");
  EXPECT_EQ(writer.section_count(), 2u);
  EXPECT_NO_THROW((void)CheckpointReader::parse(writer.serialize(), "names"));
}

// ---- files ----

TEST(CheckpointFile, WriteAtomicallyReplacesAndLeavesNoTemporaries) {
  TempDir dir;
  const fs::path path = dir.file("c.psgd");
  CheckpointWriter first;
  first.add_int("step", 1);
  first.write_atomically(path);
  CheckpointWriter second;
  second.add_int("step", 2);
  second.write_atomically(path);
  EXPECT_EQ(CheckpointReader::read_file(path).integer("step"), 2);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"c.psgd"});
}

TEST(CheckpointFile, WriteIntoMissingDirectoryIsAClearError) {
  TempDir dir;
  const fs::path path = fs::path(dir.path()) / "no_such_dir" / "c.psgd";
  try {
    sample_writer().write_atomically(path);
    FAIL() << "expected UsageError";
  } catch (const UsageError& error) {
    EXPECT_CONTAINS(error.what(), "cannot write checkpoint '" + path.string() + "': directory '" +
                                      (fs::path(dir.path()) / "no_such_dir").string() +
                                      "' does not exist");
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(CheckpointFile, FailedRenameKeepsTheOldStateAndRemovesTheTemporary) {
  TempDir dir;
  const fs::path target = dir.file("occupied");
  fs::create_directory(target);
  fs::path inside = target / "keep";
  std::ofstream(inside) << "x";
  const std::string message = data_error_of([&] { sample_writer().write_atomically(target); });
  EXPECT_CONTAINS(message, "cannot write checkpoint '" + target.string() + "': renaming '");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"occupied"});
  EXPECT_TRUE(fs::exists(inside));
}

TEST(CheckpointFile, ReadErrorsNameTheFile) {
  TempDir dir;
  const fs::path missing = dir.file("missing.psgd");
  EXPECT_CONTAINS(data_error_of([&] { (void)CheckpointReader::read_file(missing); }),
                  "checkpoint '" + missing.string() + "': cannot open: No such file or directory");
  EXPECT_CONTAINS(data_error_of([&] { (void)CheckpointReader::read_file(dir.path()); }),
                  "is a directory");
  const fs::path torn = dir.file("torn.psgd");
  const Bytes full = sample_writer().serialize();
  write_all(torn, Bytes(full.begin(), full.begin() + 100));
  EXPECT_CONTAINS(data_error_of([&] { (void)CheckpointReader::read_file(torn); }),
                  "checkpoint '" + torn.string() + "': truncated");
}

// ---- directories ----

const std::vector<std::string> kParts = {"shared", "rank0", "rank1"};

void write_set(const fs::path& dir, std::int64_t iteration,
               const std::vector<std::string>& parts = kParts) {
  for (const std::string& part : parts) {
    CheckpointWriter writer;
    writer.add_int("iteration", iteration);
    writer.add_string("part", part);
    const std::vector<float> values = random_floats(64, static_cast<std::uint32_t>(iteration));
    writer.add("values", std::span<const float>(values));
    writer.write_atomically(checkpoint_path(dir, iteration, part));
  }
}

struct Warnings {
  std::vector<std::string> lines;
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) { lines.push_back(line); };
  }
};

TEST(CheckpointDirectory, PathFormat) {
  EXPECT_EQ(checkpoint_path("/ck", 42, "rank3"), fs::path("/ck/checkpoint-000000000042-rank3.psgd"));
  EXPECT_EQ(checkpoint_path("ck", 999999999999, "shared").filename(),
            "checkpoint-999999999999-shared.psgd");
  EXPECT_THROW((void)checkpoint_path("ck", -1, "shared"), UsageError);
  EXPECT_THROW((void)checkpoint_path("ck", 1000000000000, "shared"), UsageError);
  EXPECT_THROW((void)checkpoint_path("ck", 1, ""), UsageError);
  EXPECT_THROW((void)checkpoint_path("ck", 1, "rank/0"), UsageError);
  EXPECT_THROW((void)checkpoint_path("ck", 1, "a.b"), UsageError);
}

TEST(CheckpointDirectory, FindsTheNewestValidSet) {
  TempDir dir;
  for (std::int64_t iteration : {10, 30, 20}) write_set(dir.path(), iteration);
  Warnings warnings;
  const auto found = find_newest_valid_checkpoint(dir.path(), kParts, warnings.sink());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->iteration, 30);
  ASSERT_EQ(found->parts.size(), 3u);
  EXPECT_EQ(found->parts.at("rank1"), checkpoint_path(dir.path(), 30, "rank1"));
  EXPECT_EQ(CheckpointReader::read_file(found->parts.at("rank1")).string("part"), "rank1");
  EXPECT_TRUE(warnings.lines.empty());
  // With no required parts, every part present must be valid.
  const auto any = find_newest_valid_checkpoint(dir.path(), {}, warnings.sink());
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->iteration, 30);
}

TEST(CheckpointDirectory, FallsBackWhenTheNewestIsTruncated) {
  TempDir dir;
  write_set(dir.path(), 10);
  write_set(dir.path(), 20);
  const fs::path torn = checkpoint_path(dir.path(), 20, "rank1");
  const Bytes full = read_all(torn);
  write_all(torn, Bytes(full.begin(), full.begin() + full.size() / 2));
  Warnings warnings;
  const auto found = find_newest_valid_checkpoint(dir.path(), kParts, warnings.sink());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->iteration, 10);
  ASSERT_EQ(warnings.lines.size(), 1u);
  EXPECT_CONTAINS(warnings.lines[0], "skipping checkpoint iteration 20: checkpoint '" + torn.string() +
                                         "': truncated");
  EXPECT_EQ(warnings.lines[0].find('\n'), std::string::npos);
}

TEST(CheckpointDirectory, FallsBackWhenTheNewestIsCorrupt) {
  TempDir dir;
  write_set(dir.path(), 10);
  write_set(dir.path(), 20);
  const fs::path corrupt = checkpoint_path(dir.path(), 20, "shared");
  Bytes bytes = read_all(corrupt);
  bytes[bytes.size() / 2] ^= std::byte{0x01};
  write_all(corrupt, bytes);
  Warnings warnings;
  const auto found = find_newest_valid_checkpoint(dir.path(), kParts, warnings.sink());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->iteration, 10);
  ASSERT_EQ(warnings.lines.size(), 1u);
  EXPECT_CONTAINS(warnings.lines[0], corrupt.string());
  EXPECT_CONTAINS(warnings.lines[0], "checksum mismatch");
}

TEST(CheckpointDirectory, FallsBackWhenARequiredPartIsMissing) {
  TempDir dir;
  write_set(dir.path(), 10);
  write_set(dir.path(), 20, {"shared", "rank1"});
  Warnings warnings;
  const auto found = find_newest_valid_checkpoint(dir.path(), kParts, warnings.sink());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->iteration, 10);
  ASSERT_EQ(warnings.lines.size(), 1u);
  EXPECT_CONTAINS(warnings.lines[0], "skipping checkpoint iteration 20: part 'rank0' is missing (no " +
                                         checkpoint_path(dir.path(), 20, "rank0").string() + ")");
}

TEST(CheckpointDirectory, IgnoresTemporaryAndForeignFiles) {
  TempDir dir;
  write_set(dir.path(), 10);
  const Bytes garbage = bytes_of("half-written");
  write_all(dir.file(".checkpoint-000000000020-shared.psgd.tmp.1234.deadbeef"), garbage);
  write_all(dir.file("checkpoint-20-shared.psgd"), garbage);
  write_all(dir.file("checkpoint-000000000020-shared.psgd.bak"), garbage);
  write_all(dir.file("notes.txt"), garbage);
  fs::create_directory(dir.file("checkpoint-000000000030"));
  Warnings warnings;
  const auto found = find_newest_valid_checkpoint(dir.path(), kParts, warnings.sink());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->iteration, 10);
  EXPECT_TRUE(warnings.lines.empty()) << warnings.lines.front();
}

TEST(CheckpointDirectory, NothingUsableGivesNullopt) {
  TempDir dir;
  Warnings warnings;
  EXPECT_FALSE(find_newest_valid_checkpoint(dir.path(), kParts, warnings.sink()).has_value());
  EXPECT_FALSE(
      find_newest_valid_checkpoint(dir.file("absent"), kParts, warnings.sink()).has_value());
  EXPECT_TRUE(warnings.lines.empty());
  write_set(dir.path(), 10, {"shared"});
  write_all(checkpoint_path(dir.path(), 20, "rank0"), bytes_of("junk"));
  EXPECT_FALSE(find_newest_valid_checkpoint(dir.path(), kParts, warnings.sink()).has_value());
  EXPECT_EQ(warnings.lines.size(), 4u);  // 20: shared and rank1 missing; 10: rank0 and rank1
  write_all(dir.file("plain"), bytes_of("x"));
  EXPECT_THROW((void)find_newest_valid_checkpoint(dir.file("plain"), kParts, warnings.sink()),
               UsageError);
  EXPECT_THROW((void)find_newest_valid_checkpoint(dir.path(), {"bad/part"}, warnings.sink()),
               UsageError);
}

TEST(CheckpointPrune, KeepsTheNewestCompleteIterations) {
  TempDir dir;
  for (std::int64_t iteration : {10, 20, 30, 40, 50}) write_set(dir.path(), iteration);
  write_all(dir.file(".checkpoint-000000000010-rank0.psgd.tmp.1.ab"), bytes_of("stale"));
  write_all(dir.file(".checkpoint-000000000050-rank0.psgd.tmp.1.cd"), bytes_of("in flight"));
  write_all(dir.file("notes.txt"), bytes_of("keep me"));
  const auto deleted = prune_checkpoints(dir.path(), 2, kParts);
  EXPECT_EQ(deleted.size(), 3u * 3u + 1u);
  const std::vector<std::string> expected = {
      ".checkpoint-000000000050-rank0.psgd.tmp.1.cd", "checkpoint-000000000040-rank0.psgd",
      "checkpoint-000000000040-rank1.psgd",           "checkpoint-000000000040-shared.psgd",
      "checkpoint-000000000050-rank0.psgd",           "checkpoint-000000000050-rank1.psgd",
      "checkpoint-000000000050-shared.psgd",          "notes.txt"};
  EXPECT_EQ(dir.entries(), expected);
  EXPECT_TRUE(prune_checkpoints(dir.path(), 2, kParts).empty());
  EXPECT_THROW((void)prune_checkpoints(dir.path(), 0, kParts), UsageError);
  EXPECT_TRUE(prune_checkpoints(dir.file("absent"), 1, kParts).empty());
}

TEST(CheckpointPrune, NeverTouchesNewerIncompleteIterations) {
  TempDir dir;
  write_set(dir.path(), 10);
  write_set(dir.path(), 20);
  write_set(dir.path(), 30, {"rank0"});  // other ranks still writing
  prune_checkpoints(dir.path(), 1, kParts);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{
                               "checkpoint-000000000020-rank0.psgd", "checkpoint-000000000020-rank1.psgd",
                               "checkpoint-000000000020-shared.psgd",
                               "checkpoint-000000000030-rank0.psgd"}));
}

TEST(CheckpointPrune, DeletesTheCompanionsOfTheIterationsItDeletes) {
  TempDir dir;
  for (std::int64_t iteration : {10, 20, 30}) {
    write_set(dir.path(), iteration);
    write_all(checkpoint_companion_path(dir.path(), iteration, "model.pt"), bytes_of("model"));
  }
  write_all(checkpoint_companion_path(dir.path(), 5, "model.pt"), bytes_of("set already gone"));
  write_all(checkpoint_companion_path(dir.path(), 40, "model.pt"), bytes_of("set still being written"));
  write_all(checkpoint_companion_path(dir.path(), 10, "other.bin"), bytes_of("not a companion asked for"));
  const auto deleted = prune_checkpoints(dir.path(), 2, kParts, {"model.pt"});
  EXPECT_EQ(deleted.size(), 3u + 2u);  // iteration 10's three parts and its model; iteration 5's model
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{
                               "checkpoint-000000000010-other.bin", "checkpoint-000000000020-model.pt",
                               "checkpoint-000000000020-rank0.psgd", "checkpoint-000000000020-rank1.psgd",
                               "checkpoint-000000000020-shared.psgd", "checkpoint-000000000030-model.pt",
                               "checkpoint-000000000030-rank0.psgd", "checkpoint-000000000030-rank1.psgd",
                               "checkpoint-000000000030-shared.psgd", "checkpoint-000000000040-model.pt"}));
  // Without companions asked for, prune_checkpoints touches no file but the parts and their temporaries.
  for (std::int64_t iteration : {40, 50}) write_set(dir.path(), iteration);
  prune_checkpoints(dir.path(), 1, kParts);
  EXPECT_TRUE(fs::exists(checkpoint_companion_path(dir.path(), 20, "model.pt")));
  EXPECT_FALSE(fs::exists(checkpoint_path(dir.path(), 40, "shared")));
}

TEST(CheckpointName, ParsesWhatCheckpointPathWrites) {
  const auto name = parse_checkpoint_name(checkpoint_path("dir", 42, "rank3").filename().string());
  ASSERT_TRUE(name.has_value());
  EXPECT_EQ(name->iteration, 42);
  EXPECT_EQ(name->part, "rank3");
  EXPECT_EQ(checkpoint_companion_path("dir", 42, "model.pt"), fs::path("dir") / "checkpoint-000000000042-model.pt");
  for (const char* other : {"checkpoint-000000000042-model.pt", "checkpoint-00000000004x-rank0.psgd",
                            "checkpoint-000000000042-.psgd", "checkpoint-000000000042_rank0.psgd",
                            ".checkpoint-000000000042-rank0.psgd.tmp.1", "checkpoint-000000000042-bad/part.psgd"}) {
    EXPECT_FALSE(parse_checkpoint_name(other).has_value()) << other;
  }
}

TEST(CheckpointPrune, NeverDeletesTheNewestValidCheckpoint) {
  TempDir dir;
  for (std::int64_t iteration : {10, 20, 30}) write_set(dir.path(), iteration);
  const fs::path corrupt = checkpoint_path(dir.path(), 30, "rank1");
  Bytes bytes = read_all(corrupt);
  bytes[60] ^= std::byte{0x80};
  write_all(corrupt, bytes);
  prune_checkpoints(dir.path(), 1, kParts);
  Warnings warnings;
  const auto found = find_newest_valid_checkpoint(dir.path(), kParts, warnings.sink());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->iteration, 20);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir.path(), 10, "shared")));
}

// The writer of a set vouches for it (written_here): it is not read back, so only it is kept.
TEST(CheckpointPrune, TrustsTheSetItsCallerWrote) {
  TempDir dir;
  for (std::int64_t iteration : {10, 20, 30}) write_set(dir.path(), iteration);
  const fs::path altered = checkpoint_path(dir.path(), 30, "rank1");
  Bytes bytes = read_all(altered);
  bytes[60] ^= std::byte{0x80};  // what a read-back would see as corrupt
  write_all(altered, bytes);
  prune_checkpoints(dir.path(), 1, kParts, {}, /*written_here=*/30);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir.path(), 20, "shared")));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir.path(), 30, "shared")));
}

}  // namespace
}  // namespace pipesgd
