// Tests of the data layer: IDX reader, MNIST-format loader, synthetic data, Random, sampler,
// batch assembly.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/random.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/data/idx_reader.h"
#include "pipesgd/data/sampler.h"

namespace {

using pipesgd::DataError;
using pipesgd::TempDir;
using pipesgd::UsageError;
using Bytes = std::vector<std::uint8_t>;

// IDX bytes: magic (0, 0, type, dims.size()), big-endian dims, then payload.
Bytes idx_bytes(std::uint8_t type, const std::vector<std::uint32_t>& dims, const Bytes& payload) {
  Bytes bytes = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::uint32_t size : dims) {
    bytes.push_back(static_cast<std::uint8_t>(size >> 24));
    bytes.push_back(static_cast<std::uint8_t>(size >> 16));
    bytes.push_back(static_cast<std::uint8_t>(size >> 8));
    bytes.push_back(static_cast<std::uint8_t>(size));
  }
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

Bytes counting_payload(std::size_t count) {
  Bytes payload(count);
  for (std::size_t index = 0; index < count; ++index)
    payload[index] = static_cast<std::uint8_t>(index * 7);
  return payload;
}

Bytes random_payload(std::size_t count, std::uint64_t seed) {
  pipesgd::Random random(seed);
  Bytes payload(count);
  for (std::uint8_t& value : payload) value = static_cast<std::uint8_t>(random.next_u64());
  return payload;
}

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gzip(const std::string& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(file), Z_OK);
}

Bytes read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs `action`, expects an exception of type E whose message is one line and contains every part.
template <typename E>
void expect_error(const std::function<void()>& action, const std::vector<std::string>& parts) {
  try {
    action();
    ADD_FAILURE() << "no exception; expected one containing '" << parts.front() << "'";
  } catch (const E& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    }
  }
}

// ----------------------------------------------------------------------------------------------
// IDX reader

TEST(IdxReader, ReadsPlainFile) {
  TempDir dir;
  const std::string path = dir.file("plain-idx3-ubyte");
  write_plain(path, idx_bytes(0x08, {3, 2, 2}, counting_payload(12)));
  const pipesgd::IdxArray array = pipesgd::read_idx(path);
  EXPECT_EQ(array.element_type, 0x08);
  EXPECT_EQ(array.dims, (std::vector<std::uint32_t>{3, 2, 2}));
  EXPECT_EQ(array.data, counting_payload(12));
  EXPECT_EQ(array.element_count(), 12u);
}

TEST(IdxReader, ReadsGzipFile) {
  TempDir dir;
  const std::string path = dir.file("images-idx3-ubyte.gz");
  const Bytes payload = random_payload(100 * 28 * 28, 5);
  write_gzip(path, idx_bytes(0x08, {100, 28, 28}, payload));
  // The file on disk really is compressed (gzip magic), so the reader had to inflate it.
  const Bytes raw = read_raw(path);
  ASSERT_GE(raw.size(), 2u);
  EXPECT_EQ(raw[0], 0x1F);
  EXPECT_EQ(raw[1], 0x8B);
  const pipesgd::IdxArray array = pipesgd::read_idx(path);
  EXPECT_EQ(array.dims, (std::vector<std::uint32_t>{100, 28, 28}));
  EXPECT_EQ(array.data, payload);
}

TEST(IdxReader, ReadsOneAndFourDimensions) {
  TempDir dir;
  write_plain(dir.file("one"), idx_bytes(0x08, {5}, counting_payload(5)));
  write_gzip(dir.file("four.gz"), idx_bytes(0x08, {2, 3, 1, 2}, counting_payload(12)));
  const pipesgd::IdxArray one = pipesgd::read_idx(dir.file("one"));
  EXPECT_EQ(one.dims, (std::vector<std::uint32_t>{5}));
  EXPECT_EQ(one.data, counting_payload(5));
  const pipesgd::IdxArray four = pipesgd::read_idx(dir.file("four.gz"));
  EXPECT_EQ(four.dims, (std::vector<std::uint32_t>{2, 3, 1, 2}));
  EXPECT_EQ(four.data, counting_payload(12));
}

TEST(IdxReader, ParsesBigEndianDimensions) {
  const Bytes bytes = idx_bytes(0x08, {0x00000102, 0x00000003}, counting_payload(0x102 * 3));
  const pipesgd::IdxArray array = pipesgd::parse_idx(bytes, "memory");
  EXPECT_EQ(array.dims, (std::vector<std::uint32_t>{258, 3}));
  EXPECT_EQ(array.data.size(), 774u);
}

TEST(IdxReader, TruncatedAtEveryOffsetPlainAndGzip) {
  TempDir dir;
  const Bytes full = idx_bytes(0x08, {3, 2, 2}, counting_payload(12));  // 16 header + 12 data
  ASSERT_EQ(full.size(), 28u);
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    const Bytes truncated(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut));
    const std::string plain = dir.file("cut-" + std::to_string(cut));
    const std::string gzipped = plain + ".gz";
    write_plain(plain, truncated);
    write_gzip(gzipped, truncated);
    SCOPED_TRACE("cut at " + std::to_string(cut));
    expect_error<DataError>([&] { pipesgd::read_idx(plain); }, {"data file " + plain, "truncated"});
    expect_error<DataError>([&] { pipesgd::read_idx(gzipped); },
                            {"data file " + gzipped, "truncated"});
    expect_error<DataError>([&] { pipesgd::parse_idx(truncated, "memory"); }, {"truncated"});
  }
}

TEST(IdxReader, TruncationMessagesGiveExpectedAndFoundBytes) {
  TempDir dir;
  const Bytes full = idx_bytes(0x08, {3, 2, 2}, counting_payload(12));
  const std::string payload_cut = dir.file("payload-cut");
  write_plain(payload_cut, Bytes(full.begin(), full.begin() + 20));
  expect_error<DataError>(
      [&] { pipesgd::read_idx(payload_cut); },
      {"data file " + payload_cut + ": truncated: header says 3x2x2 = 12 bytes of data, found 4"});
  const std::string magic_cut = dir.file("magic-cut");
  write_plain(magic_cut, Bytes(full.begin(), full.begin() + 3));
  expect_error<DataError>([&] { pipesgd::read_idx(magic_cut); },
                          {"4 bytes of magic number, found 3"});
  const std::string dims_cut = dir.file("dims-cut");
  write_plain(dims_cut, Bytes(full.begin(), full.begin() + 9));
  expect_error<DataError>([&] { pipesgd::read_idx(dims_cut); },
                          {"3 dimensions (12 bytes of sizes), found 5"});
}

TEST(IdxReader, TruncatedGzipStream) {
  TempDir dir;
  const std::string whole = dir.file("whole.gz");
  // Random bytes do not compress, so the compressed file is about as long as the data.
  write_gzip(whole, idx_bytes(0x08, {50, 28, 28}, random_payload(50 * 28 * 28, 9)));
  const Bytes compressed = read_raw(whole);
  ASSERT_GT(compressed.size(), 30000u);
  for (std::size_t cut : {std::size_t{12}, std::size_t{100}, compressed.size() / 2,
                          compressed.size() - 8, compressed.size() - 1}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    const std::string path = dir.file("cut-" + std::to_string(cut) + ".gz");
    write_plain(path,
                Bytes(compressed.begin(), compressed.begin() + static_cast<std::ptrdiff_t>(cut)));
    expect_error<DataError>([&] { pipesgd::read_idx(path); }, {"data file " + path, "truncated"});
  }
}

TEST(IdxReader, CorruptGzipIsDataError) {
  TempDir dir;
  const std::string whole = dir.file("whole.gz");
  write_gzip(whole, idx_bytes(0x08, {20, 28, 28}, random_payload(20 * 28 * 28, 11)));
  Bytes compressed = read_raw(whole);
  // Damage the data in the middle, then the checksum at the end.
  for (std::size_t position : {compressed.size() / 2, compressed.size() - 6}) {
    Bytes damaged = compressed;
    damaged[position] ^= 0x5A;
    const std::string path = dir.file("damaged-" + std::to_string(position) + ".gz");
    write_plain(path, damaged);
    expect_error<DataError>([&] { pipesgd::read_idx(path); }, {"data file " + path});
  }
}

TEST(IdxReader, WrongMagicIsRejected) {
  TempDir dir;
  Bytes bytes = idx_bytes(0x08, {2}, {1, 2});
  bytes[1] = 0x03;
  const std::string path = dir.file("bad-magic");
  write_plain(path, bytes);
  expect_error<DataError>([&] { pipesgd::read_idx(path); },
                          {"data file " + path, "not an IDX file", "0x03"});
  write_plain(path, {'h', 'e', 'l', 'l', 'o', '\n'});
  expect_error<DataError>([&] { pipesgd::read_idx(path); }, {"not an IDX file"});
}

TEST(IdxReader, UnsupportedTypeIsNamed) {
  TempDir dir;
  const std::string path = dir.file("floats.gz");
  write_gzip(path, idx_bytes(0x0D, {2}, Bytes(8, 0)));
  expect_error<DataError>([&] { pipesgd::read_idx(path); },
                          {"data file " + path, "unsupported element type 0x0D (32-bit float)"});
  expect_error<DataError>([&] { pipesgd::parse_idx(idx_bytes(0x09, {1}, {0}), "m"); },
                          {"0x09 (signed byte)"});
  expect_error<DataError>([&] { pipesgd::parse_idx(idx_bytes(0x42, {1}, {0}), "m"); }, {"0x42"});
}

TEST(IdxReader, DimensionCountOutOfRange) {
  expect_error<DataError>(
      [] {
        pipesgd::parse_idx(Bytes{0, 0, 8, 0}, "m");
      },
      {"number of dimensions 0"});
  expect_error<DataError>(
      [] {
        pipesgd::parse_idx(idx_bytes(0x08, {1, 1, 1, 1, 1}, {0}), "m");
      },
      {"number of dimensions 5"});
}

TEST(IdxReader, ZeroDimensionIsRejected) {
  expect_error<DataError>(
      [] {
        pipesgd::parse_idx(idx_bytes(0x08, {3, 0, 2}, {}), "m");
      },
      {"dimension 1 is zero"});
}

TEST(IdxReader, HugeHeaderSizesDoNotOverflowOrAllocate) {
  expect_error<DataError>(
      [] {
        pipesgd::parse_idx(idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, {1, 2}), "m");
      },
      {"overflow"});
  // 2^64 - 2^33 + 1 elements fit in size_t; the reader must report truncation, not try to allocate.
  expect_error<DataError>(
      [] {
        pipesgd::parse_idx(idx_bytes(0x08, {0xFFFFFFFF, 0xFFFFFFFF}, {1, 2, 3}), "m");
      },
      {"truncated", "found 3"});
}

TEST(IdxReader, TrailingBytesAreRejected) {
  TempDir dir;
  Bytes bytes = idx_bytes(0x08, {2, 2}, counting_payload(4));
  bytes.insert(bytes.end(), {9, 9, 9});
  write_plain(dir.file("trailing"), bytes);
  write_gzip(dir.file("trailing.gz"), bytes);
  for (const std::string& path : {dir.file("trailing"), dir.file("trailing.gz")}) {
    expect_error<DataError>([&] { pipesgd::read_idx(path); },
                            {"data file " + path, "3 unexpected trailing bytes after 4 bytes"});
  }
}

TEST(IdxReader, MissingFileAndDirectory) {
  TempDir dir;
  const std::string missing = dir.file("no-such-file.gz");
  expect_error<DataError>([&] { pipesgd::read_idx(missing); },
                          {"data file " + missing + ": not found"});
  expect_error<DataError>([&] { pipesgd::read_idx(dir.path()); }, {"is a directory"});
}

TEST(IdxReader, EmptyGzipFileIsTruncated) {
  TempDir dir;
  write_gzip(dir.file("empty.gz"), {});
  expect_error<DataError>([&] { pipesgd::read_idx(dir.file("empty.gz")); },
                          {"truncated", "found 0"});
}

// Small in-process fuzz: random mutations of valid files must give an array or a DataError.
TEST(IdxReader, MutatedInputsNeverCrash) {
  const Bytes valid = idx_bytes(0x08, {4, 3, 3}, counting_payload(36));
  pipesgd::Random random(77);
  std::size_t accepted = 0;
  std::size_t rejected = 0;
  for (int round = 0; round < 20000; ++round) {
    Bytes mutated = valid;
    const std::uint64_t edit_count = 1 + random.uniform_below(4);
    for (std::uint64_t edit = 0; edit < edit_count; ++edit) {
      const std::uint64_t kind = random.uniform_below(3);
      if (kind == 0 && !mutated.empty()) {
        mutated[random.uniform_below(mutated.size())] =
            static_cast<std::uint8_t>(random.next_u64());
      } else if (kind == 1 && !mutated.empty()) {
        mutated.resize(random.uniform_below(mutated.size()));
      } else {
        mutated.push_back(static_cast<std::uint8_t>(random.next_u64()));
      }
    }
    try {
      const pipesgd::IdxArray array = pipesgd::parse_idx(mutated, "fuzz");
      std::size_t product = 1;
      for (std::uint32_t size : array.dims) product *= size;
      ASSERT_EQ(array.data.size(), product);
      ++accepted;
    } catch (const DataError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000u);
  EXPECT_GT(accepted, 0u);  // e.g. a payload byte changed
}

// The same through files, so the zlib path sees damaged gzip streams too.
TEST(IdxReader, MutatedGzipFilesNeverCrash) {
  TempDir dir;
  const std::string whole = dir.file("whole.gz");
  write_gzip(whole, idx_bytes(0x08, {6, 5, 5}, random_payload(150, 3)));
  const Bytes compressed = read_raw(whole);
  const std::string path = dir.file("mutated.gz");
  pipesgd::Random random(78);
  for (int round = 0; round < 400; ++round) {
    Bytes mutated = compressed;
    mutated[random.uniform_below(mutated.size())] = static_cast<std::uint8_t>(random.next_u64());
    if (random.uniform_below(2) == 0) mutated.resize(random.uniform_below(mutated.size()));
    write_plain(path, mutated);
    try {
      pipesgd::read_idx(path);
    } catch (const DataError& error) {
      EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
    }
  }
}

// ----------------------------------------------------------------------------------------------
// MNIST-format loader

struct SplitFiles {
  std::size_t count;
  std::uint32_t rows = 2;
  std::uint32_t columns = 3;
  bool gzip = false;
};

Bytes image_payload(std::size_t count, std::size_t features) {
  Bytes pixels(count * features);
  for (std::size_t index = 0; index < pixels.size(); ++index)
    pixels[index] = static_cast<std::uint8_t>(index % 256);
  return pixels;
}

Bytes label_payload(std::size_t count) {
  Bytes labels(count);
  for (std::size_t index = 0; index < count; ++index)
    labels[index] = static_cast<std::uint8_t>((index * 3) % 10);
  return labels;
}

void write_split(const TempDir& dir, const std::string& prefix, const SplitFiles& split) {
  const std::string suffix = split.gzip ? ".gz" : "";
  const auto write = split.gzip ? write_gzip : write_plain;
  write(dir.file(prefix + "-images-idx3-ubyte" + suffix),
        idx_bytes(0x08, {static_cast<std::uint32_t>(split.count), split.rows, split.columns},
                  image_payload(split.count, std::size_t{split.rows} * split.columns)));
  write(dir.file(prefix + "-labels-idx1-ubyte" + suffix),
        idx_bytes(0x08, {static_cast<std::uint32_t>(split.count)}, label_payload(split.count)));
}

TEST(DataLoader, LoadsGzippedTrainAndPlainTest) {
  TempDir dir;
  write_split(dir, "train", {.count = 7, .gzip = true});
  write_split(dir, "t10k", {.count = 4, .gzip = false});
  const pipesgd::DataSplits splits = pipesgd::load_mnist_format(dir.path());
  EXPECT_EQ(splits.train.size, 7u);
  EXPECT_EQ(splits.test.size, 4u);
  for (const pipesgd::Dataset* dataset : {&splits.train, &splits.test}) {
    EXPECT_EQ(dataset->features, 6u);
    EXPECT_EQ(dataset->classes, 10u);
    ASSERT_EQ(dataset->inputs.size(), dataset->size * 6);
    ASSERT_EQ(dataset->labels.size(), dataset->size);
    const Bytes pixels = image_payload(dataset->size, 6);
    for (std::size_t index = 0; index < pixels.size(); ++index) {
      ASSERT_EQ(dataset->inputs[index], static_cast<float>(pixels[index]) / 255.0f) << index;
    }
    for (std::size_t index = 0; index < dataset->size; ++index) {
      EXPECT_EQ(dataset->labels[index], static_cast<std::int32_t>((index * 3) % 10));
    }
  }
  EXPECT_EQ(splits.train.inputs[1], 1.0f / 255.0f);
  const std::string dir_name = std::filesystem::path(dir.path()).filename().string();
  EXPECT_EQ(splits.train.name, dir_name + "/train");
  EXPECT_EQ(splits.test.name, dir_name + "/test");
}

TEST(DataLoader, PixelScaleReachesOne) {
  TempDir dir;
  write_split(dir, "train",
              {.count = 50, .rows = 4, .columns = 4});  // 800 pixels: values 0..255 repeat
  write_split(dir, "t10k", {.count = 1, .rows = 4, .columns = 4});
  const pipesgd::DataSplits splits = pipesgd::load_mnist_format(dir.path());
  EXPECT_EQ(*std::max_element(splits.train.inputs.begin(), splits.train.inputs.end()), 1.0f);
  EXPECT_EQ(*std::min_element(splits.train.inputs.begin(), splits.train.inputs.end()), 0.0f);
  EXPECT_FLOAT_EQ(splits.train.inputs[51], 0.2f);
}

TEST(DataLoader, PlainFileWinsOverGzip) {
  TempDir dir;
  write_split(dir, "train", {.count = 3});
  write_split(dir, "t10k", {.count = 2});
  write_plain(dir.file("train-images-idx3-ubyte.gz"), {'j', 'u', 'n', 'k'});
  EXPECT_EQ(pipesgd::load_mnist_format(dir.path()).train.size, 3u);
}

TEST(DataLoader, CountMismatchNamesBothCountsAndFiles) {
  TempDir dir;
  write_split(dir, "train", {.count = 5});
  write_split(dir, "t10k", {.count = 2});
  write_plain(dir.file("train-labels-idx1-ubyte"), idx_bytes(0x08, {4}, label_payload(4)));
  expect_error<DataError>([&] { pipesgd::load_mnist_format(dir.path()); },
                          {"count mismatch", dir.file("train-images-idx3-ubyte") + " has 5 images",
                           dir.file("train-labels-idx1-ubyte") + " has 4 labels"});
}

TEST(DataLoader, LabelOutOfRangeNamesIndexAndValue) {
  TempDir dir;
  write_split(dir, "train", {.count = 5});
  write_split(dir, "t10k", {.count = 6, .gzip = true});
  Bytes labels = label_payload(6);
  labels[4] = 10;
  write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"), idx_bytes(0x08, {6}, labels));
  expect_error<DataError>([&] { pipesgd::load_mnist_format(dir.path()); },
                          {dir.file("t10k-labels-idx1-ubyte.gz"), "label at index 4 is 10"});
}

TEST(DataLoader, WrongDimensionsAreRejected) {
  TempDir dir;
  write_split(dir, "train", {.count = 5});
  write_split(dir, "t10k", {.count = 2});
  write_plain(dir.file("train-images-idx3-ubyte"), idx_bytes(0x08, {5, 6}, image_payload(5, 6)));
  expect_error<DataError>([&] { pipesgd::load_mnist_format(dir.path()); },
                          {dir.file("train-images-idx3-ubyte"), "3 dimensions", "found 2"});
  write_split(dir, "train", {.count = 5});
  write_plain(dir.file("t10k-labels-idx1-ubyte"), idx_bytes(0x08, {2, 1}, {1, 2}));
  expect_error<DataError>([&] { pipesgd::load_mnist_format(dir.path()); },
                          {dir.file("t10k-labels-idx1-ubyte"), "1 dimension", "found 2"});
}

TEST(DataLoader, ImageSizeMismatchBetweenSplits) {
  TempDir dir;
  write_split(dir, "train", {.count = 5, .rows = 2, .columns = 3});
  write_split(dir, "t10k", {.count = 2, .rows = 3, .columns = 3});
  expect_error<DataError>([&] { pipesgd::load_mnist_format(dir.path()); },
                          {"image size mismatch", "6", "9"});
}

TEST(DataLoader, TruncatedFileInDirectory) {
  TempDir dir;
  write_split(dir, "train", {.count = 5});
  write_split(dir, "t10k", {.count = 2});
  const Bytes whole = read_raw(dir.file("train-images-idx3-ubyte"));
  write_plain(dir.file("train-images-idx3-ubyte"), Bytes(whole.begin(), whole.end() - 1));
  expect_error<DataError>([&] { pipesgd::load_mnist_format(dir.path()); },
                          {dir.file("train-images-idx3-ubyte"), "truncated", "found 29"});
}

TEST(DataLoader, MissingFileNamesIt) {
  TempDir dir;
  write_split(dir, "train", {.count = 5});
  write_split(dir, "t10k", {.count = 2});
  std::filesystem::remove(dir.file("t10k-labels-idx1-ubyte"));
  expect_error<DataError>(
      [&] { pipesgd::load_mnist_format(dir.path()); },
      {"data directory " + dir.path(),
       "missing t10k-labels-idx1-ubyte (or t10k-labels-idx1-ubyte.gz)", "--data-dir"});
}

TEST(DataLoader, MissingDirectory) {
  TempDir dir;
  const std::string missing = dir.file("absent");
  expect_error<DataError>([&] { pipesgd::load_mnist_format(missing); },
                          {"data directory " + missing + " does not exist", "--data-dir"});
  write_plain(dir.file("a-file"), {1});
  expect_error<DataError>([&] { pipesgd::load_mnist_format(dir.file("a-file")); },
                          {"is not a directory"});
}

TEST(DataLoader, DefaultDirectoryHintNamesPackage) {
  for (const std::string& dir :
       {std::string(pipesgd::kDefaultDataDir), std::string(pipesgd::kDefaultDataDir) + "/"}) {
    const std::string hint = pipesgd::missing_data_hint(dir);
    EXPECT_EQ(hint.rfind("; ", 0), 0u) << hint;
    EXPECT_NE(hint.find("install the Debian package dataset-fashion-mnist"), std::string::npos)
        << hint;
    EXPECT_NE(hint.find("--data-dir"), std::string::npos) << hint;
  }
  const std::string other = pipesgd::missing_data_hint("/tmp/elsewhere");
  EXPECT_EQ(other.find("dataset-fashion-mnist"), std::string::npos) << other;
  EXPECT_NE(other.find("train-images-idx3-ubyte"), std::string::npos) << other;
}

// The real data set; the package dataset-fashion-mnist is installed wherever these tests run.
TEST(DataFashionMnist, LoadsRealDataset) {
  const pipesgd::DataSplits splits = pipesgd::load_mnist_format(pipesgd::kDefaultDataDir);
  EXPECT_EQ(splits.train.size, 60000u);
  EXPECT_EQ(splits.test.size, 10000u);
  EXPECT_EQ(splits.train.name, "fashion-mnist/train");
  for (const pipesgd::Dataset* dataset : {&splits.train, &splits.test}) {
    EXPECT_EQ(dataset->features, 784u);
    EXPECT_EQ(dataset->classes, 10u);
    ASSERT_EQ(dataset->inputs.size(), dataset->size * 784);
    ASSERT_EQ(dataset->labels.size(), dataset->size);
    // Fashion-MNIST is balanced: 6000 train / 1000 test examples per class.
    std::array<std::size_t, 10> per_class{};
    for (std::int32_t label : dataset->labels) {
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 10);
      ++per_class[static_cast<std::size_t>(label)];
    }
    for (std::size_t count : per_class) EXPECT_EQ(count, dataset->size / 10);
    const auto [lowest, highest] =
        std::minmax_element(dataset->inputs.begin(), dataset->inputs.end());
    EXPECT_EQ(*lowest, 0.0f);
    EXPECT_EQ(*highest, 1.0f);
  }
  EXPECT_EQ(splits.train.labels[0], 9);  // the first training image is an ankle boot
}

// ----------------------------------------------------------------------------------------------
// Random

TEST(Random, SameSeedAndStreamGiveSameSequence) {
  pipesgd::Random first(42, 3);
  pipesgd::Random second(42, 3);
  for (int index = 0; index < 100; ++index) ASSERT_EQ(first.next_u64(), second.next_u64());
}

TEST(Random, SeedsAndStreamsGiveDifferentSequences) {
  const std::uint64_t base = pipesgd::Random(42, 0).next_u64();
  EXPECT_NE(base, pipesgd::Random(43, 0).next_u64());
  EXPECT_NE(base, pipesgd::Random(42, 1).next_u64());
  EXPECT_NE(pipesgd::Random(0, 1).next_u64(), pipesgd::Random(1, 0).next_u64());
}

// Pins the exact sequence so that a change to the generator (which would silently change every
// shuffled epoch and synthetic data set) is noticed.
TEST(Random, SequenceIsPinned) {
  pipesgd::Random random(12345);
  const std::array<std::uint64_t, 3> expected = {0xC8F337F1F71107CAULL, 0x44B8290CB2D73EE2ULL,
                                                 0x52833E635BC0218CULL};
  for (std::uint64_t value : expected) EXPECT_EQ(random.next_u64(), value);
}

TEST(Random, UniformIsInUnitIntervalWithMeanOneHalf) {
  pipesgd::Random random(1);
  double sum = 0;
  constexpr int kCount = 200000;
  for (int index = 0; index < kCount; ++index) {
    const double value = random.uniform();
    ASSERT_GE(value, 0.0);
    ASSERT_LT(value, 1.0);
    sum += value;
  }
  EXPECT_NEAR(sum / kCount, 0.5, 0.005);
}

TEST(Random, UniformBelowCoversRangeEvenly) {
  pipesgd::Random random(2);
  constexpr std::uint64_t kBound = 7;
  constexpr int kCount = 70000;
  std::array<int, kBound> counts{};
  for (int index = 0; index < kCount; ++index) {
    const std::uint64_t value = random.uniform_below(kBound);
    ASSERT_LT(value, kBound);
    ++counts[value];
  }
  for (int count : counts) EXPECT_NEAR(count, kCount / 7, 400);
  EXPECT_EQ(random.uniform_below(1), 0u);
  const std::uint64_t huge_bound = (std::uint64_t{1} << 63) + 1;  // nearly half of draws rejected
  for (int index = 0; index < 100; ++index) ASSERT_LT(random.uniform_below(huge_bound), huge_bound);
}

TEST(Random, NormalHasZeroMeanAndUnitVariance) {
  pipesgd::Random random(3);
  double sum = 0;
  double sum_of_squares = 0;
  constexpr int kCount = 200000;
  for (int index = 0; index < kCount; ++index) {
    const double value = random.normal();
    ASSERT_TRUE(std::isfinite(value));
    sum += value;
    sum_of_squares += value * value;
  }
  const double mean = sum / kCount;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sum_of_squares / kCount - mean * mean, 1.0, 0.02);
}

// ----------------------------------------------------------------------------------------------
// Synthetic data

TEST(Synthetic, SizesAndRanges) {
  const pipesgd::DataSplits splits = pipesgd::make_synthetic(300, 120, 7);
  EXPECT_EQ(splits.train.size, 300u);
  EXPECT_EQ(splits.test.size, 120u);
  for (const pipesgd::Dataset* dataset : {&splits.train, &splits.test}) {
    EXPECT_EQ(dataset->features, 784u);
    EXPECT_EQ(dataset->classes, 10u);
    ASSERT_EQ(dataset->inputs.size(), dataset->size * 784);
    ASSERT_EQ(dataset->labels.size(), dataset->size);
    for (float value : dataset->inputs) {
      ASSERT_GE(value, 0.0f);
      ASSERT_LE(value, 1.0f);
    }
    std::set<std::int32_t> seen(dataset->labels.begin(), dataset->labels.end());
    EXPECT_EQ(seen.size(), 10u);
    EXPECT_EQ(*seen.begin(), 0);
    EXPECT_EQ(*seen.rbegin(), 9);
  }
  EXPECT_EQ(splits.train.name, "synthetic/train");
  EXPECT_EQ(splits.test.name, "synthetic/test");
}

TEST(Synthetic, DeterministicPerSeed) {
  const pipesgd::DataSplits first = pipesgd::make_synthetic(200, 50, 11);
  const pipesgd::DataSplits second = pipesgd::make_synthetic(200, 50, 11);
  EXPECT_EQ(first.train.inputs, second.train.inputs);
  EXPECT_EQ(first.train.labels, second.train.labels);
  EXPECT_EQ(first.test.inputs, second.test.inputs);
  EXPECT_EQ(first.test.labels, second.test.labels);
  const pipesgd::DataSplits other = pipesgd::make_synthetic(200, 50, 12);
  EXPECT_NE(first.train.inputs, other.train.inputs);
  EXPECT_NE(first.train.labels, other.train.labels);
}

TEST(Synthetic, SmallerSplitIsPrefixOfLarger) {
  const pipesgd::DataSplits small = pipesgd::make_synthetic(20, 5, 4);
  const pipesgd::DataSplits large = pipesgd::make_synthetic(60, 30, 4);
  EXPECT_TRUE(
      std::equal(small.train.inputs.begin(), small.train.inputs.end(), large.train.inputs.begin()));
  EXPECT_TRUE(
      std::equal(small.train.labels.begin(), small.train.labels.end(), large.train.labels.begin()));
  EXPECT_TRUE(
      std::equal(small.test.inputs.begin(), small.test.inputs.end(), large.test.inputs.begin()));
}

// Learnable: the nearest class mean of the training set classifies the test set well.
TEST(Synthetic, NearestClassMeanClassifiesTestSet) {
  const pipesgd::DataSplits splits = pipesgd::make_synthetic(1000, 500, 21);
  const std::size_t features = splits.train.features;
  std::vector<double> means(10 * features, 0.0);
  std::array<std::size_t, 10> counts{};
  for (std::size_t example = 0; example < splits.train.size; ++example) {
    const auto label = static_cast<std::size_t>(splits.train.labels[example]);
    ++counts[label];
    for (std::size_t feature = 0; feature < features; ++feature) {
      means[label * features + feature] += splits.train.inputs[example * features + feature];
    }
  }
  for (std::size_t label = 0; label < 10; ++label) {
    ASSERT_GT(counts[label], 0u);
    for (std::size_t feature = 0; feature < features; ++feature)
      means[label * features + feature] /= counts[label];
  }
  std::size_t correct = 0;
  for (std::size_t example = 0; example < splits.test.size; ++example) {
    std::size_t best_label = 0;
    double best_distance = INFINITY;
    for (std::size_t label = 0; label < 10; ++label) {
      double distance = 0;
      for (std::size_t feature = 0; feature < features; ++feature) {
        const double difference =
            splits.test.inputs[example * features + feature] - means[label * features + feature];
        distance += difference * difference;
      }
      if (distance < best_distance) {
        best_distance = distance;
        best_label = label;
      }
    }
    correct += static_cast<std::int32_t>(best_label) == splits.test.labels[example];
  }
  EXPECT_GT(static_cast<double>(correct) / splits.test.size, 0.9);
}

TEST(Synthetic, ZeroSizesAreUsageErrors) {
  expect_error<UsageError>([] { pipesgd::make_synthetic(0, 10, 1); }, {"train 0"});
  expect_error<UsageError>([] { pipesgd::make_synthetic(10, 0, 1); }, {"test 0"});
}

// ----------------------------------------------------------------------------------------------
// Sampler

std::vector<std::uint32_t> to_vector(std::span<const std::uint32_t> indices) {
  return std::vector<std::uint32_t>(indices.begin(), indices.end());
}

TEST(ShardedSampler, IterationsDropTheRemainder) {
  pipesgd::ShardedSampler sampler(103, 4, 2, 5, 1);
  EXPECT_EQ(sampler.iterations_per_epoch(), 5u);  // 103 / 20
  EXPECT_EQ(sampler.global_batch(), 20u);
  EXPECT_EQ(pipesgd::ShardedSampler(20, 4, 0, 5, 1).iterations_per_epoch(), 1u);
}

TEST(ShardedSampler, PermutationIsAPermutationAndShuffled) {
  pipesgd::ShardedSampler sampler(1000, 1, 0, 10, 5);
  for (std::size_t epoch : {0u, 1u, 7u}) {
    sampler.start_epoch(epoch);
    std::vector<std::uint32_t> sorted = to_vector(sampler.permutation());
    ASSERT_EQ(sorted.size(), 1000u);
    std::size_t fixed_points = 0;
    for (std::size_t index = 0; index < sorted.size(); ++index)
      fixed_points += sorted[index] == index;
    EXPECT_LT(fixed_points, 10u);  // a random permutation has about one
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::uint32_t> identity(1000);
    std::iota(identity.begin(), identity.end(), 0u);
    EXPECT_EQ(sorted, identity);
  }
}

TEST(ShardedSampler, ShardsAreDisjointAndTileTheGlobalSlice) {
  constexpr std::size_t kSize = 103, kWorkers = 4, kBatch = 5, kSeed = 99;
  std::vector<pipesgd::ShardedSampler> samplers;
  for (std::size_t rank = 0; rank < kWorkers; ++rank)
    samplers.emplace_back(kSize, kWorkers, rank, kBatch, kSeed);
  for (std::size_t epoch = 0; epoch < 3; ++epoch) {
    for (pipesgd::ShardedSampler& sampler : samplers) sampler.start_epoch(epoch);
    // Every rank computed the same permutation by itself.
    for (const pipesgd::ShardedSampler& sampler : samplers) {
      ASSERT_EQ(to_vector(sampler.permutation()), to_vector(samplers[0].permutation()));
    }
    const std::vector<std::uint32_t> permutation = to_vector(samplers[0].permutation());
    std::set<std::uint32_t> seen_this_epoch;
    for (std::size_t iteration = 0; iteration < samplers[0].iterations_per_epoch(); ++iteration) {
      std::vector<std::uint32_t> concatenated;
      for (const pipesgd::ShardedSampler& sampler : samplers) {
        const std::span<const std::uint32_t> batch = sampler.batch_indices(iteration);
        ASSERT_EQ(batch.size(), kBatch);
        concatenated.insert(concatenated.end(), batch.begin(), batch.end());
        for (std::uint32_t index : batch) {
          EXPECT_TRUE(seen_this_epoch.insert(index).second) << "index " << index << " used twice";
        }
      }
      const std::vector<std::uint32_t> slice(
          permutation.begin() + static_cast<std::ptrdiff_t>(iteration * 20),
          permutation.begin() + static_cast<std::ptrdiff_t>((iteration + 1) * 20));
      EXPECT_EQ(concatenated, slice);
    }
    EXPECT_EQ(seen_this_epoch.size(), 100u);  // 3 examples dropped
  }
}

TEST(ShardedSampler, SingleProcessOracleSeesTheSameSamples) {
  constexpr std::size_t kSize = 250, kWorkers = 3, kBatch = 8, kSeed = 2024;
  pipesgd::ShardedSampler oracle(kSize, 1, 0, kWorkers * kBatch, kSeed);
  std::vector<pipesgd::ShardedSampler> samplers;
  for (std::size_t rank = 0; rank < kWorkers; ++rank)
    samplers.emplace_back(kSize, kWorkers, rank, kBatch, kSeed);
  ASSERT_EQ(oracle.iterations_per_epoch(), samplers[0].iterations_per_epoch());
  for (std::size_t epoch = 0; epoch < 2; ++epoch) {
    oracle.start_epoch(epoch);
    for (pipesgd::ShardedSampler& sampler : samplers) sampler.start_epoch(epoch);
    for (std::size_t iteration = 0; iteration < oracle.iterations_per_epoch(); ++iteration) {
      std::vector<std::uint32_t> union_of_workers;
      for (const pipesgd::ShardedSampler& sampler : samplers) {
        const auto batch = sampler.batch_indices(iteration);
        union_of_workers.insert(union_of_workers.end(), batch.begin(), batch.end());
      }
      EXPECT_EQ(union_of_workers, to_vector(oracle.batch_indices(iteration)));
    }
  }
}

TEST(ShardedSampler, EpochsDifferAndSeedsMatter) {
  pipesgd::ShardedSampler first(500, 2, 0, 10, 17);
  pipesgd::ShardedSampler same_seed(500, 2, 1, 10, 17);
  pipesgd::ShardedSampler other_seed(500, 2, 0, 10, 18);
  const std::vector<std::uint32_t> epoch0 = to_vector(first.permutation());
  EXPECT_EQ(epoch0, to_vector(same_seed.permutation()));
  EXPECT_NE(epoch0, to_vector(other_seed.permutation()));
  first.start_epoch(1);
  const std::vector<std::uint32_t> epoch1 = to_vector(first.permutation());
  EXPECT_NE(epoch0, epoch1);
  // The permutation depends only on (seed, epoch), not on the order epochs were started.
  same_seed.start_epoch(5);
  same_seed.start_epoch(1);
  EXPECT_EQ(to_vector(same_seed.permutation()), epoch1);
  first.start_epoch(0);
  EXPECT_EQ(to_vector(first.permutation()), epoch0);
}

TEST(ShardedSampler, BatchViewDoesNotMoveAcrossEpochs) {
  pipesgd::ShardedSampler sampler(64, 2, 1, 4, 3);
  const std::uint32_t* before = sampler.permutation().data();
  sampler.start_epoch(9);
  EXPECT_EQ(sampler.permutation().data(), before);
}

TEST(ShardedSampler, BadArgumentsAreUsageErrors) {
  expect_error<UsageError>([] { pipesgd::ShardedSampler(100, 0, 0, 1, 1); },
                           {"workers", "at least 1"});
  expect_error<UsageError>([] { pipesgd::ShardedSampler(100, 4, 4, 1, 1); },
                           {"rank 4", "4 workers"});
  expect_error<UsageError>([] { pipesgd::ShardedSampler(100, 4, 0, 0, 1); }, {"batch size"});
  expect_error<UsageError>([] { pipesgd::ShardedSampler(19, 4, 0, 5, 1); },
                           {"19 examples", "4 workers x 5"});
  const std::size_t huge = std::size_t{1} << 40;
  expect_error<UsageError>([&] { pipesgd::ShardedSampler(100, huge, 0, huge, 1); },
                           {"100 examples"});
  expect_error<UsageError>([] { pipesgd::ShardedSampler((std::size_t{1} << 32) + 1, 1, 0, 1, 1); },
                           {"larger"});
  pipesgd::ShardedSampler sampler(103, 4, 0, 5, 1);
  expect_error<UsageError>([&] { sampler.batch_indices(5); }, {"iteration 5", "5 iterations"});
}

// ----------------------------------------------------------------------------------------------
// Batch assembly and dataset views

pipesgd::Dataset small_dataset(std::size_t size, std::size_t features) {
  pipesgd::Dataset dataset;
  dataset.size = size;
  dataset.features = features;
  dataset.classes = 10;
  dataset.name = "small";
  dataset.inputs.resize(size * features);
  for (std::size_t index = 0; index < dataset.inputs.size(); ++index)
    dataset.inputs[index] = static_cast<float>(index);
  for (std::size_t example = 0; example < size; ++example)
    dataset.labels.push_back(static_cast<std::int32_t>(example % 10));
  return dataset;
}

TEST(DataBatchAssembler, GathersRowsAndLabelsInOrder) {
  const pipesgd::Dataset dataset = small_dataset(12, 3);
  pipesgd::BatchAssembler assembler(dataset, 4);
  const std::vector<std::uint32_t> indices = {11, 0, 5};
  const pipesgd::Batch batch = assembler.assemble(indices);
  EXPECT_EQ(batch.size, 3u);
  EXPECT_EQ(batch.features, 3u);
  EXPECT_EQ(std::vector<float>(batch.inputs.begin(), batch.inputs.end()),
            (std::vector<float>{33, 34, 35, 0, 1, 2, 15, 16, 17}));
  EXPECT_EQ(std::vector<std::int32_t>(batch.labels.begin(), batch.labels.end()),
            (std::vector<std::int32_t>{1, 0, 5}));
  // Reuses its buffers: the next batch lives at the same address.
  const std::vector<std::uint32_t> next = {1, 2, 3, 4};
  const pipesgd::Batch second = assembler.assemble(next);
  EXPECT_EQ(second.inputs.data(), batch.inputs.data());
  EXPECT_EQ(second.size, 4u);
  EXPECT_EQ(second.inputs[0], 3.0f);
  const pipesgd::Batch empty = assembler.assemble({});
  EXPECT_EQ(empty.size, 0u);
  EXPECT_TRUE(empty.inputs.empty());
}

TEST(DataBatchAssembler, WorksWithSamplerBatches) {
  const pipesgd::Dataset dataset = small_dataset(40, 2);
  pipesgd::ShardedSampler sampler(40, 2, 1, 6, 8);
  pipesgd::BatchAssembler assembler(dataset, 6);
  const auto indices = sampler.batch_indices(2);
  const pipesgd::Batch batch = assembler.assemble(indices);
  for (std::size_t row = 0; row < batch.size; ++row) {
    EXPECT_EQ(batch.inputs[row * 2], static_cast<float>(indices[row] * 2));
    EXPECT_EQ(batch.labels[row], static_cast<std::int32_t>(indices[row] % 10));
  }
}

TEST(DataBatchAssembler, BadArgumentsAreUsageErrors) {
  const pipesgd::Dataset dataset = small_dataset(5, 2);
  expect_error<UsageError>([&] { pipesgd::BatchAssembler(dataset, 0); }, {"capacity"});
  pipesgd::BatchAssembler assembler(dataset, 2);
  const std::vector<std::uint32_t> too_many = {0, 1, 2};
  expect_error<UsageError>([&] { assembler.assemble(too_many); }, {"3 indices", "capacity of 2"});
  const std::vector<std::uint32_t> out_of_range = {1, 5};
  expect_error<UsageError>([&] { assembler.assemble(out_of_range); }, {"index 5", "5 examples"});
}

TEST(DataRange, IsAZeroCopyView) {
  const pipesgd::Dataset dataset = small_dataset(10, 3);
  const pipesgd::Batch batch = pipesgd::dataset_range(dataset, 2, 5);
  EXPECT_EQ(batch.size, 3u);
  EXPECT_EQ(batch.features, 3u);
  EXPECT_EQ(batch.inputs.data(), dataset.inputs.data() + 6);
  EXPECT_EQ(batch.inputs.size(), 9u);
  EXPECT_EQ(batch.labels.data(), dataset.labels.data() + 2);
  EXPECT_EQ(batch.labels.size(), 3u);
  EXPECT_EQ(pipesgd::dataset_range(dataset, 10, 10).size, 0u);
  EXPECT_EQ(pipesgd::dataset_range(dataset, 0, 10).inputs.size(), 30u);
  expect_error<UsageError>([&] { pipesgd::dataset_range(dataset, 4, 3); }, {"[4, 3)"});
  expect_error<UsageError>([&] { pipesgd::dataset_range(dataset, 0, 11); },
                           {"[0, 11)", "10 examples"});
}

TEST(DataRange, ChunksCoverTheRangeInOrder) {
  const pipesgd::Dataset dataset = small_dataset(10, 2);
  std::vector<std::size_t> sizes;
  std::vector<std::int32_t> labels;
  pipesgd::for_each_chunk(dataset, 1, 10, 4, [&](const pipesgd::Batch& batch) {
    sizes.push_back(batch.size);
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  });
  EXPECT_EQ(sizes, (std::vector<std::size_t>{4, 4, 1}));
  EXPECT_EQ(labels, (std::vector<std::int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  std::size_t calls = 0;
  pipesgd::for_each_chunk(dataset, 3, 3, 4, [&](const pipesgd::Batch&) { ++calls; });
  EXPECT_EQ(calls, 0u);
  expect_error<UsageError>(
      [&] { pipesgd::for_each_chunk(dataset, 0, 10, 0, [](const pipesgd::Batch&) {}); },
      {"chunk size"});
  expect_error<UsageError>(
      [&] { pipesgd::for_each_chunk(dataset, 0, 11, 3, [](const pipesgd::Batch&) {}); },
      {"[0, 11)"});
}

}  // namespace
