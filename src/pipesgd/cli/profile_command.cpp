// `pipesgd profile`: measures a model's profile on this machine (per-layer forward and backward
// times, parameter counts, data and update times, the codecs' per-byte costs; tools/model_profiling.h)
// and writes it as the JSON file `pipesgd simulate` reads (timing/model_profile.h).
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "pipesgd/cli/commands.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/tools/model_profiling.h"

namespace pipesgd {
namespace {

struct ProfileFlags {
  std::string model = "mlp";
  std::string loss = "cross-entropy";
  std::string data = "fashion-mnist";
  std::string data_dir;
  std::int64_t batch = 25;
  std::int64_t seed = 1;
  std::int64_t iterations = kDefaultProfilingIterations;
  int workers = 1;
  bool in_run = false;
  std::string network = "none";
  std::string out;
  bool quiet = false;
};

// Progress on stderr while it measures, one plain line at most every few seconds.
constexpr double kProgressIntervalSeconds = 5;

void add_profile_flags(CLI::App& command, ProfileFlags& flags) {
  command.add_option("--model", flags.model, kModelFlagHelp)->capture_default_str();
  command.add_option("--loss", flags.loss, kLossFlagHelp)->capture_default_str();
  command.add_option("--data", flags.data, kDataFlagHelp)->capture_default_str();
  command.add_option("--data-dir", flags.data_dir, data_dir_flag_help());
  command.add_option("--batch", flags.batch, "Examples per iteration: the per-worker batch the profile's times are for")
      ->capture_default_str();
  command.add_option("--seed", flags.seed, "Seed of the model initialisation and data order")->capture_default_str();
  command.add_option("--iters", flags.iterations,
                     concat("Measured iterations (1 to ", kMaxIterations, "), after ", kProfilingWarmupIterations,
                            " untimed warm-up ones; every time is their median"))
      ->capture_default_str();
  command.add_option("--workers", flags.workers,
                     "Replicas measured at once, each on its own thread, as a run's workers compute side by side on "
                     "this machine (the mean of their figures); 1: one model alone")
      ->capture_default_str();
  command.add_flag("--in-run", flags.in_run,
                   "Also run --workers workers of a synchronous training run (D-Sync, threads, links emulated by --net) "
                   "and take each layer's backward, the forward and the update from it: the compute as a run's "
                   "workers do it while they communicate (needs --workers >= 2)");
  command.add_option("--net", flags.network,
                     "--in-run's network: none, 1gbe, 10gbe, 25gbe, 100gbe or bw=1Gbit,lat=200us")
      ->capture_default_str();
  command.add_option("--out", flags.out, "Profile JSON file to write (the input of `pipesgd simulate --profile`)")
      ->required();
  command.add_flag("--quiet", flags.quiet, "No progress output");
}

// --out names a file: its directory is created if needed and must be writable, before any work.
void prepare_output_file(const std::string& out) {
  const std::filesystem::path path(out);
  if (out.empty() || !path.has_filename()) {
    throw UsageError(concat("--out '", out, "': give a file name, e.g. prof.json"));
  }
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw UsageError(
        concat("--out '", out, "' is a directory; give a file name, e.g. ", (path / "prof.json").string()));
  }
  ensure_writable_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."), "--out");
}

std::string nanoseconds(double seconds) { return format_number("%.3f", seconds * 1e9); }

int run_profile(const ProfileFlags& flags) {
  if (flags.iterations < 1 || flags.iterations > kMaxIterations) {
    throw UsageError(concat("--iters must be in [1, ", kMaxIterations, "], got ", flags.iterations));
  }
  if (flags.batch < 1 || flags.batch > static_cast<std::int64_t>(kMaxBatch)) {
    throw UsageError(concat("--batch must be in [1, ", kMaxBatch, "], got ", flags.batch));
  }
  if (flags.seed < 0) throw UsageError(concat("--seed must be >= 0, got ", flags.seed));
  if (flags.workers < 1 || flags.workers > 256) throw UsageError(concat("--workers must be in [1, 256], got ", flags.workers));
  std::optional<InRunProfiling> in_run;
  if (flags.in_run) {
    if (flags.workers < 2) throw UsageError("--in-run needs --workers >= 2 (a run of one worker does not communicate)");
    in_run = InRunProfiling{layer_wise_profiling_config({}, flags.iterations, flags.workers, flags.model, flags.batch,
                                                        flags.seed, parse_network_spec(flags.network, "--net")),
                            {}};
  } else if (flags.network != "none") {
    throw UsageError("--net is --in-run's network; add --in-run");
  }
  check_model_flags(flags.model, flags.loss);
  prepare_output_file(flags.out);
  const DataSplits data = load_data_set(flags.data, flags.data_dir, flags.seed);
  check_data_fits_builtin_model(flags.model, data, flags.data);
  if (static_cast<std::size_t>(flags.batch) > data.train.size) {
    throw UsageError(concat("--batch ", flags.batch, " is larger than the training set (", data.train.size,
                            " examples of --data ", flags.data, ")"));
  }
  const ModelFactory factory = make_model_factory(flags.model, flags.loss, data.train);
  if (in_run) in_run->factory = factory;
  std::vector<std::unique_ptr<Model>> replicas;
  std::vector<Model*> models;
  for (int r = 0; r < flags.workers; ++r) {
    replicas.push_back(factory(static_cast<std::uint64_t>(flags.seed)));
    models.push_back(replicas.back().get());
  }
  const Model* model = models.front();

  ProfilingOptions options;
  options.model = flags.model;
  options.batch = static_cast<std::size_t>(flags.batch);
  options.iterations = flags.iterations;
  options.seed = static_cast<std::uint64_t>(flags.seed);
  Stopwatch elapsed;
  double next_line = kProgressIntervalSeconds;
  if (!flags.quiet) {
    std::cerr << "profiling " << flags.model << " (" << model->layout().segment_count() << " layers, "
              << model->layout().total() << " parameters): " << options.warmup_iterations << " warm-up + "
              << options.iterations << " measured iterations of batch " << flags.batch
              << (flags.workers == 1 ? std::string(" on 1 thread") : concat(" on ", flags.workers, " replicas at once, 1 thread each"))
              << ", then "
              << join(codec_names()) << " and the methods' own work (SAPipe's compensations)" << std::endl;
    options.progress = [&](const std::string& phase, std::int64_t done, std::int64_t total) {
      if (phase == "run") {
        std::cerr << "profile: running " << flags.workers << " workers of D-Sync over network "
                  << describe(in_run->config.network) << " for " << total << " iterations ("
                  << format_number("%.1f", elapsed.seconds()) << " s)" << std::endl;
        return;
      }
      if (elapsed.seconds() < next_line) return;
      next_line = elapsed.seconds() + kProgressIntervalSeconds;
      if (phase == "codecs") {
        std::cerr << "profile: timing the codecs and the methods' own work (" << format_number("%.1f", elapsed.seconds()) << " s)" << std::endl;
      } else {
        std::cerr << "profile: iteration " << done << " of " << total << " ("
                  << format_number("%.1f", elapsed.seconds()) << " s)" << std::endl;
      }
    };
  }
  const MeasuredProfile measured = profile_model(models, data, options, in_run);
  const ModelProfile& profile = measured.profile;
  save_model_profile(profile, flags.out);

  std::cout << "pipesgd profile: " << flags.model << ", batch " << profile.batch << ", medians of " << flags.iterations
            << " iterations (" << (flags.workers == 1 ? std::string("1 thread") : concat(flags.workers, " replicas at once, their mean"))
            << ")" << (in_run ? concat("; backward, forward and update: means of a ", flags.workers, "-worker D-Sync run")
                              : std::string())
            << "\n";
  print_table(std::cout, {{"layers", "parameters", "forward ms", "backward ms", "update ms", "data ms"},
                          {concat(profile.layers.size()), concat(profile.parameters()),
                           milliseconds(profile.forward_seconds()), milliseconds(profile.backward_seconds()),
                           milliseconds(profile.update_seconds), milliseconds(profile.data_seconds)}});
  if (!measured.forward_from_hooks) {
    std::cout << "(the model reports no forward progress: per-layer forward times are the whole forward split by "
                 "the layers' backward times)\n";
  }
  std::cout << "\n";
  std::vector<std::vector<std::string>> codec_rows = {
      {"codec", "encode ns/byte", "decode ns/byte", "decode_add ns/byte"}};
  for (const std::string& name : codec_names()) {
    const CodecCost cost = profile.codec_cost(name);
    codec_rows.push_back({name, nanoseconds(cost.encode), nanoseconds(cost.decode), nanoseconds(cost.decode_add)});
  }
  print_table(std::cout, codec_rows);
  std::cout << "(per fp32 byte of gradient; per-layer times in the file)\n";
  if (!profile.method_costs.empty()) {
    std::cout << "\n";
    std::vector<std::vector<std::string>> method_rows = {{"method work", "ns/parameter"}};
    for (const auto& [name, seconds] : profile.method_costs) method_rows.push_back({name, nanoseconds(seconds)});
    print_table(std::cout, method_rows);
  }
  std::cout << "wrote " << flags.out << "\n";
  return 0;
}

}  // namespace

Subcommand add_profile_command(CLI::App& app) {
  auto flags = std::make_shared<ProfileFlags>();
  Subcommand profile;
  profile.command = app.add_subcommand(
      "profile", "Measures a model's per-layer forward and backward times, parameters and codec costs here: "
                 "the profile `pipesgd simulate` reads");
  add_profile_flags(*profile.command, *flags);
  profile.run = [flags](MpiSession*) { return run_profile(*flags); };
  return profile;
}

}  // namespace pipesgd
