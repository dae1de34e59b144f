// The `pipesgd` command: train, compare, bench allreduce.
#include <CLI/CLI.hpp>

#include <malloc.h>

#include <cstdio>
#include <iostream>
#include <sstream>

#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/timeout.h"
#include "pipesgd/core/error.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/train/allreduce_benchmark.h"
#include "pipesgd/train/report.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {
namespace {

// Flags shared by `train` and `compare`, as typed, before validation.
struct TrainFlags {
  int workers = 4;
  std::string model = "mlp";
  std::string data = "fashion-mnist";
  std::string data_dir;
  std::int64_t epochs = 1;
  std::int64_t iterations = 0;
  std::int64_t seed = 1;
  // Plain SGD at 0.1: the setting of the Pipe-SGD paper's analysis; stale gradients under heavy
  // momentum overshoot (see docs/results.md), so momentum is opt-in.
  float learning_rate = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  std::int64_t batch = 25;
  int staleness = 2;
  std::int64_t warmup_epochs = 0;
  std::int64_t warmup_iterations = 0;
  std::string codec = "none";
  std::string network = "none";
  double comm_timeout_seconds = 120;
  std::string segment_bytes = "auto";
  std::string out_dir;
  bool quiet = false;
  bool no_eval = false;
};

void add_train_flags(CLI::App& command, TrainFlags& flags) {
  command.add_option("--workers", flags.workers, "Workers (threads of this process, one replica each)")
      ->capture_default_str();
  command.add_option("--model", flags.model, "Model: mlp (784-500-500-10), cnn (LeNet-style), softmax")
      ->capture_default_str();
  command.add_option("--data", flags.data,
                     "Data set: fashion-mnist (MNIST-format files, see --data-dir) or synthetic")
      ->capture_default_str();
  command.add_option("--data-dir", flags.data_dir,
                     std::string("Directory of MNIST-format IDX files (gzip or plain) [default: ") +
                         kDefaultDataDir + "]");
  command.add_option("--epochs", flags.epochs, "Epochs to train")->capture_default_str();
  command.add_option("--iters", flags.iterations, "Train exactly this many iterations instead of --epochs");
  command.add_option("--seed", flags.seed, "Seed of the model initialisation and data shuffling")
      ->capture_default_str();
  command.add_option("--lr", flags.learning_rate, "SGD learning rate")->capture_default_str();
  command.add_option("--momentum", flags.momentum, "SGD momentum")->capture_default_str();
  command.add_option("--weight-decay", flags.weight_decay, "SGD weight decay (L2)")->capture_default_str();
  command.add_option("--batch", flags.batch,
                     "Per-worker batch (4 workers x 25 = the paper's global batch of 100)")
      ->capture_default_str();
  command.add_option("--staleness-k", flags.staleness,
                     "Pipe-SGD iteration dependency K: the update at t uses the gradient of t-K")
      ->capture_default_str();
  command.add_option("--warmup-epochs", flags.warmup_epochs, "Pipe-SGD: run D-Sync for this many epochs first")
      ->capture_default_str();
  command.add_option("--warmup-iters", flags.warmup_iterations,
                     "Pipe-SGD: run D-Sync for this many (further) iterations first")
      ->capture_default_str();
  command.add_option("--codec", flags.codec,
                     "Gradient codec inside the allreduce: none, bf16 (16-bit truncation), int8 "
                     "(8-bit quantization); a method's +codec overrides it")
      ->capture_default_str();
  command.add_option("--net", flags.network,
                     "Emulated network per worker: none, 1gbe, 10gbe, 25gbe, 100gbe or "
                     "bw=2.5Gbit,lat=30us")
      ->capture_default_str();
  command.add_option("--comm-timeout", flags.comm_timeout_seconds,
                     "Seconds any wait on a peer may take before the run fails")
      ->capture_default_str();
  command.add_option("--segment-bytes", flags.segment_bytes,
                     "Allreduce message segment size: auto (D-Sync 256K, Pipe-SGD unsegmented), none "
                     "(unsegmented) or a size such as 256K")
      ->capture_default_str();
  command.add_option("--out", flags.out_dir, "Write metrics.jsonl and summary.json (compare: compare.json) here");
  command.add_flag("--quiet", flags.quiet, "No progress output");
  command.add_flag("--no-eval", flags.no_eval, "Skip the test-set evaluation after each epoch");
}

TrainConfig to_config(const TrainFlags& flags, const std::string& method_spec) {
  TrainConfig config;
  config.method.codec = flags.codec;
  make_codec(flags.codec);  // validate --codec even when the method spec overrides it
  apply_method_spec(method_spec, config);
  config.method.staleness = flags.staleness;
  if (flags.seed < 0) throw UsageError(concat("--seed must be >= 0, got ", flags.seed));
  if (flags.batch < 1 || flags.batch > static_cast<std::int64_t>(kMaxBatch)) {
    throw UsageError(concat("--batch must be in [1, ", kMaxBatch, "], got ", flags.batch));
  }
  config.method.sgd = SgdOptions{flags.learning_rate, flags.momentum, flags.weight_decay};
  config.method.allreduce.timeout = timeout_from_seconds(flags.comm_timeout_seconds, "--comm-timeout");
  config.method.allreduce.segment_bytes = parse_segment_bytes(flags.segment_bytes);
  config.workers = flags.workers;
  config.model = flags.model;
  config.batch = static_cast<std::size_t>(flags.batch);
  config.epochs = flags.epochs;
  config.iterations = flags.iterations;
  config.warmup_epochs = flags.warmup_epochs;
  config.warmup_iterations = flags.warmup_iterations;
  config.seed = static_cast<std::uint64_t>(flags.seed);
  config.network = parse_network_spec(flags.network);
  config.out_dir = flags.out_dir;
  config.progress = !flags.quiet;
  config.evaluate = !flags.no_eval;
  validate_train_config(config);  // before loading any data
  return config;
}

DataSplits load_data(const TrainFlags& flags) {
  if (flags.data == "synthetic") {
    if (!flags.data_dir.empty()) throw UsageError("--data-dir cannot be combined with --data synthetic");
    return make_synthetic(12000, 2000, static_cast<std::uint64_t>(flags.seed));
  }
  if (flags.data != "fashion-mnist" && flags.data != "mnist-format") {
    throw UsageError(concat("unknown data set '", flags.data, "' (expected fashion-mnist or synthetic)"));
  }
  return load_mnist_format(flags.data_dir.empty() ? kDefaultDataDir : flags.data_dir);
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

int run_train(const TrainFlags& flags, const std::string& method_spec) {
  TrainConfig config = to_config(flags, method_spec);
  ModelFactory factory = torch_model_factory(config.model);
  const DataSplits data = load_data(flags);
  std::cout << "pipesgd train: " << config.method_spec << " on " << config.model << " ("
            << data.train.name << ", " << data.train.size << " training examples), "
            << config.workers << " workers, network " << describe(config.network) << std::endl;
  RunSummary summary = run_training(config, factory, data);
  print_run_report(std::cout, summary);
  if (!config.out_dir.empty()) std::cout << "wrote " << config.out_dir << "/{metrics.jsonl,summary.json}\n";
  return 0;
}

int run_compare(const TrainFlags& flags, const std::string& algorithms) {
  const std::vector<std::string> specs = split_list(algorithms);
  std::vector<TrainConfig> configs;
  for (const std::string& spec : specs) configs.push_back(to_config(flags, spec));  // validate all first
  ModelFactory factory = torch_model_factory(flags.model);
  const DataSplits data = load_data(flags);
  std::cout << "pipesgd compare: " << algorithms << " on " << flags.model << " (" << data.train.name
            << "), " << flags.workers << " workers, network " << describe(configs[0].network)
            << std::endl;
  std::vector<RunSummary> summaries;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    TrainConfig& config = configs[i];
    if (!flags.out_dir.empty()) config.out_dir = concat(flags.out_dir, "/", i + 1, "-", config.method_spec);
    std::cerr << "[" << i + 1 << "/" << configs.size() << "] " << config.method_spec << std::endl;
    summaries.push_back(run_training(config, factory, data));
  }
  std::cout << "\n";
  print_compare_table(std::cout, summaries);
  if (!flags.out_dir.empty()) {
    write_compare_outputs(flags.out_dir, summaries);
    std::cout << "wrote " << flags.out_dir << "/compare.json\n";
  }
  return 0;
}

int run_bench_allreduce(int workers, const std::string& network, const std::string& codecs,
                        const std::string& sizes, int repeats, int warmup, double timeout_seconds,
                        const std::string& segment_bytes, const std::string& out_dir) {
  AllreduceBenchmarkConfig config;
  config.segment_bytes = parse_segment_bytes(segment_bytes);
  if (config.segment_bytes == kAutoSegmentBytes) config.segment_bytes = kDefaultSegmentBytes;
  config.workers = workers;
  config.network = parse_network_spec(network);
  config.codecs = split_list(codecs);
  for (const auto& codec : config.codecs) make_codec(codec);
  if (!sizes.empty()) config.sizes_bytes = parse_sizes(sizes);
  config.repeats = repeats;
  config.warmup = warmup;
  if (workers < 1 || workers > kMaxWorkers) {
    throw UsageError(concat("--workers must be in [1, ", kMaxWorkers, "], got ", workers));
  }
  config.timeout = timeout_from_seconds(timeout_seconds, "--comm-timeout");
  std::printf("pipesgd bench allreduce: %d ranks over LocalTransport (%s), segments %s, median of %d runs\n\n",
              workers, describe(config.network).c_str(),
              describe_segment_bytes(config.segment_bytes).c_str(), repeats);
  std::printf("%-10s %-6s %12s %12s %12s %12s %10s\n", "algorithm", "codec", "bytes", "time (us)",
              "algbw GB/s", "busbw GB/s", "check");
  std::fflush(stdout);
  nlohmann::json rows = nlohmann::json::array();
  bool all_correct = true;
  run_allreduce_benchmark(config, [&](const AllreduceBenchmarkRow& row) {
    std::printf("%-10s %-6s %12zu %12.1f %12.3f %12.3f %10s\n", row.algorithm.c_str(),
                row.codec.c_str(), row.bytes, row.median_seconds * 1e6, row.algbw / 1e9,
                row.busbw / 1e9, row.correct ? "ok" : "WRONG");
    std::fflush(stdout);
    all_correct &= row.correct;
    rows.push_back({{"algorithm", row.algorithm}, {"codec", row.codec}, {"ranks", row.workers},
                    {"segments", describe_segment_bytes(config.segment_bytes)},
                    {"bytes", row.bytes}, {"time_s", row.median_seconds},
                    {"min_time_s", row.min_seconds}, {"max_time_s", row.max_seconds},
                    {"algbw_bytes_per_s", row.algbw}, {"busbw_bytes_per_s", row.busbw},
                    {"max_error", row.max_error}, {"error_bound", row.error_bound},
                    {"correct", row.correct}});
  });
  if (!out_dir.empty()) {
    ensure_directory(out_dir);
    std::ofstream out(out_dir + "/allreduce.json");
    if (!out) throw UsageError(concat("cannot write '", out_dir, "/allreduce.json'"));
    out << rows.dump(2) << '\n';
    std::printf("\nwrote %s/allreduce.json\n", out_dir.c_str());
  }
  if (!all_correct) {
    std::fprintf(stderr, "pipesgd: error: an allreduce result was outside its bound\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace pipesgd

int main(int argc, char** argv) {
  using namespace pipesgd;
  // LibTorch allocates and frees the same large temporaries (activations, per-parameter gradients)
  // every iteration. With glibc's defaults they are mmap'd and unmapped, or trimmed, each time, and
  // every iteration pays for fresh page faults (expensive in a VM). Keep freed memory in the heap.
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024);
  CLI::App app{
      "pipesgd: data-parallel training that hides gradient communication behind computation\n"
      "(D-Sync and Pipe-SGD over ring allreduce with in-ring compression)."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");

  TrainFlags train_flags;
  std::string train_method = "dsync";
  CLI::App* train = app.add_subcommand("train", "Train one method and report the timing breakdown");
  train->add_option("--algo", train_method,
                    "Method: dsync | pipe, optionally +codec (e.g. pipe+int8)")
      ->capture_default_str();
  add_train_flags(*train, train_flags);

  TrainFlags compare_flags;
  std::string compare_methods = "dsync,pipe,pipe+int8";
  CLI::App* compare = app.add_subcommand("compare", "Train several methods one after another; one table");
  compare->add_option("--algos", compare_methods,
                      "Comma-separated methods, each name[+codec], e.g. dsync,pipe,pipe+int8")
      ->capture_default_str();
  add_train_flags(*compare, compare_flags);

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  CLI::App* bench_allreduce = bench->add_subcommand("allreduce", "Allreduce time, algbw and busbw per size and codec");
  int bench_workers = 4, bench_repeats = 10, bench_warmup = 2;
  double bench_timeout = 120;
  std::string bench_network = "none", bench_codecs = "none,bf16,int8", bench_sizes, bench_out;
  std::string bench_segments = "auto";
  bench_allreduce->add_option("--workers", bench_workers, "Ranks (threads)")->capture_default_str();
  bench_allreduce->add_option("--net", bench_network, "Emulated network (as for train)")->capture_default_str();
  bench_allreduce->add_option("--codecs", bench_codecs, "Comma-separated codecs")->capture_default_str();
  bench_allreduce->add_option("--sizes", bench_sizes, "Comma-separated sizes, e.g. 4K,1M,64M [default: 4K..64M x4]");
  bench_allreduce->add_option("--repeats", bench_repeats, "Timed runs per size and codec")->capture_default_str();
  bench_allreduce->add_option("--warmup", bench_warmup, "Untimed runs first")->capture_default_str();
  bench_allreduce->add_option("--comm-timeout", bench_timeout, "Seconds per wait")->capture_default_str();
  bench_allreduce->add_option("--segment-bytes", bench_segments,
                              "Message segment size: auto (= 256K), none (unsegmented) or a size")
      ->capture_default_str();
  bench_allreduce->add_option("--out", bench_out, "Write allreduce.json here");

  if (argc > 1 && argv[1][0] != '-') {
    const std::string command = argv[1];
    if (command != "train" && command != "compare" && command != "bench") {
      std::fprintf(stderr, "pipesgd: error: unknown command '%s' (expected train, compare or bench; see --help)\n",
                   command.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "pipesgd: error: %s (see --help)\n", error.what());
    return 2;
  }

  try {
    init_torch_runtime(1);
    if (train->parsed()) return run_train(train_flags, train_method);
    if (compare->parsed()) return run_compare(compare_flags, compare_methods);
    if (bench_allreduce->parsed()) {
      return run_bench_allreduce(bench_workers, bench_network, bench_codecs, bench_sizes, bench_repeats,
                                 bench_warmup, bench_timeout, bench_segments, bench_out);
    }
  } catch (const UsageError& error) {
    std::fprintf(stderr, "pipesgd: error: %s\n", error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pipesgd: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
