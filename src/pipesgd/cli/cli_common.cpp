#include "pipesgd/cli/cli_common.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string_view>

#include "pipesgd/algo/planning.h"
#include "pipesgd/algo/registry.h"
#include "pipesgd/comm/launch_environment.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/torch/torchscript_model.h"
#include "pipesgd_version.h"  // generated at build time (CMakeLists.txt)

namespace pipesgd {

bool uses_mpi(const std::string& transport) {
  if (transport == "local") return false;
  if (transport == "mpi") return true;
  throw UsageError(concat("--transport '", transport, "': expected local or mpi"));
}

int resolve_workers(int workers, bool workers_given, const MpiSession* session) {
  if (session == nullptr) return workers;
  if (workers_given && workers != session->runtime.size()) {
    throw UsageError(concat("--workers ", workers, " does not match the ", session->runtime.size(),
                            " MPI ranks (mpirun -np); leave --workers out under --transport mpi"));
  }
  return session->runtime.size();
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (item.empty()) throw UsageError(concat("empty entry in list '", text, "'"));
    items.push_back(item);
  }
  if (items.empty()) throw UsageError("empty list");
  return items;
}

namespace {

constexpr std::string_view kNpyPrefix = "npy:";

bool is_npy(const std::string& data) { return data.starts_with(kNpyPrefix); }

}  // namespace
const char* const kModelFlagHelp =
    "Model: mlp (784-500-500-10), cnn (LeNet-style), resnet (ResNet-20-style with batch norm), softmax, or PATH.pt: a "
    "TorchScript module saved by torch.jit.save (inputs [batch, example shape], e.g. [B, 1, 28, 28]; every worker loads "
    "the same file, so its initial weights do not depend on --seed; see docs/user-guide.md)";
const char* const kDataFlagHelp =
    "Data set: fashion-mnist (MNIST-format files, see --data-dir), synthetic, or npy:DIR (DIR/train_x.npy, "
    "train_y.npy, test_x.npy, test_y.npy: inputs [N, ...] float32, float64 (converted to float32) or uint8 (scaled by 1/255); y int64/int32 "
    "labels [N] or float32/float64 regression targets [N] or [N, k])";

std::string data_dir_flag_help() {
  return concat("Directory of MNIST-format IDX files (gzip or plain) [default: ", kDefaultDataDir, "]");
}

const char* const kLossFlagHelp =
    "Loss: cross-entropy (logits [B, C], labels), nll (log-probabilities [B, C], labels) or mse (regression targets; no "
    "accuracy); nll and mse only with a TorchScript --model (the built-in models are cross-entropy classifiers)";

void check_model_flags(const std::string& model, const std::string& loss) {
  const Loss parsed = parse_loss(loss);
  if (names_torchscript_file(model)) return;
  (void)torch_model_factory(model);  // UsageError for an unknown name
  if (parsed != Loss::kCrossEntropy) {
    throw UsageError(concat("--loss ", loss, " needs a TorchScript --model PATH.pt; the built-in model '", model,
                            "' is a cross-entropy classifier"));
  }
}

ModelFactory make_model_factory(const std::string& model, const std::string& loss, const Dataset& train) {
  check_model_flags(model, loss);
  if (names_torchscript_file(model)) return torchscript_model_factory(model, parse_loss(loss), train.shape());
  return torch_model_factory(model);
}

DataSplits load_data_set(const std::string& data, const std::string& dir, std::int64_t seed) {
  if (is_npy(data)) {
    const std::string npy_dir = data.substr(kNpyPrefix.size());
    if (npy_dir.empty()) throw UsageError("--data npy:DIR needs a directory after 'npy:', e.g. --data npy:./my-data");
    if (!dir.empty()) {
      throw UsageError(concat("--data-dir cannot be combined with --data ", data, " (the directory is part of --data)"));
    }
    DataSplits splits = load_npy_dir(npy_dir);
    // Once per command, from one process of an MPI launch (rank 0, or the only one).
    if (!splits.converted_from_float64.empty() && launch_environment().rank <= 0) {
      std::fprintf(stderr, "pipesgd: note: %s hold%s float64 inputs: converted to float32\n",
                   join(splits.converted_from_float64, " and ").c_str(),
                   splits.converted_from_float64.size() == 1 ? "s" : "");
    }
    return splits;
  }
  if (data == "synthetic") {
    if (!dir.empty()) throw UsageError("--data-dir cannot be combined with --data synthetic");
    return make_synthetic(12000, 2000, static_cast<std::uint64_t>(seed));
  }
  if (data != "fashion-mnist" && data != "mnist-format") {
    throw UsageError(concat("unknown data set '", data, "' (expected fashion-mnist, synthetic or npy:DIR)"));
  }
  return load_mnist_format(dir.empty() ? kDefaultDataDir : dir);
}

DataSetDescription describe_data_set(const std::string& data, const std::string& dir, std::int64_t seed) {
  if (is_npy(data)) return {"npy", data.substr(kNpyPrefix.size())};
  if (data == "synthetic") return {data, concat("generated from --seed ", seed)};
  return {data, dir.empty() ? std::string(kDefaultDataDir) : dir};
}

void check_data_fits_builtin_model(const std::string& model, const DataSplits& data, const std::string& data_flag) {
  const std::vector<std::string> builtin = torch_model_names();
  if (std::find(builtin.begin(), builtin.end(), model) == builtin.end()) return;
  const Dataset& train = data.train;
  std::string mismatch;
  if (train.features != kBuiltinModelFeatures) {
    std::vector<std::string> dims;
    for (std::int64_t d : train.example_shape) dims.push_back(concat(d));
    mismatch = concat("examples of shape [", join(dims, ", "), "] (", train.features, " features)");
  } else if (train.regression()) {
    mismatch = concat("regression targets (", train.target_features, " per example)");
  } else if (data.train.classes > kBuiltinModelClasses || data.test.classes > kBuiltinModelClasses) {
    mismatch = concat("labels up to ", std::max(data.train.classes, data.test.classes) - 1);
  }
  if (mismatch.empty()) return;
  throw UsageError(concat("model '", model, "' takes ", kBuiltinModelFeatures, " features per example (28x28) and labels 0 to ",
                          kBuiltinModelClasses - 1, "; the data --data ", data_flag, " has ", mismatch));
}

std::string pipesgd_version() { return PIPESGD_VERSION; }

void prepare_output_directory(const std::string& dir) {
  if (!dir.empty()) ensure_writable_directory(dir, "--out");
}

TrainConfig layer_wise_profiling_config(OptionValues method_options, std::int64_t profile_iterations, int workers,
                                        const std::string& model, std::int64_t batch, std::int64_t seed,
                                        const NetworkSpec& network) {
  checked_profile_iterations(profile_iterations);
  if (seed < 0) throw UsageError(concat("--seed must be >= 0, got ", seed));
  if (batch < 1 || batch > static_cast<std::int64_t>(kMaxBatch)) {
    throw UsageError(concat("--batch must be in [1, ", kMaxBatch, "], got ", batch));
  }
  method_options.set("--profile-iters", concat(profile_iterations));
  TrainConfig config;
  config.method = select_method(layer_wise_profiling_spec(), method_options, FlagPolicy::kReject, CommonOptions{});
  config.workers = workers;
  config.model = model;
  config.batch = static_cast<std::size_t>(batch);
  config.iterations = kProfileWarmupIterations + profile_iterations;
  config.seed = static_cast<std::uint64_t>(seed);
  config.network = network;
  config.progress = false;
  config.evaluate = false;
  config.warn_short_run = false;  // the profile ends where the plan is made, by design
  validate_train_config(config);
  return config;
}

}  // namespace pipesgd
