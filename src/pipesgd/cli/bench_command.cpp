// `pipesgd bench allreduce` (time, algbw, busbw per algorithm, size and codec) and `pipesgd
// calibrate` (the cost model's fit from the same measurement).
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "pipesgd/cli/commands.h"
#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/timeout.h"
#include "pipesgd/core/json_file.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/mpi/mpi_library_allreduce.h"
#include "pipesgd/timing/allreduce_cost_model.h"
#include "pipesgd/tools/allreduce_benchmark.h"
#include "pipesgd/train/run_config.h"

namespace pipesgd {
namespace {

// Flags of `bench allreduce` and `calibrate`.
struct BenchFlags {
  int workers = 4;
  std::string transport = "local";
  std::string network = "none";
  std::string algorithms = "all";
  std::string codecs = "none,bf16,int8";
  std::string sizes;
  int repeats = 10;
  int warmup = 2;
  double timeout_seconds = 120;
  std::string segment_bytes = "auto";
  std::string calibration_file;
  std::string out;
  bool quiet = false;
  CLI::App* command = nullptr;
};

void add_bench_flags(CLI::App& command, BenchFlags& flags, bool calibrate) {
  flags.command = &command;
  command.add_option("--workers", flags.workers, "Ranks (threads; under --transport mpi: mpirun -np)")
      ->capture_default_str();
  command.add_option("--transport", flags.transport, "local (threads of this process) or mpi")->capture_default_str();
  command.add_option("--net", flags.network, "Emulated network (local transport, as for train)")->capture_default_str();
  command.add_option("--algos", flags.algorithms,
                     concat("Comma-separated algorithms: ", join(allreduce_algorithm_names()), ", or all"))
      ->capture_default_str();
  if (!calibrate) {
    command.add_option("--codecs", flags.codecs, "Comma-separated codecs")->capture_default_str();
    command.add_option("--calibration", flags.calibration_file,
                       "Calibration JSON for the `auto` rows [default: the built-in model]");
  }
  command.add_option("--sizes", flags.sizes, "Comma-separated sizes, e.g. 4K,1M,64M [default: 4K..64M x4]");
  command.add_option("--repeats", flags.repeats, "Timed runs per size and algorithm")->capture_default_str();
  command.add_option("--warmup", flags.warmup, "Untimed runs first (0: none)")->capture_default_str();
  command.add_option("--comm-timeout", flags.timeout_seconds, "Seconds per wait")->capture_default_str();
  command.add_option("--segment-bytes", flags.segment_bytes,
                     "Ring and tree message segments: auto (= 256K), none (unsegmented) or a size")
      ->capture_default_str();
  command.add_option("--out", flags.out,
                     calibrate ? "Directory to write calibration.json to [default: the current directory]"
                               : "Directory to write allreduce.json to");
  command.add_flag("--quiet", flags.quiet, "No progress output on stderr (a line per size as it is measured)");
}

struct BenchSetup {
  std::vector<AllreduceCandidate> candidates;
  AllreduceBenchmarkConfig config;
  NetworkSpec network;
  int workers = 0;
  std::size_t segment_bytes = kDefaultSegmentBytes;
  std::vector<std::string> algorithms;
};

BenchSetup make_bench_setup(const BenchFlags& flags, const std::vector<std::string>& codecs, MpiSession* session) {
  BenchSetup setup;
  setup.segment_bytes = parse_segment_bytes(flags.segment_bytes, "--segment-bytes");
  if (setup.segment_bytes == kAutoSegmentBytes) setup.segment_bytes = kDefaultSegmentBytes;
  setup.network = parse_network_spec(flags.network, "--net");
  if (session != nullptr && setup.network.emulated()) {
    throw UsageError("--net emulates links between threads of one process; drop it under --transport mpi");
  }
  setup.workers = resolve_workers(flags.workers, flags.command->count("--workers") > 0, session);
  if (setup.workers < 1 || setup.workers > kMaxWorkers) {
    throw UsageError(concat("--workers must be in [1, ", kMaxWorkers, "], got ", setup.workers));
  }
  const std::vector<std::string> known = allreduce_algorithm_names();
  setup.algorithms = flags.algorithms == "all" ? known : split_list(flags.algorithms);
  for (const auto& algorithm : setup.algorithms) {
    if (std::find(known.begin(), known.end(), algorithm) == known.end()) {
      throw UsageError(concat("--algos '", algorithm, "': expected ", join(known)));
    }
  }
  for (const auto& codec : codecs) make_codec(codec);
  if (!flags.sizes.empty()) setup.config.sizes_bytes = parse_sizes(flags.sizes);
  if (flags.repeats < 1) throw UsageError(concat("--repeats must be >= 1, got ", flags.repeats));
  if (flags.warmup < 0) throw UsageError(concat("--warmup must be >= 0, got ", flags.warmup));
  setup.config.repeats = flags.repeats;
  setup.config.warmup = flags.warmup;
  setup.config.timeout = timeout_from_seconds(flags.timeout_seconds, "--comm-timeout");
  AllreduceOptions options;
  options.timeout = setup.config.timeout;
  options.segment_bytes = setup.segment_bytes;
  setup.candidates = our_allreduce_candidates(setup.algorithms, codecs, options);
  if (session != nullptr) {
    AllreduceCandidate library;
    library.algorithm = "MPI_Allreduce";
    library.codec = "none";
    library.is_reference = true;
    MpiRuntime* runtime = &session->runtime;
    library.build = [runtime](Transport&, std::size_t, const Codec&) -> std::unique_ptr<Allreduce> {
      return std::make_unique<MpiLibraryAllreduce>(*runtime);
    };
    setup.candidates.insert(setup.candidates.begin(), std::move(library));
  }
  return setup;
}

std::vector<AllreduceBenchmarkRow> run_benchmark(const BenchSetup& setup, MpiSession* session,
                                                 const std::function<void(const AllreduceBenchmarkRow&)>& on_row) {
  if (session != nullptr) {
    MpiTransport& transport = session->transport;
    // A real barrier, not through the transport being measured; each rank times from its own exit.
    const BenchmarkBarrier barrier = [&transport](Timeout timeout) {
      transport.barrier(timeout, "allreduce benchmark");
      return Clock::now();
    };
    return run_allreduce_benchmark_rank(transport, barrier, setup.candidates, setup.config, on_row);
  }
  return run_local_allreduce_benchmark(setup.workers, setup.network, setup.candidates, setup.config, on_row);
}

std::string describe_bench_transport(const BenchSetup& setup, const MpiSession* session) {
  if (session != nullptr) return session->transport.describe();
  return concat("LocalTransport, ", setup.workers, " ranks as threads, ", describe(setup.network));
}

nlohmann::json row_json(const AllreduceBenchmarkRow& row, const std::string& segments) {
  return {{"algorithm", row.algorithm},
          {"codec", row.codec},
          {"ranks", row.workers},
          {"segments", segments},
          {"bytes", row.bytes},
          {"time_s", row.median_seconds},
          {"min_time_s", row.min_seconds},
          {"max_time_s", row.max_seconds},
          {"algbw_bytes_per_s", row.algbw},
          {"busbw_bytes_per_s", row.busbw},
          {"cpu_ns_per_byte", row.cpu_seconds_per_byte * 1e9},
          {"max_error", row.max_error},
          {"error_bound", row.error_bound},
          {"matches_reference", row.matches_reference},
          {"correct", row.correct}};
}

int run_bench_allreduce(const BenchFlags& flags, MpiSession* session) {
  const std::vector<std::string> codecs = split_list(flags.codecs);
  const BenchSetup setup = make_bench_setup(flags, codecs, session);
  const Calibration calibration = flags.calibration_file.empty()
                                      ? Calibration{"built-in model", setup.workers, default_link_parameters(), {}, {}}
                                      : load_calibration(flags.calibration_file);
  const bool leader = prints_results(session);
  if (leader) prepare_output_directory(flags.out);
  const std::string segments = describe_segment_bytes(setup.segment_bytes);
  if (leader) {
    std::printf("pipesgd bench allreduce: %s, ring/tree segments %s, median of %d interleaved runs\n",
                describe_bench_transport(setup, session).c_str(), segments.c_str(), flags.repeats);
    std::printf("auto = the algorithm the cost model picks per size (%s)\n\n",
                flags.calibration_file.empty() ? "built-in model" : flags.calibration_file.c_str());
    std::printf("CPU ns/B = the CPU time of the thread that runs the allreduce (its CPU clock) per fp32 byte\n\n");
    std::printf("%-26s %-6s %10s %11s %10s %10s %9s %9s %7s\n", "algorithm", "codec", "bytes", "time (us)", "algbw GB/s",
                "busbw GB/s", "CPU ns/B", "vs MPI", "check");
    std::fflush(stdout);
  }
  nlohmann::json rows = nlohmann::json::array();
  bool all_correct = true;
  std::vector<AllreduceBenchmarkRow> size_rows;  // rows of the size being measured
  auto print_row = [&](const AllreduceBenchmarkRow& row, const std::string& label, double reference_busbw) {
    const std::string ratio =
        reference_busbw > 0 ? concat(std::fixed, std::setprecision(2), row.busbw / reference_busbw, "x") : std::string("-");
    std::printf("%-26s %-6s %10zu %11.1f %10.3f %10.3f %9.3f %9s %7s\n", label.c_str(), row.codec.c_str(), row.bytes,
                row.median_seconds * 1e6, row.algbw / 1e9, row.busbw / 1e9, row.cpu_seconds_per_byte * 1e9,
                ratio.c_str(), row.correct ? "ok" : "WRONG");
  };
  const std::size_t size_count = (setup.config.sizes_bytes.empty() ? default_benchmark_sizes() : setup.config.sizes_bytes).size();
  std::size_t sizes_done = 0;
  auto flush_size = [&] {
    if (size_rows.empty()) return;
    if (!flags.quiet) {
      std::fprintf(stderr, "  measured %zu bytes (%zu of %zu sizes)\n", size_rows[0].bytes, ++sizes_done, size_count);
    }
    double reference_busbw = 0;
    for (const auto& row : size_rows) {
      if (row.algorithm == "MPI_Allreduce") reference_busbw = row.busbw;
    }
    for (const auto& row : size_rows) {
      print_row(row, row.algorithm, reference_busbw);
      nlohmann::json json = row_json(row, segments);
      if (reference_busbw > 0) json["busbw_vs_mpi_allreduce"] = row.busbw / reference_busbw;
      rows.push_back(json);
    }
    // auto: per codec, the row of the algorithm the model picks for this size.
    const std::string chosen =
        choose_allreduce_algorithm(calibration, setup.workers, static_cast<double>(size_rows[0].bytes), setup.algorithms);
    for (const auto& codec : codecs) {
      for (const auto& row : size_rows) {
        if (row.codec != codec || row.algorithm != chosen) continue;
        AllreduceBenchmarkRow picked = row;
        picked.algorithm = "auto";
        print_row(picked, concat("auto (", chosen, ")"), reference_busbw);
        nlohmann::json json = row_json(picked, segments);
        json["chosen"] = chosen;
        if (reference_busbw > 0) json["busbw_vs_mpi_allreduce"] = row.busbw / reference_busbw;
        rows.push_back(json);
      }
    }
    std::fflush(stdout);
    size_rows.clear();
  };
  run_benchmark(setup, session, [&](const AllreduceBenchmarkRow& row) {
    all_correct &= row.correct;
    if (!size_rows.empty() && size_rows[0].bytes != row.bytes) flush_size();
    size_rows.push_back(row);
    if (size_rows.size() == setup.candidates.size()) flush_size();
  });
  if (!leader) return 0;
  flush_size();
  if (!flags.out.empty()) {
    write_json_file(std::filesystem::path(flags.out) / "allreduce.json", rows, "benchmark");
    std::printf("\nwrote %s/allreduce.json\n", flags.out.c_str());
  }
  if (!all_correct) {
    std::fprintf(stderr, "pipesgd: error: an allreduce result was wrong or outside its bound\n");
    return 1;
  }
  return 0;
}

// `pipesgd calibrate`: times every algorithm (codec none) over the sizes on the live transport, fits
// the link parameters and each algorithm's a + b*M, prints fit and residuals, saves the JSON.
int run_calibrate(const BenchFlags& flags, MpiSession* session) {
  const BenchSetup setup = make_bench_setup(flags, {"none"}, session);
  // Everything the fit needs, checked before measuring: two ranks, two sizes (each algorithm's
  // a + b*M), three timings (alpha, beta, gamma).
  if (setup.workers < 2) throw UsageError("calibrate needs at least 2 ranks (--workers or mpirun -np)");
  const std::vector<std::size_t> sizes =
      setup.config.sizes_bytes.empty() ? default_benchmark_sizes() : setup.config.sizes_bytes;
  const std::size_t distinct_sizes = std::set<std::size_t>(sizes.begin(), sizes.end()).size();
  if (distinct_sizes < 2 || distinct_sizes * setup.algorithms.size() < 3) {
    throw UsageError(concat("--sizes: calibrate fits each algorithm's a + b*M and the link's alpha, beta, gamma: it "
                            "needs at least 2 sizes and 3 timings (sizes x algorithms), got ",
                            distinct_sizes, " size(s) x ", setup.algorithms.size(), " algorithm(s)"));
  }
  const bool leader = prints_results(session);
  const std::filesystem::path path = std::filesystem::path(flags.out.empty() ? "." : flags.out) / "calibration.json";
  if (leader) prepare_output_directory(flags.out);
  if (leader) {
    std::printf("pipesgd calibrate: %s, algorithms", describe_bench_transport(setup, session).c_str());
    for (const auto& algorithm : setup.algorithms) std::printf(" %s", algorithm.c_str());
    std::printf(", median of %d interleaved runs per size\n", flags.repeats);
    std::fflush(stdout);
  }
  std::vector<TimingSample> samples;
  run_benchmark(setup, session, [&](const AllreduceBenchmarkRow& row) {
    if (!row.correct) throw CommError(concat(row.algorithm, " gave a wrong result at ", row.bytes, " bytes"));
    if (row.algorithm == "MPI_Allreduce") return;
    samples.push_back({row.algorithm, row.workers, static_cast<double>(row.bytes), row.median_seconds});
    if (!flags.quiet) {
      std::fprintf(stderr, "  measured %-20s %10zu bytes  %10.1f us\n", row.algorithm.c_str(), row.bytes,
                   row.median_seconds * 1e6);
    }
  });
  if (!leader) return 0;
  Calibration calibration;
  calibration.transport = session != nullptr ? std::string("mpi") : concat("local ", setup.network.name);
  calibration.world_size = setup.workers;
  calibration.samples = samples;
  const LinkFit fit = fit_link_parameters(samples);
  calibration.link = fit.link;
  std::printf("\nfitted link model (least squares of relative error over all %zu timings):\n", samples.size());
  std::printf("  alpha = %.3f us per message, beta = %.4f ns per byte (%.2f GB/s), gamma = %.4f ns per "
              "byte reduced; rms relative residual %.1f%%\n",
              fit.link.alpha * 1e6, fit.link.beta * 1e9, fit.link.beta > 0 ? 1e-9 / fit.link.beta : 0.0,
              fit.link.gamma * 1e9, fit.rms_relative_residual * 100);
  if (!fit.unique) std::printf("  note: %s\n", fit.ambiguity.c_str());
  std::printf("\nper algorithm, T(M) = a + b*M fitted to its own timings:\n");
  std::printf("%-20s %12s %14s %14s %12s\n", "algorithm", "a (us)", "b (ns/byte)", "Table II a (us)", "Table II b");
  for (const auto& algorithm : setup.algorithms) {
    std::vector<TimingSample> own;
    for (const auto& sample : samples) {
      if (sample.algorithm == algorithm) own.push_back(sample);
    }
    const LinearCost measured = fit_linear_cost(own);
    calibration.measured[algorithm] = measured;
    const LinearCost model = allreduce_cost(algorithm, setup.workers, fit.link);
    std::printf("%-20s %12.2f %14.4f %14.2f %12.4f\n", algorithm.c_str(), measured.a * 1e6, measured.b * 1e9,
                model.a * 1e6, model.b * 1e9);
  }
  std::printf("\npredicted vs measured:\n%-20s %10s %12s %14s %12s %14s\n", "algorithm", "bytes", "measured us",
              "link model us", "residual", "own a+bM us");
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& sample = samples[i];
    std::printf("%-20s %10.0f %12.1f %14.1f %11.1f%% %14.1f\n", sample.algorithm.c_str(), sample.bytes,
                sample.seconds * 1e6, fit.predicted_seconds[i] * 1e6, fit.relative_residuals[i] * 100,
                calibration.measured[sample.algorithm].time(sample.bytes) * 1e6);
  }
  std::printf("\n--allreduce auto picks:");
  for (std::size_t bytes : sizes) {
    std::printf(" %zu B: %s;", bytes,
                choose_allreduce_algorithm(calibration, setup.workers, static_cast<double>(bytes), setup.algorithms)
                    .c_str());
  }
  save_calibration(calibration, path.string());
  std::printf("\nwrote %s\n", path.string().c_str());
  return 0;
}

}  // namespace

Subcommand add_bench_allreduce_command(CLI::App& bench) {
  auto flags = std::make_shared<BenchFlags>();
  Subcommand command;
  command.command = bench.add_subcommand(
      "allreduce", "Allreduce time, algbw, busbw per algorithm, size and codec (interleaved runs)");
  add_bench_flags(*command.command, *flags, false);
  command.transport = [flags] { return flags->transport; };
  command.run = [flags](MpiSession* session) { return run_bench_allreduce(*flags, session); };
  return command;
}

Subcommand add_calibrate_command(CLI::App& app) {
  auto flags = std::make_shared<BenchFlags>();
  flags->repeats = 7;
  Subcommand command;
  command.command = app.add_subcommand(
      "calibrate", "Measure allreduce times, fit the cost model (alpha, beta, gamma; a, b per algorithm)");
  add_bench_flags(*command.command, *flags, true);
  command.transport = [flags] { return flags->transport; };
  command.run = [flags](MpiSession* session) { return run_calibrate(*flags, session); };
  return command;
}

}  // namespace pipesgd
