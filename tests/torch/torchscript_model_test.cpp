// TorchScript models (torch/torchscript_model.h) on files exported by examples/export_models.py, which
// the tests run with Debian's /usr/bin/python3 (python3-torch, python3-torchvision: installed by
// scripts/install-deps.sh). A missing interpreter or torch fails these tests; they never skip.
#include "pipesgd/torch/torchscript_model.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../core/tiny_run.h"
#include "pipesgd/algo/registry.h"
#include "pipesgd/core/error.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {
namespace {

// The exported models, made once per test process in a fresh temporary directory.
const std::string& models_dir() {
  static const std::string dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "pipesgd-torchscript.XXXXXX").string();
    const char* made = mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    const std::string command = std::string("/usr/bin/python3 ") + PIPESGD_SOURCE_DIR +
                                "/examples/export_models.py --test-models --out " + made + " >" + made +
                                "/export.log 2>&1";
    if (std::system(command.c_str()) != 0) {
      throw std::runtime_error("examples/export_models.py failed (is python3-torch installed? "
                               "scripts/install-deps.sh): " + command);
    }
    return std::string(made);
  }();
  return dir;
}

std::string model_file(const std::string& name) { return models_dir() + "/" + name; }

const DataSplits& images() {
  static const DataSplits data = make_synthetic(600, 100, 3);
  return data;
}

// y = 0.5 * sum(x) - 0.25 over 4 inputs in [0, 1): a regression set for --loss mse.
DataSplits regression_data(std::size_t target_features = 1) {
  DataSplits splits;
  for (Dataset* set : {&splits.train, &splits.test}) {
    set->size = set == &splits.train ? 400 : 50;
    set->features = 4;
    set->example_shape = {4};
    set->target_features = target_features;
    set->name = "regression";
    std::uint32_t state = set == &splits.train ? 1u : 2u;
    for (std::size_t i = 0; i < set->size; ++i) {
      float sum = 0;
      for (int k = 0; k < 4; ++k) {
        state = state * 1664525u + 1013904223u;
        const float x = static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
        set->inputs.push_back(x);
        sum += x;
      }
      for (std::size_t k = 0; k < target_features; ++k) set->targets.push_back(0.5f * sum - 0.25f);
    }
  }
  return splits;
}

TrainConfig short_config(const std::string& spec, int workers, std::int64_t iterations) {
  TrainConfig config = tiny_config(spec, workers);
  config.model = "test.pt";
  config.iterations = iterations;
  config.warn_short_run = false;
  return config;
}

// The TorchScript mlp given the built-in mlp's initial weights for the seed: both lay out fc1, fc2,
// fc3, weight then bias, so the flat buffers are copied as they are.
ModelFactory scripted_mlp_with_builtin_weights() {
  const ModelFactory scripted = torchscript_model_factory(model_file("mlp.pt"), Loss::kCrossEntropy, images().train.shape());
  const ModelFactory builtin = torch_model_factory("mlp");
  return [scripted, builtin](std::uint64_t seed) {
    std::unique_ptr<Model> model = scripted(seed);
    const std::unique_ptr<Model> reference = builtin(seed);
    EXPECT_EQ(model->layout().total(), reference->layout().total());
    std::copy(reference->parameters().begin(), reference->parameters().end(), model->parameters().begin());
    return model;
  };
}

TEST(TorchScriptModelTest, SegmentsAreTheLayersInBackwardReadinessOrder) {
  const auto factory = torchscript_model_factory(model_file("mlp.pt"), Loss::kCrossEntropy, images().train.shape());
  const auto model = factory(1);
  const Layout& layout = model->layout();
  ASSERT_EQ(layout.segment_count(), 3u);
  EXPECT_EQ(layout.segment(0).name, "fc1");
  EXPECT_EQ(layout.segment(1).name, "fc2");
  EXPECT_EQ(layout.segment(2).name, "fc3");
  EXPECT_EQ(layout.total(), 648010u);
  EXPECT_FALSE(model->reports_forward_progress());
  // The seed does not change the weights: every replica loads the same file.
  EXPECT_TRUE(std::equal(model->parameters().begin(), model->parameters().end(), factory(99)->parameters().begin()));
}

TEST(TorchScriptModelTest, BackwardReportsEverySegmentOnceLastFirst) {
  const auto model = torchscript_model_factory(model_file("transformer.pt"), Loss::kCrossEntropy, images().train.shape())(1);
  const Dataset& train = images().train;
  Batch batch = labelled_batch(std::span(train.inputs).first(8 * 784), std::span(train.labels).first(8), 8, 784);
  batch.example_shape = train.example_shape;
  std::vector<float> gradients(model->layout().total(), 1.0f);
  std::vector<std::size_t> reported;
  const StepResult step =
      model->forward_backward(batch, gradients, [&](std::size_t segment, double) { reported.push_back(segment); });
  ASSERT_EQ(reported.size(), model->layout().segment_count());
  for (std::size_t i = 0; i < reported.size(); ++i) EXPECT_EQ(reported[i], reported.size() - 1 - i);
  EXPECT_TRUE(std::isfinite(step.loss));
  double norm = 0;
  for (float g : gradients) norm += double(g) * g;
  EXPECT_GT(norm, 0.0);
}

// The built-in mlp and its TorchScript export, same initial weights, same method and data: the same
// weights after training, bit for bit (the JIT runs with its graph optimizer off, so forward and
// backward run the same ATen kernels in the same order as the built-in model's).
class ScriptedMlpEqualsBuiltin : public ::testing::TestWithParam<std::string> {};

TEST_P(ScriptedMlpEqualsBuiltin, BitIdenticalWeights) {
  const TrainConfig config = short_config(GetParam(), 2, 4);
  TrainConfig builtin_config = config;
  builtin_config.model = "mlp";
  const RunSummary builtin = run_training(builtin_config, torch_model_factory("mlp"), images());
  const RunSummary scripted = run_training(config, scripted_mlp_with_builtin_weights(), images());
  ASSERT_EQ(builtin.final_parameters.size(), 2u);
  ASSERT_EQ(scripted.final_parameters.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(scripted.final_parameters[rank].size(), builtin.final_parameters[rank].size());
    std::size_t differing = 0;
    for (std::size_t i = 0; i < builtin.final_parameters[rank].size(); ++i) {
      differing += scripted.final_parameters[rank][i] != builtin.final_parameters[rank][i];
    }
    EXPECT_EQ(differing, 0u) << "rank " << rank;
  }
  // Not vacuous: training moved the weights away from the initial ones.
  const auto initial = torch_model_factory("mlp")(config.seed);
  EXPECT_FALSE(std::equal(initial->parameters().begin(), initial->parameters().end(),
                          builtin.final_parameters[0].begin()));
}

INSTANTIATE_TEST_SUITE_P(Methods, ScriptedMlpEqualsBuiltin, ::testing::Values("dsync", "pipe"),
                         [](const auto& info) { return info.param; });

// Every registered method runs a few iterations on a TorchScript model with 2 workers.
std::vector<std::string> registered_methods() {
  std::vector<std::string> names;
  for (const MethodDescriptor* method : method_registry()) names.push_back(method->name);
  return names;
}

class EveryMethodOnTorchScript : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryMethodOnTorchScript, TrainsAFewIterations) {
  const ModelFactory factory =
      torchscript_model_factory(model_file("transformer.pt"), Loss::kCrossEntropy, images().train.shape());
  const TrainConfig config = short_config(GetParam(), 2, 8);
  const RunSummary summary = run_training(config, factory, images());
  ASSERT_FALSE(summary.final_parameters.empty());
  const auto initial = factory(0);
  for (const std::vector<float>& parameters : summary.final_parameters) {
    ASSERT_EQ(parameters.size(), initial->layout().total());
    for (float p : parameters) ASSERT_TRUE(std::isfinite(p));
    EXPECT_FALSE(std::equal(parameters.begin(), parameters.end(), initial->parameters().begin()));
  }
  ASSERT_FALSE(summary.epochs.empty());
  EXPECT_TRUE(std::isfinite(summary.epochs.back().train_loss));
}

INSTANTIATE_TEST_SUITE_P(Registry, EveryMethodOnTorchScript, ::testing::ValuesIn(registered_methods()),
                         [](const auto& info) { return info.param; });

TEST(TorchScriptModelTest, MseRegressionLearnsAndHasNoAccuracy) {
  const DataSplits data = regression_data();
  const ModelFactory factory = torchscript_model_factory(model_file("regression.pt"), Loss::kMse, data.train.shape());
  Batch all;
  all.inputs = data.test.inputs;
  all.size = data.test.size;
  all.features = 4;
  all.example_shape = data.test.example_shape;
  all.targets = data.test.targets;
  all.target_features = 1;
  const Evaluation before = factory(0)->evaluate(all);
  TrainConfig config = short_config("dsync", 2, 60);
  config.has_accuracy = false;
  config.evaluate = true;
  const RunSummary summary = run_training(config, factory, data);
  ASSERT_FALSE(summary.epochs.empty());
  EXPECT_EQ(summary.epochs.back().train_accuracy, -1.0) << "no accuracy for mse";
  EXPECT_EQ(summary.epochs.back().test_accuracy, -1.0);
  EXPECT_EQ(summary.figures.final_train_accuracy, -1.0);
  EXPECT_GE(summary.epochs.back().test_loss, 0.0);
  auto trained = factory(0);
  std::copy(summary.final_parameters[0].begin(), summary.final_parameters[0].end(), trained->parameters().begin());
  const Evaluation after = trained->evaluate(all);
  EXPECT_EQ(after.correct, 0u);
  EXPECT_EQ(after.count, data.test.size);
  // The mean squared error, computed independently from the parameters: fc1 (8x4 + 8), fc2 (1x8 + 1).
  std::span<const float> p = summary.final_parameters[0];
  const Layout& layout = trained->layout();
  ASSERT_EQ(layout.segment(0).name, "fc1");
  double squared = 0;
  for (std::size_t row = 0; row < all.size; ++row) {
    double out = p[layout.segment(1).offset + 8];
    for (int j = 0; j < 8; ++j) {
      double h = p[32 + j];
      for (int k = 0; k < 4; ++k) h += double(p[j * 4 + k]) * all.inputs[row * 4 + k];
      out += double(p[layout.segment(1).offset + j]) * std::tanh(h);
    }
    squared += std::pow(out - all.targets[row], 2);
  }
  EXPECT_NEAR(after.loss_sum, squared, 1e-4 * std::max(1.0, squared));
  EXPECT_LT(after.loss_sum, before.loss_sum * 0.5) << "training reduced the error";
}

// Each bad input: the given error type, with one line naming the file.
template <typename ErrorType>
void expect_one_line_error(const std::function<void()>& action, const std::string& fragment) {
  try {
    action();
    ADD_FAILURE() << "no error; expected one containing '" << fragment << "'";
  } catch (const ErrorType& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

TEST(TorchScriptModelTest, BadInputIsOneLine) {
  const Dataset& labelled = images().train;
  const DataSplits targets = regression_data();
  const auto load = [](const std::string& file, Loss loss, const Dataset& data) {
    return [=, shape = data.shape()] { (void)torchscript_model_factory(file, loss, shape); };
  };
  expect_one_line_error<DataError>(load(model_file("missing.pt"), Loss::kCrossEntropy, labelled), "missing.pt");
  expect_one_line_error<DataError>(load(model_file("state_dict.pt"), Loss::kCrossEntropy, labelled),
                                   "not a TorchScript module");
  expect_one_line_error<DataError>(load(model_file("export.log"), Loss::kCrossEntropy, labelled),
                                   "not a TorchScript module");
  expect_one_line_error<UsageError>(load(model_file("no_parameters.pt"), Loss::kCrossEntropy, labelled),
                                    "has no trainable parameters");
  expect_one_line_error<UsageError>(load(model_file("five_logits.pt"), Loss::kCrossEntropy, labelled),
                                    "outputs Float [2, 5] for a batch of 2 but --loss cross-entropy needs logits [2, C] "
                                    "with C >= 10 classes");
  expect_one_line_error<UsageError>(load(model_file("regression.pt"), Loss::kCrossEntropy, labelled),
                                    "forward on an input of shape [2, 1, 28, 28] failed");
  expect_one_line_error<UsageError>(load(model_file("mlp.pt"), Loss::kMse, labelled),
                                    "--loss mse needs regression targets");
  expect_one_line_error<UsageError>(load(model_file("regression.pt"), Loss::kCrossEntropy, targets.train),
                                    "has regression targets (use --loss mse)");
  const DataSplits two_targets = regression_data(2);
  expect_one_line_error<UsageError>(load(model_file("regression.pt"), Loss::kMse, two_targets.train),
                                    "outputs Float [2, 1] for a batch of 2 but --loss mse needs the targets' shape [2, 2]");
  // A truncated file: the zip's central directory is missing.
  const std::string truncated = models_dir() + "/truncated.pt";
  std::filesystem::copy_file(model_file("gru.pt"), truncated);
  std::filesystem::resize_file(truncated, 4000);
  expect_one_line_error<DataError>(load(truncated, Loss::kCrossEntropy, labelled), "truncated.pt");
  // The fuzzer's finds on damaged records, refused before LibTorch reads them: a pickle whose memo
  // index would make it allocate 10 GB, a source-range pickle (.debug_pkl) on which it allocated 1.8 GB,
  // and a code/__torch__.py on which its TorchScript parser crashed (SEGV). Their records fail their
  // CRC-32 (the pickle checks themselves: PicklesSizingMoreThanTheirBytesAreRefused...).
  for (const auto& [seed, record] : std::vector<std::pair<std::string, std::string>>{
           {"regression-memo-index-oom", "regression/data.pkl"},
           {"regression-debug-pkl-oom", "regression/data/0"},
           {"regression-code-crc-segv", "no_parameters/code/__torch__.py"}}) {
    expect_one_line_error<DataError>(
        load(std::string(PIPESGD_SOURCE_DIR) + "/fuzz/corpus/torchscript_load/" + seed, Loss::kCrossEntropy, labelled),
        "zip record " + record + " fails its CRC-32 check (the file is damaged)");
  }
  // A deflated record declaring 4.2 GB from 343 bytes, which LibTorch allocated (the fuzzer's find).
  expect_one_line_error<DataError>(
      load(std::string(PIPESGD_SOURCE_DIR) + "/fuzz/corpus/torchscript_load/regression-zip-declared-size-oom",
           Loss::kCrossEntropy, labelled),
      "zip record regression/code/__torch__.py.debug_pkl declares 4227858432 bytes from 343 deflated bytes");
  EXPECT_THROW(parse_loss("hinge"), UsageError);
}

// Appends `value` to `out` as `bytes` little-endian bytes (the zip format's integers).
void put(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// A record of a hand-made zip: stored bytes, and what its central directory entry says of them (by
// default the truth; a test overrides one field to lie).
struct ZipRecord {
  std::string name, content;
  std::uint16_t method = 0;
  std::optional<std::uint32_t> compressed, uncompressed, crc;
  std::string extra;  // the entry's extra field
};

ZipRecord zip_record(std::string name, std::string content) {
  ZipRecord record;
  record.name = std::move(name), record.content = std::move(content);
  return record;
}

// A zip of `records`, each stored (the local headers always say stored and tell the truth).
std::string stored_zip(const std::vector<ZipRecord>& records) {
  std::string zip, directory_entries;
  for (const ZipRecord& record : records) {
    const std::size_t local_header = zip.size();
    const auto size = static_cast<std::uint32_t>(record.content.size());
    const std::uint32_t crc =
        crc32(0, reinterpret_cast<const Bytef*>(record.content.data()), static_cast<uInt>(record.content.size()));
    put(zip, 0x04034b50, 4), put(zip, 20, 2), put(zip, 0, 2), put(zip, 0, 2), put(zip, 0, 4), put(zip, crc, 4);
    put(zip, size, 4), put(zip, size, 4), put(zip, record.name.size(), 2), put(zip, 0, 2);
    zip += record.name + record.content;
    std::string& entry = directory_entries;
    put(entry, 0x02014b50, 4), put(entry, 20, 2), put(entry, 20, 2), put(entry, 0, 2), put(entry, record.method, 2);
    put(entry, 0, 4), put(entry, record.crc.value_or(crc), 4), put(entry, record.compressed.value_or(size), 4);
    put(entry, record.uncompressed.value_or(size), 4), put(entry, record.name.size(), 2);
    put(entry, record.extra.size(), 2), put(entry, 0, 2), put(entry, 0, 2), put(entry, 0, 2), put(entry, 0, 4);
    put(entry, local_header, 4);
    entry += record.name + record.extra;
  }
  const std::size_t directory = zip.size();
  zip += directory_entries;
  put(zip, 0x06054b50, 4), put(zip, 0, 2), put(zip, 0, 2), put(zip, records.size(), 2), put(zip, records.size(), 2);
  put(zip, directory_entries.size(), 4), put(zip, directory, 4), put(zip, 0, 2);
  return zip;
}

// A zip of one record "m/version" holding "3\n", its central directory entry written with the given
// method, sizes and extra field.
std::string one_record_zip(std::uint16_t method, std::uint32_t compressed, std::uint32_t uncompressed,
                           const std::string& extra = "") {
  ZipRecord version = zip_record("m/version", "3\n");
  version.method = method, version.compressed = compressed, version.uncompressed = uncompressed, version.extra = extra;
  return stored_zip({version});
}

// A zip64 extended information field (id 1) holding `uncompressed` as 8 bytes.
std::string zip64_size_field(std::uint64_t uncompressed) {
  std::string field;
  put(field, 1, 2), put(field, 8, 2), put(field, uncompressed, 8);
  return field;
}

// LibTorch's zip reader allocates what a record declares before it reads it: the declared sizes are
// checked against the bytes first. The well-formed zip fails later, in LibTorch (it is no module).
TEST(TorchScriptModelTest, ZipRecordsDeclaringMoreThanTheirBytesAreRefusedBeforeLibTorchReadsThem) {
  const auto check = [](const std::string& zip) { return [zip] { check_torchscript_bytes(zip, "x.pt"); }; };
  expect_one_line_error<DataError>(check(one_record_zip(0, 2, 2)), "model file 'x.pt' is not a TorchScript module");
  try {
    check_torchscript_bytes(one_record_zip(0, 2, 2), "x.pt");
  } catch (const DataError& error) {
    EXPECT_EQ(std::string(error.what()).find("zip record"), std::string::npos) << error.what();
  }
  expect_one_line_error<DataError>(check(one_record_zip(8, 2, 2 * 1032 + 1)),
                                   "zip record m/version declares 2065 bytes from 2 deflated bytes");
  expect_one_line_error<DataError>(check(one_record_zip(0, 0xFFFFFFFF, 0xFFFFFFFF, zip64_size_field(1ull << 33))),
                                   "zip record m/version declares 4294967295 compressed bytes in a");
  expect_one_line_error<DataError>(check(one_record_zip(0, 2, 0xFFFFFFFF, zip64_size_field(1ull << 33))),
                                   "zip record m/version declares 8589934592 bytes from 2 stored bytes");
  expect_one_line_error<DataError>(check(one_record_zip(12, 2, 2)), "zip record m/version has compression method 12");
}

// LibTorch 1.13 reads records without checking their CRC-32, and its TorchScript parser crashed (SEGV)
// on a damaged code/*.py record: a record's bytes are checked against its entry before LibTorch reads
// them. Every size check comes before any content check.
TEST(TorchScriptModelTest, DamagedRecordsAreRefusedBeforeLibTorchReadsThem) {
  const auto check = [](const std::vector<ZipRecord>& records) {
    return [zip = stored_zip(records)] { check_torchscript_bytes(zip, "x.pt"); };
  };
  const ZipRecord version = zip_record("m/version", "3\n");
  ZipRecord damaged = zip_record("m/code/__torch__.py", "class M(Module):\n  pass\n");
  damaged.crc = 0x12345678;
  expect_one_line_error<DataError>(check({version, damaged}),
                                   "zip record m/code/__torch__.py fails its CRC-32 check (the file is damaged)");
  ZipRecord oversized = version;
  oversized.name = "m/data.pkl", oversized.uncompressed = 3;
  expect_one_line_error<DataError>(check({damaged, version, oversized}),
                                   "zip record m/data.pkl declares 3 bytes from 2 stored bytes");
  // A deflated entry whose stored bytes are no deflate stream.
  ZipRecord not_deflate = version;
  not_deflate.method = 8;
  expect_one_line_error<DataError>(check({not_deflate}), "zip record m/version does not inflate to its declared 2 bytes");
}

// Each pickle is walked before LibTorch unpickles it: lengths and memo indexes larger than the record
// (which LibTorch 1.13 allocates) are refused, in records whose CRC-32 is right.
TEST(TorchScriptModelTest, PicklesSizingMoreThanTheirBytesAreRefusedBeforeLibTorchReadsThem) {
  const auto check = [](const std::string& pickle) {
    return [zip = stored_zip({zip_record("m/version", "3\n"), zip_record("m/data.pkl", pickle)})] { check_torchscript_bytes(zip, "x.pt"); };
  };
  expect_one_line_error<DataError>(check(std::string("\x80\x02r\xff\xff\xff\x7f.", 8)),
                                   "data.pkl: pickle memo index 2147483647 beyond its 8 bytes");
  expect_one_line_error<DataError>(check(std::string("\x80\x02X\x00\x00\x00\x40.", 8)),
                                   "data.pkl: pickle length runs past its end at byte 7");
  expect_one_line_error<DataError>(check(std::string("\x80\x02\xff.", 4)), "data.pkl: unknown pickle opcode 255 at byte 2");
}

TEST(TorchScriptModelTest, NllWithLogSoftmaxOutputs) {
  const auto factory = torchscript_model_factory(model_file("mlp_logsoftmax.pt"), Loss::kNll, images().train.shape());
  const RunSummary summary = run_training(short_config("dsync", 2, 4), factory, images());
  EXPECT_TRUE(std::isfinite(summary.epochs.back().train_loss));
  EXPECT_GT(summary.epochs.back().train_loss, 0.0);
}

}  // namespace
}  // namespace pipesgd
