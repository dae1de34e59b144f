// --data npy:DIR: NumPy .npy files read into a Dataset (data/npy_reader.h, load_npy_dir), sharded and
// batched like the IDX data; every bad input is one DataError naming the file.
// The oracle for the file format: headers written here byte for byte as numpy.lib.format writes
// version 1.0 (and 2.0) files, independent of the xtensor code the reader uses.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/data/npy_reader.h"
#include "pipesgd/data/sampler.h"
#include "temp_dir.h"

namespace pipesgd {
namespace {

// A .npy file as numpy.save writes it: magic, version, header length (little-endian), the header
// dictionary padded with spaces to a multiple of 64 bytes and ended by '\n', then the data.
std::string npy_file_bytes(const std::string& descr, const std::vector<std::size_t>& shape, const std::string& data,
                           bool fortran = false, int major = 1) {
  std::string shape_text = "(";
  for (std::size_t k = 0; k < shape.size(); ++k) shape_text += std::to_string(shape[k]) + (shape.size() == 1 ? "," : k + 1 < shape.size() ? ", " : "");
  shape_text += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
                       ", 'shape': " + shape_text + ", }";
  const std::size_t preamble = major == 1 ? 10 : 12;
  while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  const std::size_t length = header.size();
  bytes += static_cast<char>(length & 0xFF);
  bytes += static_cast<char>((length >> 8) & 0xFF);
  if (major != 1) bytes += std::string(2, '\0');
  return bytes + header + data;
}

template <typename T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Example e, element j of the float32 inputs: exactly representable, distinct everywhere.
float float_input(std::size_t e, std::size_t j) { return static_cast<float>(e * 100 + j) + 0.5f; }
std::uint8_t byte_input(std::size_t e, std::size_t j) { return static_cast<std::uint8_t>((e * 7 + j * 3) % 256); }

constexpr std::size_t kTrain = 12, kTest = 5, kRows = 3, kColumns = 4, kFeatures = kRows * kColumns;

std::string float_inputs(std::size_t count) {
  std::vector<float> values;
  for (std::size_t e = 0; e < count; ++e)
    for (std::size_t j = 0; j < kFeatures; ++j) values.push_back(float_input(e, j));
  return npy_file_bytes("<f4", {count, kRows, kColumns}, raw(values));
}

std::string byte_inputs(std::size_t count) {
  std::vector<std::uint8_t> values;
  for (std::size_t e = 0; e < count; ++e)
    for (std::size_t j = 0; j < kFeatures; ++j) values.push_back(byte_input(e, j));
  return npy_file_bytes("|u1", {count, kRows, kColumns}, raw(values));
}

// Labels e % 5 for train; test ends with a 6, so classes = 7 comes from the test split.
std::vector<std::int64_t> label_values(std::size_t count, bool test) {
  std::vector<std::int64_t> labels;
  for (std::size_t e = 0; e < count; ++e) labels.push_back(static_cast<std::int64_t>(e % 5));
  if (test) labels.back() = 6;
  return labels;
}

std::string int64_labels(std::size_t count, bool test) {
  return npy_file_bytes("<i8", {count}, raw(label_values(count, test)));
}

std::string int32_labels(std::size_t count, bool test) {
  std::vector<std::int32_t> labels;
  for (std::int64_t label : label_values(count, test)) labels.push_back(static_cast<std::int32_t>(label));
  return npy_file_bytes("<i4", {count}, raw(labels));
}

float target_value(std::size_t e, std::size_t k) { return k == 0 ? -1.5f * static_cast<float>(e) : 0.25f * static_cast<float>(e) + 3.0f; }

std::string float_targets(std::size_t count, std::size_t width, bool flat) {
  std::vector<float> values;
  for (std::size_t e = 0; e < count; ++e)
    for (std::size_t k = 0; k < width; ++k) values.push_back(target_value(e, k));
  return flat ? npy_file_bytes("<f4", {count}, raw(values)) : npy_file_bytes("<f4", {count, width}, raw(values));
}

std::string double_targets(std::size_t count) {
  std::vector<double> values;
  for (std::size_t e = 0; e < count; ++e) values.push_back(static_cast<double>(target_value(e, 0)));
  return npy_file_bytes("<f8", {count}, raw(values));
}

struct Files {
  std::string train_x, train_y, test_x, test_y;
};

void write_dir(const TempDir& dir, const Files& files) {
  write_file(dir.file("train_x.npy"), files.train_x);
  write_file(dir.file("train_y.npy"), files.train_y);
  write_file(dir.file("test_x.npy"), files.test_x);
  write_file(dir.file("test_y.npy"), files.test_y);
}

Files labelled_files() {
  return {float_inputs(kTrain), int64_labels(kTrain, false), float_inputs(kTest), int64_labels(kTest, true)};
}

// ---- Good data: values, shapes, classes, for each accepted dtype. ------------------------------

enum class Inputs { kFloat32, kUint8 };
enum class Targets { kInt64, kInt32, kFloat32Flat, kFloat32Width2, kFloat64Flat };

struct GoodCase {
  Inputs inputs;
  Targets targets;
};

std::ostream& operator<<(std::ostream& out, const GoodCase& c) {
  static const char* const kInputs[] = {"float32", "uint8"};
  static const char* const kTargets[] = {"int64 labels", "int32 labels", "float32 targets [N]",
                                         "float32 targets [N,2]", "float64 targets [N]"};
  return out << kInputs[static_cast<int>(c.inputs)] << " inputs, " << kTargets[static_cast<int>(c.targets)];
}

class NpyGoodData : public ::testing::TestWithParam<GoodCase> {};

TEST_P(NpyGoodData, LoadsValuesShapesAndClasses) {
  const GoodCase c = GetParam();
  const auto x = [&](std::size_t n) { return c.inputs == Inputs::kFloat32 ? float_inputs(n) : byte_inputs(n); };
  const auto y = [&](std::size_t n, bool test) {
    switch (c.targets) {
      case Targets::kInt64: return int64_labels(n, test);
      case Targets::kInt32: return int32_labels(n, test);
      case Targets::kFloat32Flat: return float_targets(n, 1, true);
      case Targets::kFloat32Width2: return float_targets(n, 2, false);
      case Targets::kFloat64Flat: return double_targets(n);
    }
    return std::string();
  };
  TempDir dir;
  write_dir(dir, {x(kTrain), y(kTrain, false), x(kTest), y(kTest, true)});
  const DataSplits splits = load_npy_dir(dir.path());
  const bool regression = c.targets != Targets::kInt64 && c.targets != Targets::kInt32;
  const std::size_t width = c.targets == Targets::kFloat32Width2 ? 2 : regression ? 1 : 0;
  for (const Dataset* split : {&splits.train, &splits.test}) {
    const bool test = split == &splits.test;
    const std::size_t count = test ? kTest : kTrain;
    SCOPED_TRACE(split->name);
    EXPECT_EQ(split->size, count);
    EXPECT_EQ(split->features, kFeatures);
    EXPECT_EQ(split->example_shape, (std::vector<std::int64_t>{3, 4}));
    ASSERT_EQ(split->inputs.size(), count * kFeatures);
    for (std::size_t e = 0; e < count; ++e) {
      for (std::size_t j = 0; j < kFeatures; ++j) {
        const float expected = c.inputs == Inputs::kFloat32 ? float_input(e, j)
                                                            : static_cast<float>(byte_input(e, j)) / 255.0f;
        ASSERT_EQ(split->inputs[e * kFeatures + j], expected) << "example " << e << " element " << j;
      }
    }
    EXPECT_EQ(split->regression(), regression);
    EXPECT_EQ(split->target_features, width);
    if (regression) {
      EXPECT_TRUE(split->labels.empty());
      EXPECT_EQ(split->classes, 0u);
      ASSERT_EQ(split->targets.size(), count * width);
      for (std::size_t e = 0; e < count; ++e)
        for (std::size_t k = 0; k < width; ++k) EXPECT_EQ(split->targets[e * width + k], target_value(e, k));
    } else {
      EXPECT_TRUE(split->targets.empty());
      EXPECT_EQ(split->classes, 7u);  // the test split's largest label, 6, plus one
      std::vector<std::int32_t> expected;
      for (std::int64_t label : label_values(count, test)) expected.push_back(static_cast<std::int32_t>(label));
      EXPECT_EQ(split->labels, expected);
    }
  }
  EXPECT_NE(splits.train.name.find("/train"), std::string::npos);
  EXPECT_NE(splits.test.name.find("/test"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, NpyGoodData,
    ::testing::Values(GoodCase{Inputs::kFloat32, Targets::kInt64}, GoodCase{Inputs::kUint8, Targets::kInt64},
                      GoodCase{Inputs::kFloat32, Targets::kInt32}, GoodCase{Inputs::kUint8, Targets::kInt32},
                      GoodCase{Inputs::kFloat32, Targets::kFloat32Flat}, GoodCase{Inputs::kFloat32, Targets::kFloat32Width2},
                      GoodCase{Inputs::kUint8, Targets::kFloat32Width2}, GoodCase{Inputs::kFloat32, Targets::kFloat64Flat}));

TEST(NpyReader, ReadsVersion2AndAnyExampleRank) {
  std::vector<float> values(2 * 2 * 3 * 5);
  for (std::size_t k = 0; k < values.size(); ++k) values[k] = static_cast<float>(k) * 0.5f;
  const std::string bytes = npy_file_bytes("<f4", {2, 2, 3, 5}, raw(values), false, 2);
  const NpyArray array = parse_npy(std::span(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()), "mem");
  EXPECT_EQ(array.dtype, "<f4");
  EXPECT_EQ(array.shape, (std::vector<std::size_t>{2, 2, 3, 5}));
  const NpyInputs inputs = decode_npy_inputs(array, "mem");
  EXPECT_EQ(inputs.count, 2u);
  EXPECT_EQ(inputs.example_shape, (std::vector<std::int64_t>{2, 3, 5}));
  EXPECT_EQ(inputs.features, 30u);
  EXPECT_EQ(inputs.values, values);
}

// ---- Sharding and shuffling give the rows (and labels or targets) of the right examples. -------

struct ShardCase {
  std::size_t workers;
  bool regression;
};

std::ostream& operator<<(std::ostream& out, const ShardCase& c) {
  return out << c.workers << " workers, " << (c.regression ? "regression targets [N,2]" : "int64 labels");
}

class NpyShards : public ::testing::TestWithParam<ShardCase> {};

TEST_P(NpyShards, BatchesHoldTheSampledExamples) {
  const ShardCase c = GetParam();
  TempDir dir;
  Files files = labelled_files();
  if (c.regression) {
    files.train_y = float_targets(kTrain, 2, false);
    files.test_y = float_targets(kTest, 2, false);
  }
  write_dir(dir, files);
  const DataSplits splits = load_npy_dir(dir.path());
  const Dataset& train = splits.train;
  constexpr std::size_t kBatch = 2;
  std::vector<std::size_t> seen(kTrain, 0);
  for (std::size_t rank = 0; rank < c.workers; ++rank) {
    ShardedSampler sampler(train.size, c.workers, rank, kBatch, 42);
    BatchAssembler assembler(train, kBatch);
    sampler.start_epoch(1);
    for (std::size_t iteration = 0; iteration < sampler.iterations_per_epoch(); ++iteration) {
      const auto indices = sampler.batch_indices(iteration);
      const Batch batch = assembler.assemble(indices);
      ASSERT_EQ(batch.size, indices.size());
      EXPECT_EQ(batch.features, kFeatures);
      EXPECT_EQ(std::vector<std::int64_t>(batch.example_shape.begin(), batch.example_shape.end()),
                (std::vector<std::int64_t>{3, 4}));
      for (std::size_t row = 0; row < indices.size(); ++row) {
        const std::size_t example = indices[row];
        ++seen[example];
        for (std::size_t j = 0; j < kFeatures; ++j) ASSERT_EQ(batch.inputs[row * kFeatures + j], float_input(example, j));
        if (c.regression) {
          ASSERT_EQ(batch.target_features, 2u);
          EXPECT_TRUE(batch.labels.empty());
          EXPECT_EQ(batch.targets[row * 2], target_value(example, 0));
          EXPECT_EQ(batch.targets[row * 2 + 1], target_value(example, 1));
        } else {
          EXPECT_EQ(batch.target_features, 0u);
          EXPECT_EQ(batch.labels[row], static_cast<std::int32_t>(example % 5));
        }
      }
    }
  }
  // Every example of the epoch's whole global batches is seen once, the rest not at all.
  const std::size_t used = (kTrain / (c.workers * kBatch)) * c.workers * kBatch;
  std::size_t once = 0;
  for (std::size_t count : seen) {
    EXPECT_LE(count, 1u);
    once += count;
  }
  EXPECT_EQ(once, used);
  // Evaluation views (dataset_range) carry the targets of their examples too.
  const Batch range = dataset_range(splits.test, 1, 4);
  EXPECT_EQ(range.size, 3u);
  EXPECT_EQ(range.inputs[0], float_input(1, 0));
  if (c.regression) {
    EXPECT_EQ(range.targets.size(), 6u);
    EXPECT_EQ(range.targets[0], target_value(1, 0));
    EXPECT_EQ(range.targets[5], target_value(3, 1));
  } else {
    EXPECT_EQ(range.labels[2], 3);
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, NpyShards,
                         ::testing::Values(ShardCase{1, false}, ShardCase{3, false}, ShardCase{1, true},
                                           ShardCase{3, true}));

// ---- Every bad input: one DataError line naming the file and the problem. ----------------------

struct BadCase {
  std::string name;
  std::function<void(const TempDir&)> spoil;  // applied to a good labelled directory
  std::string file;                           // the file the message must name ("" if none)
  std::vector<std::string> fragments;
};

std::ostream& operator<<(std::ostream& out, const BadCase& c) { return out << c.name; }

std::string good(const std::string& name) {
  const Files files = labelled_files();
  if (name == "train_x.npy") return files.train_x;
  if (name == "train_y.npy") return files.train_y;
  if (name == "test_x.npy") return files.test_x;
  return files.test_y;
}

// Replaces `name` in the directory.
std::function<void(const TempDir&)> put(const std::string& name, std::string bytes) {
  return [name, bytes](const TempDir& dir) { write_file(dir.file(name), bytes); };
}

std::string header_only(const std::string& dictionary, int major = 1) {
  std::string header = dictionary;
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  bytes += static_cast<char>(header.size() & 0xFF);
  bytes += static_cast<char>(header.size() >> 8);
  return bytes + header;
}

std::vector<BadCase> bad_cases() {
  const std::string x = good("train_x.npy");
  std::vector<std::int64_t> negative = label_values(kTrain, false);
  negative[2] = -3;
  std::vector<std::int64_t> too_large = label_values(kTrain, false);
  too_large[4] = std::int64_t{1} << 31;
  std::vector<float> ones(kTrain * kFeatures, 1.0f);
  return {
      {"MissingFile", [](const TempDir& dir) { std::filesystem::remove(dir.file("test_y.npy")); }, "",
       {"missing test_y.npy", "--data npy:DIR must name a directory holding train_x.npy"}},
      {"TruncatedData", put("train_x.npy", x.substr(0, x.size() - 5)), "train_x.npy",
       {"truncated: shape [12, 3, 4] of float32 (<f4) needs 576 data bytes, the file has 571"}},
      {"TruncatedHeader", put("train_x.npy", x.substr(0, 40)), "train_x.npy", {"truncated: the header needs"}},
      {"TruncatedPreamble", put("train_x.npy", x.substr(0, 7)), "train_x.npy", {"truncated: 7 bytes"}},
      {"EmptyFile", put("train_x.npy", ""), "train_x.npy", {"truncated: 0 bytes"}},
      {"TrailingBytes", put("train_x.npy", x + "abcd"), "train_x.npy", {"4 bytes after the data"}},
      {"Float16Inputs", put("train_x.npy", npy_file_bytes("<f2", {kTrain, 3, 4}, std::string(kTrain * 12 * 2, '\0'))),
       "train_x.npy", {"inputs of dtype float16 (<f2) are not accepted; expected float32 (<f4) or uint8"}},
      {"Int16Inputs", put("train_x.npy", npy_file_bytes("<i2", {kTrain, 3, 4}, std::string(kTrain * 12 * 2, '\0'))),
       "train_x.npy", {"inputs of dtype int16 (<i2)"}},
      {"BigEndianInputs", put("train_x.npy", npy_file_bytes(">f4", {kTrain, 3, 4}, std::string(kTrain * 12 * 4, '\0'))),
       "train_x.npy", {"float32 big-endian (>f4)"}},
      {"Uint8Labels", put("train_y.npy", npy_file_bytes("|u1", {kTrain}, std::string(kTrain, '\1'))), "train_y.npy",
       {"labels/targets of dtype uint8 (|u1) are not accepted; expected int64 (<i8) or int32 (<i4) labels"}},
      {"BrokenHeader", put("train_x.npy", header_only("{'descr': '<f4', 'shape': (12, 3, 4), }")), "train_x.npy",
       {"broken .npy header", "fortran_order"}},
      {"EmptyShapeValue", put("train_x.npy", header_only("{'descr': '<f4', 'fortran_order': False, 'shape': }")),
       "train_x.npy", {"broken .npy header"}},
      {"NotNpy", put("train_x.npy", "P5\n28 28\n255\n" + std::string(100, 'x')), "train_x.npy",
       {"not a .npy file"}},
      {"Version3", put("train_x.npy", [&] { std::string b = x; b[6] = 3; return b; }()), "train_x.npy",
       {"version 3.0 is not supported"}},
      {"HeaderOverNumpyLimit", put("train_x.npy", [&] { std::string b = x; b[6] = 2; b[8] = 0; b[9] = 0; b[10] = 1; b[11] = 0; return b; }()),
       "train_x.npy", {"more than NumPy's limit"}},
      {"FortranOrder", put("train_x.npy", npy_file_bytes("<f4", {kTrain, 3, 4}, raw(ones), true)), "train_x.npy",
       {"Fortran order"}},
      {"CountMismatch", put("train_y.npy", int64_labels(kTrain - 1, false)), "",
       {"x/y count mismatch", "train_x.npy has 12 examples but", "train_y.npy has 11 labels"}},
      {"ExampleShapeMismatch", put("test_x.npy", npy_file_bytes("<f4", {kTest, 4, 3}, std::string(kTest * 12 * 4, '\0'))),
       "", {"example shape mismatch", "train_x.npy has examples of shape [3, 4] but", "test_x.npy has [4, 3]"}},
      {"NegativeLabel", put("train_y.npy", npy_file_bytes("<i8", {kTrain}, raw(negative))), "train_y.npy",
       {"label at index 2 is -3"}},
      {"LabelBeyondInt32", put("train_y.npy", npy_file_bytes("<i8", {kTrain}, raw(too_large))), "train_y.npy",
       {"label at index 4 is 2147483648, expected 0 to 2147483647"}},
      {"LabelKindMismatch", put("test_y.npy", float_targets(kTest, 1, true)), "",
       {"label kind mismatch", "train_y.npy has integer labels but", "test_y.npy has float regression targets"}},
      {"TargetWidthMismatch",
       [](const TempDir& dir) {
         write_file(dir.file("train_y.npy"), float_targets(kTrain, 2, false));
         write_file(dir.file("test_y.npy"), float_targets(kTest, 1, true));
       },
       "", {"target width mismatch", "train_y.npy has 2 values per example but"}},
      {"ZeroExamples",
       [](const TempDir& dir) {
         write_file(dir.file("train_x.npy"), npy_file_bytes("<f4", {0, 3, 4}, ""));
         write_file(dir.file("train_y.npy"), npy_file_bytes("<i8", {0}, ""));
       },
       "train_y.npy", {"zero examples"}},
      {"ZeroExamplesInputs", put("train_x.npy", npy_file_bytes("<f4", {0, 3, 4}, "")), "train_x.npy", {"zero examples"}},
      {"TwoDimensionalLabels", put("train_y.npy", npy_file_bytes("<i8", {kTrain, 1}, std::string(kTrain * 8, '\0'))),
       "train_y.npy", {"labels of shape [12, 1]: expected [count]"}},
      {"OneDimensionalInputs", put("train_x.npy", npy_file_bytes("<f4", {kTrain}, std::string(kTrain * 4, '\0'))),
       "train_x.npy", {"at least 2 dimensions"}},
      {"ZeroSizeExample", put("train_x.npy", npy_file_bytes("<f4", {kTrain, 0}, "")), "train_x.npy",
       {"every example dimension must be >= 1"}},
      {"DirectoryInsteadOfFile",
       [](const TempDir& dir) {
         std::filesystem::remove(dir.file("test_x.npy"));
         std::filesystem::create_directory(dir.file("test_x.npy"));
       },
       "test_x.npy", {"is a directory"}},
  };
}

class NpyBadData : public ::testing::TestWithParam<BadCase> {};

TEST_P(NpyBadData, FailsWithOneLineNamingTheProblem) {
  const BadCase& c = GetParam();
  TempDir dir;
  write_dir(dir, labelled_files());
  c.spoil(dir);
  try {
    load_npy_dir(dir.path());
    FAIL() << "no DataError";
  } catch (const DataError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    if (!c.file.empty()) {
      EXPECT_NE(message.find("data file " + dir.file(c.file) + ": "), std::string::npos) << message;
    }
    for (const std::string& fragment : c.fragments) EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Errors, NpyBadData, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(NpyDirectory, MissingDirectoryNamesTheExpectedFiles) {
  TempDir dir;
  try {
    load_npy_dir(dir.file("absent"));
    FAIL() << "no DataError";
  } catch (const DataError& error) {
    EXPECT_EQ(std::string(error.what()),
              "data directory " + dir.file("absent") +
                  " does not exist; --data npy:DIR must name a directory holding train_x.npy, train_y.npy, "
                  "test_x.npy and test_y.npy");
  }
}

}  // namespace
}  // namespace pipesgd
