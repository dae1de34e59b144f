#include "pipesgd/data/dataset.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <limits>

#include "pipesgd/core/error.h"
#include "pipesgd/core/random.h"
#include "pipesgd/data/idx_reader.h"
#include "pipesgd/data/npy_reader.h"

namespace pipesgd {
namespace {

constexpr std::size_t kMnistClasses = 10;
constexpr const char* kTrainImagesFile = "train-images-idx3-ubyte";
constexpr const char* kTrainLabelsFile = "train-labels-idx1-ubyte";
constexpr const char* kTestImagesFile = "t10k-images-idx3-ubyte";
constexpr const char* kTestLabelsFile = "t10k-labels-idx1-ubyte";

// Random streams of make_synthetic, one per purpose, so the splits do not depend on each other.
constexpr std::uint64_t kPrototypeStream = 0;
constexpr std::uint64_t kTrainStream = 1;
constexpr std::uint64_t kTestStream = 2;
// Standard deviation of the per-pixel Gaussian noise added to a class prototype.
constexpr double kSyntheticNoise = 0.35;

std::string without_trailing_separators(const std::string& dir) {
  std::string normalized = std::filesystem::path(dir).lexically_normal().string();
  while (normalized.size() > 1 && normalized.back() == '/') normalized.pop_back();
  return normalized;
}

// The path of `base_name` in `dir`, plain or with ".gz"; the plain file wins if both exist.
std::string find_data_file(const std::string& dir, const std::string& base_name) {
  const std::filesystem::path directory(dir);
  for (const std::string& candidate : {base_name, base_name + ".gz"}) {
    std::error_code status_error;
    const std::filesystem::path path = directory / candidate;
    if (std::filesystem::exists(path, status_error)) return path.string();
  }
  throw DataError(concat("data directory ", dir, ": missing ", base_name, " (or ", base_name,
                         ".gz)", missing_data_hint(dir)));
}

Dataset load_split(const std::string& images_path, const std::string& labels_path,
                   const std::string& dataset_name) {
  Dataset dataset;
  dataset.name = dataset_name;
  dataset.classes = kMnistClasses;
  {
    const IdxArray labels = read_idx(labels_path);
    if (labels.dims.size() != 1) {
      throw DataError(concat("data file ", labels_path,
                             ": expected labels with 1 dimension, found ", labels.dims.size(),
                             " dimensions"));
    }
    dataset.labels.resize(labels.data.size());
    for (std::size_t index = 0; index < labels.data.size(); ++index) {
      const std::uint8_t label = labels.data[index];
      if (label >= kMnistClasses) {
        throw DataError(concat("data file ", labels_path, ": label at index ", index, " is ",
                               static_cast<unsigned>(label), ", expected 0 to ",
                               kMnistClasses - 1));
      }
      dataset.labels[index] = label;
    }
  }
  const IdxArray images = read_idx(images_path);
  if (images.dims.size() != 3) {
    throw DataError(concat("data file ", images_path,
                           ": expected images with 3 dimensions [count, rows, columns], found ",
                           images.dims.size(), " dimensions"));
  }
  dataset.size = images.dims[0];
  if (dataset.size != dataset.labels.size()) {
    throw DataError(concat("image/label count mismatch: ", images_path, " has ", dataset.size,
                           " images but ", labels_path, " has ", dataset.labels.size(), " labels"));
  }
  // The reader checked that the product of the dims fits in size_t.
  dataset.features = std::size_t{images.dims[1]} * images.dims[2];
  dataset.example_shape = {1, static_cast<std::int64_t>(images.dims[1]), static_cast<std::int64_t>(images.dims[2])};
  PIPESGD_ASSERT(images.data.size() == dataset.size * dataset.features);

  std::array<float, 256> pixel_to_float{};
  for (std::size_t pixel = 0; pixel < pixel_to_float.size(); ++pixel) {
    pixel_to_float[pixel] = static_cast<float>(pixel) / 255.0f;
  }
  dataset.inputs.resize(images.data.size());
  std::transform(images.data.begin(), images.data.end(), dataset.inputs.begin(),
                 [&](std::uint8_t pixel) { return pixel_to_float[pixel]; });
  return dataset;
}

std::string directory_label(const std::string& dir) {
  const std::string name =
      std::filesystem::path(without_trailing_separators(dir)).filename().string();
  return name.empty() ? std::string("data") : name;
}

Dataset generate_synthetic_split(std::size_t size, Random& random,
                                 const std::vector<float>& prototypes, std::string name) {
  Dataset dataset;
  dataset.size = size;
  dataset.features = kSyntheticFeatures;
  dataset.example_shape = {1, 28, 28};
  dataset.classes = kSyntheticClasses;
  dataset.name = std::move(name);
  dataset.inputs.resize(size * kSyntheticFeatures);
  dataset.labels.resize(size);
  for (std::size_t example = 0; example < size; ++example) {
    const auto label = static_cast<std::int32_t>(random.uniform_below(kSyntheticClasses));
    dataset.labels[example] = label;
    const float* prototype =
        prototypes.data() + static_cast<std::size_t>(label) * kSyntheticFeatures;
    float* row = dataset.inputs.data() + example * kSyntheticFeatures;
    for (std::size_t feature = 0; feature < kSyntheticFeatures; ++feature) {
      const double value = prototype[feature] + kSyntheticNoise * random.normal();
      row[feature] = static_cast<float>(std::clamp(value, 0.0, 1.0));
    }
  }
  return dataset;
}

std::string example_shape_text(const std::vector<std::int64_t>& shape) {
  std::vector<std::size_t> dims(shape.begin(), shape.end());
  return npy_shape_text(dims);
}

std::string npy_file(const std::string& dir, const char* name) {
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::error_code status_error;
  if (!std::filesystem::exists(path, status_error)) {
    throw DataError(concat("data directory ", dir, ": missing ", name, npy_missing_data_hint()));
  }
  return path;
}

Dataset load_npy_split(const std::string& inputs_path, const std::string& targets_path, std::string name,
                       std::vector<std::string>& converted_from_float64) {
  NpyTargets targets = decode_npy_targets(read_npy(targets_path), targets_path);
  NpyInputs inputs = decode_npy_inputs(read_npy(inputs_path), inputs_path);
  if (inputs.converted_from_float64) converted_from_float64.push_back(inputs_path);
  if (inputs.count != targets.count) {
    throw DataError(concat("x/y count mismatch: ", inputs_path, " has ", inputs.count, " examples but ", targets_path,
                           " has ", targets.count, targets.regression() ? " targets" : " labels"));
  }
  Dataset dataset;
  dataset.name = std::move(name);
  dataset.size = inputs.count;
  dataset.features = inputs.features;
  dataset.example_shape = std::move(inputs.example_shape);
  dataset.inputs = std::move(inputs.values);
  dataset.labels = std::move(targets.labels);
  dataset.target_features = targets.target_features;
  dataset.targets = std::move(targets.targets);
  if (!dataset.regression()) {
    dataset.classes = static_cast<std::size_t>(*std::max_element(dataset.labels.begin(), dataset.labels.end())) + 1;
  }
  return dataset;
}

}  // namespace

std::string npy_missing_data_hint() {
  return concat("; --data npy:DIR must name a directory holding ", kNpyTrainInputsFile, ", ", kNpyTrainTargetsFile,
                ", ", kNpyTestInputsFile, " and ", kNpyTestTargetsFile);
}

DataSplits load_npy_dir(const std::string& dir) {
  std::error_code status_error;
  const auto status = std::filesystem::status(dir, status_error);
  if (!std::filesystem::exists(status)) {
    throw DataError(concat("data directory ", dir, " does not exist", npy_missing_data_hint()));
  }
  if (!std::filesystem::is_directory(status)) {
    throw DataError(concat("data directory ", dir, " is not a directory", npy_missing_data_hint()));
  }
  // Find all four files before reading any, so a missing one is reported at once.
  const std::string train_x = npy_file(dir, kNpyTrainInputsFile);
  const std::string train_y = npy_file(dir, kNpyTrainTargetsFile);
  const std::string test_x = npy_file(dir, kNpyTestInputsFile);
  const std::string test_y = npy_file(dir, kNpyTestTargetsFile);

  const std::string label = directory_label(dir);
  DataSplits splits;
  splits.train = load_npy_split(train_x, train_y, label + "/train", splits.converted_from_float64);
  splits.test = load_npy_split(test_x, test_y, label + "/test", splits.converted_from_float64);
  const Dataset& train = splits.train;
  const Dataset& test = splits.test;
  if (train.example_shape != test.example_shape) {
    throw DataError(concat("example shape mismatch: ", train_x, " has examples of shape ",
                           example_shape_text(train.example_shape), " but ", test_x, " has ",
                           example_shape_text(test.example_shape)));
  }
  if (train.regression() != test.regression()) {
    const auto kind = [](const Dataset& d) { return d.regression() ? "float regression targets" : "integer labels"; };
    throw DataError(concat("label kind mismatch: ", train_y, " has ", kind(train), " but ", test_y, " has ",
                           kind(test)));
  }
  if (train.target_features != test.target_features) {
    throw DataError(concat("target width mismatch: ", train_y, " has ", train.target_features,
                           " values per example but ", test_y, " has ", test.target_features));
  }
  const std::size_t classes = std::max(train.classes, test.classes);
  splits.train.classes = classes;
  splits.test.classes = classes;
  return splits;
}

std::string missing_data_hint(const std::string& dir) {
  if (without_trailing_separators(dir) == without_trailing_separators(kDefaultDataDir)) {
    return "; install the Debian package dataset-fashion-mnist (apt-get install "
           "dataset-fashion-mnist) or pass --data-dir with another MNIST-format directory";
  }
  return concat("; --data-dir must name a directory holding ", kTrainImagesFile, ", ",
                kTrainLabelsFile, ", ", kTestImagesFile, " and ", kTestLabelsFile,
                ", each optionally gzipped with a .gz suffix");
}

DataSplits load_mnist_format(const std::string& dir) {
  std::error_code status_error;
  const auto status = std::filesystem::status(dir, status_error);
  if (!std::filesystem::exists(status)) {
    throw DataError(concat("data directory ", dir, " does not exist", missing_data_hint(dir)));
  }
  if (!std::filesystem::is_directory(status)) {
    throw DataError(concat("data directory ", dir, " is not a directory", missing_data_hint(dir)));
  }
  // Find all four files before reading any, so a missing one is reported at once.
  const std::string train_images = find_data_file(dir, kTrainImagesFile);
  const std::string train_labels = find_data_file(dir, kTrainLabelsFile);
  const std::string test_images = find_data_file(dir, kTestImagesFile);
  const std::string test_labels = find_data_file(dir, kTestLabelsFile);

  const std::string label = directory_label(dir);
  DataSplits splits;
  splits.train = load_split(train_images, train_labels, label + "/train");
  splits.test = load_split(test_images, test_labels, label + "/test");
  if (splits.train.features != splits.test.features) {
    throw DataError(concat("image size mismatch: ", train_images, " has ", splits.train.features,
                           " pixels per image but ", test_images, " has ", splits.test.features));
  }
  return splits;
}

DataSplits make_synthetic(std::size_t train_size, std::size_t test_size, std::uint64_t seed) {
  constexpr std::size_t kMaxExamples = std::numeric_limits<std::size_t>::max() / kSyntheticFeatures;
  if (train_size == 0 || test_size == 0 || train_size > kMaxExamples || test_size > kMaxExamples) {
    throw UsageError(concat("synthetic data needs 1 to ", kMaxExamples,
                            " train and test examples, got train ", train_size, ", test ",
                            test_size));
  }
  Random prototype_random(seed, kPrototypeStream);
  std::vector<float> prototypes(kSyntheticClasses * kSyntheticFeatures);
  for (float& value : prototypes) value = static_cast<float>(prototype_random.uniform());

  Random train_random(seed, kTrainStream);
  Random test_random(seed, kTestStream);
  DataSplits splits;
  splits.train = generate_synthetic_split(train_size, train_random, prototypes, "synthetic/train");
  splits.test = generate_synthetic_split(test_size, test_random, prototypes, "synthetic/test");
  return splits;
}

}  // namespace pipesgd
