#include "pipesgd/train/allreduce_benchmark.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <thread>

#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// Rank r's element i: multiples of 1/4 in [-2, 2], so fp32 sums are exact in any order.
float test_value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 13) % 17) - 8) *
         0.25f;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

std::vector<std::size_t> default_benchmark_sizes() {
  std::vector<std::size_t> sizes;
  for (std::size_t bytes = 4096; bytes <= (std::size_t{64} << 20); bytes *= 4) sizes.push_back(bytes);
  return sizes;
}

std::vector<std::size_t> parse_sizes(const std::string& text) {
  std::vector<std::size_t> sizes;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t comma = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, comma - begin);
    char* end = nullptr;
    const double number = std::strtod(item.c_str(), &end);
    std::string unit(end ? end : "");
    double scale = 1;
    if (unit == "K" || unit == "k" || unit == "KiB") scale = 1024;
    else if (unit == "M" || unit == "m" || unit == "MiB") scale = 1024.0 * 1024;
    else if (unit == "G" || unit == "g" || unit == "GiB") scale = 1024.0 * 1024 * 1024;
    else if (!unit.empty() && unit != "B") {
      throw UsageError(concat("--sizes: '", item, "' has unknown unit '", unit, "' (use K, M or G)"));
    }
    if (end == item.c_str() || !(number > 0) || !std::isfinite(number)) {
      throw UsageError(concat("--sizes: '", item, "' is not a positive size like 4K or 1M"));
    }
    const auto bytes = static_cast<std::size_t>(number * scale);
    if (bytes % 4 != 0 || bytes > (std::size_t{1} << 32)) {
      throw UsageError(concat("--sizes: ", item, " must be a multiple of 4 bytes and at most 4G"));
    }
    sizes.push_back(bytes);
    begin = comma + 1;
  }
  return sizes;
}

std::vector<AllreduceBenchmarkRow> run_allreduce_benchmark(
    const AllreduceBenchmarkConfig& config,
    const std::function<void(const AllreduceBenchmarkRow&)>& on_row) {
  if (config.workers < 1) throw UsageError(concat("--workers must be >= 1, got ", config.workers));
  if (config.repeats < 1) throw UsageError(concat("--repeats must be >= 1, got ", config.repeats));
  if (config.warmup < 0) throw UsageError(concat("--warmup must be >= 0, got ", config.warmup));
  std::vector<std::unique_ptr<Codec>> codecs;
  for (const std::string& name : config.codecs) codecs.push_back(make_codec(name));
  const std::vector<std::size_t> sizes =
      config.sizes_bytes.empty() ? default_benchmark_sizes() : config.sizes_bytes;
  const int p = config.workers;

  std::vector<AllreduceBenchmarkRow> rows;
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    for (const auto& codec : codecs) {
      LocalFabric fabric(p, config.network);
      const int runs = config.warmup + config.repeats;
      std::vector<std::vector<double>> seconds(p, std::vector<double>(runs));
      std::vector<double> max_error(p, 0);
      std::vector<std::vector<float>> results(p);
      std::vector<std::exception_ptr> failures(p);
      std::vector<std::thread> threads;
      for (int rank = 0; rank < p; ++rank) {
        threads.emplace_back([&, rank] {
          Transport& transport = fabric.endpoint(rank);
          try {
            AllreduceOptions options;
            options.timeout = config.timeout;
            options.segment_bytes = config.segment_bytes;
            RingAllreduce allreduce(transport, count, *codec, options);
            auto none = make_codec("none");
            RingAllreduce barrier(transport, 1, *none, options);
            std::vector<float> data(count);
            // test_value(r, i) depends on i only through i % 17: the exact sums repeat.
            double exact_sum[17];
            for (std::size_t i = 0; i < 17; ++i) {
              exact_sum[i] = 0;
              for (int r = 0; r < p; ++r) exact_sum[i] += test_value(r, i);
            }
            for (int run = 0; run < runs; ++run) {
              for (std::size_t i = 0; i < count; ++i) data[i] = test_value(rank, i);
              float token = 0;
              barrier.run(std::span<float>(&token, 1), (Tag{1} << 36) + run);
              Stopwatch timer;
              allreduce.run(data, static_cast<Tag>(run));
              seconds[rank][run] = timer.seconds();
              for (std::size_t i = 0; i < count; ++i) {
                const double error = std::fabs(static_cast<double>(data[i]) - exact_sum[i % 17]);
                max_error[rank] = std::max(max_error[rank], std::isnan(error) ? INFINITY : error);
              }
            }
            results[rank] = std::move(data);
          } catch (const std::exception& error) {
            failures[rank] = std::current_exception();
            transport.report_failure(error.what());
          }
        });
      }
      for (auto& thread : threads) thread.join();
      for (const auto& failure : failures) {
        if (failure) std::rethrow_exception(failure);
      }

      AllreduceBenchmarkRow row;
      row.algorithm = "ring";
      row.codec = std::string(codec->name());
      row.workers = p;
      row.bytes = bytes;
      std::vector<double> per_run;  // slowest rank of each timed run
      for (int run = config.warmup; run < runs; ++run) {
        double slowest = 0;
        for (int rank = 0; rank < p; ++rank) slowest = std::max(slowest, seconds[rank][run]);
        per_run.push_back(slowest);
      }
      row.median_seconds = median(per_run);
      row.min_seconds = *std::min_element(per_run.begin(), per_run.end());
      row.max_seconds = *std::max_element(per_run.begin(), per_run.end());
      row.algbw = row.median_seconds > 0 ? static_cast<double>(bytes) / row.median_seconds : 0;
      row.busbw = row.algbw * (p > 1 ? 2.0 * (p - 1) / p : 0.0);
      row.max_error = *std::max_element(max_error.begin(), max_error.end());
      // Each of the p-1 reduce-scatter steps and the final encoding may add the codec's error of the
      // largest partial sum (at most p * 2 in magnitude).
      row.error_bound = p * codec->error_bound(2.0 * p);
      bool identical = true;
      for (int rank = 1; rank < p; ++rank) {
        identical &= results[rank].size() == results[0].size() &&
                     (count == 0 || std::memcmp(results[rank].data(), results[0].data(),
                                                count * sizeof(float)) == 0);
      }
      row.correct = identical && row.max_error <= row.error_bound;
      if (on_row) on_row(row);
      rows.push_back(row);
    }
  }
  return rows;
}

}  // namespace pipesgd
