#pragma once
// In-memory classification datasets: loaded from MNIST-format IDX files or generated synthetically.
// A Dataset owns its arrays and is immutable after loading, so any number of threads may read it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pipesgd/core/model.h"

namespace pipesgd {

// Where the Debian package dataset-fashion-mnist installs Fashion-MNIST.
constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// A data set is either labelled (classification: `labels`, one per example, in [0, classes)) or has
// regression targets (`targets`: target_features floats per example; `labels` is empty and classes
// is 0).
struct Dataset {
  std::size_t size = 0;       // number of examples
  std::size_t features = 0;   // floats per example
  // The shape of one example, e.g. {1, 28, 28} for MNIST-format images (channels, rows, columns);
  // the product of its dimensions is `features`. A model given inputs [batch, example_shape...]
  // (a TorchScript model) reads it; the built-in models read the flat rows.
  std::vector<std::int64_t> example_shape;
  std::size_t classes = 0;    // labels are in [0, classes)
  std::vector<float> inputs;  // size * features, row-major; pixels scaled to [0, 1] (pixel / 255)
  std::vector<std::int32_t> labels;  // size entries (empty for a regression data set)
  std::size_t target_features = 0;   // regression: floats per target (0: labelled)
  std::vector<float> targets;        // size * target_features, row-major
  std::string name;                  // for logs, e.g. "fashion-mnist/train"

  bool regression() const { return target_features > 0; }
  // Its shape without its arrays: what a model is checked against (core/model.h).
  DataShape shape() const { return {features, example_shape, classes, target_features, name}; }
};

struct DataSplits {
  Dataset train;
  Dataset test;
  // The .npy files of float64 inputs read (converted to float32), for the caller to say so once.
  std::vector<std::string> converted_from_float64;
};

// Loads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
// t10k-labels-idx1-ubyte from `dir`; each may be plain or gzip-compressed with a ".gz" suffix (the
// plain file is used if both exist). Images must be [N, rows, cols], labels [N] with values < 10;
// each example has the shape {1, rows, cols}.
// Throws DataError with a one-line message; for the default directory the message for a missing
// directory or file says how to install the data or pass --data-dir.
DataSplits load_mnist_format(const std::string& dir);

// The files of a NumPy data directory (--data npy:DIR).
inline constexpr const char* kNpyTrainInputsFile = "train_x.npy";
inline constexpr const char* kNpyTrainTargetsFile = "train_y.npy";
inline constexpr const char* kNpyTestInputsFile = "test_x.npy";
inline constexpr const char* kNpyTestTargetsFile = "test_y.npy";

// Loads train_x.npy, train_y.npy, test_x.npy and test_y.npy from `dir` (see data/npy_reader.h for
// the dtypes and shapes taken). Inputs [N, d1, ...] give example_shape {d1, ...}; float32 values
// are taken as they are, uint8 values scaled by 1/255. Integer y gives labels (classes = the
// largest label of train and test + 1); float y regression targets (classes 0). Train and test
// must agree on the example shape and on labels versus targets (and their width). Throws
// DataError with a one-line message naming the file; a missing directory or file is reported
// with npy_missing_data_hint.
DataSplits load_npy_dir(const std::string& dir);

// The end of a "data missing" message for a NumPy directory, starting with "; ".
std::string npy_missing_data_hint();

// The end of a "data missing" message for `dir`, starting with "; ". For kDefaultDataDir it says to
// install the Debian package dataset-fashion-mnist or pass --data-dir; otherwise it lists the files
// a data directory must hold.
std::string missing_data_hint(const std::string& dir);

// Feature count and class count of make_synthetic data (the shape of MNIST: examples {1, 28, 28}).
inline constexpr std::size_t kSyntheticFeatures = 784;
inline constexpr std::size_t kSyntheticClasses = 10;

// A learnable synthetic task in the shape of MNIST: each class has a random prototype image; an
// example is its class prototype plus Gaussian noise, clamped to [0, 1]. Labels are uniform random.
// Deterministic for a seed on every platform (own PRNG, see core/random.h). The train and test
// splits use separate random streams, so a smaller split is a prefix of a larger one with the same
// seed. Throws UsageError if train_size or test_size is zero.
DataSplits make_synthetic(std::size_t train_size, std::size_t test_size, std::uint64_t seed);

}  // namespace pipesgd
