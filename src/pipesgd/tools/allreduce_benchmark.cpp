#include "pipesgd/tools/allreduce_benchmark.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/collective/ring_allreduce.h"  // step_tag
#include "pipesgd/comm/local_transport.h"
#include "pipesgd/comm/rank_failures.h"
#include "pipesgd/comm/wait.h"  // the waits' errors and rank_failure_message
#include "pipesgd/core/checksum.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

constexpr const char* kOperation = "allreduce benchmark";

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

// Largest |a[i] - b[i]| (infinity if any is NaN).
double max_difference(std::span<const float> a, std::span<const float> b) {
  float largest = 0;
  bool nan = false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float difference = std::fabs(a[i] - b[i]);
    nan |= difference != difference;
    largest = std::max(largest, difference);
  }
  return nan ? INFINITY : largest;
}

// What one rank measured for one candidate at one size; sent to rank 0 as raw bytes.
struct RankMeasurement {
  double timed_cpu_seconds = 0;  // this rank's CPU clock over the timed runs
  double max_error = 0;
  double max_reference_difference = 0;
  std::uint64_t result_checksum = 0;
};

// The BenchmarkBarrier of ranks that are threads of one process: the last rank to arrive records the
// start every rank of that run is timed from. Waiting sleeps, so ranks that arrived early leave the
// cores to those still running. Thread-safe: each rank's benchmark thread calls arrive_and_wait.
class ThreadStartBarrier {
 public:
  explicit ThreadStartBarrier(int ranks) : ranks_(ranks) {}

  Clock::time_point arrive_and_wait(int rank, Timeout timeout) {
    std::unique_lock lock(mutex_);
    throw_if_abandoned(rank);
    const std::uint64_t generation = generation_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      ++generation_;
      start_ = Clock::now();
      all_arrived_.notify_all();
      return start_;
    }
    all_arrived_.wait_for(lock, timeout,
                          [&] { return generation_ != generation || !abandoned_reason_.empty(); });
    // start_ is still this barrier's: the next one cannot complete before this rank arrives there.
    if (generation_ != generation) return start_;
    throw_if_abandoned(rank);
    throw_wait_timed_out(concat(kOperation, ": barrier on rank ", rank), timeout, -1,
                         concat(" (", ranks_ - arrived_, " of ", ranks_, " ranks did not arrive)").c_str());
  }

  // A rank failed: fails every wait, now and later, with PeerFailedError naming it.
  void abandon(int rank, const std::string& reason) {
    std::lock_guard lock(mutex_);
    if (!abandoned_reason_.empty()) return;
    abandoned_reason_ = rank_failure_message(rank, reason);
    all_arrived_.notify_all();
  }

 private:
  void throw_if_abandoned(int rank) const {
    if (abandoned_reason_.empty()) return;
    throw_wait_aborted(concat(kOperation, ": barrier on rank ", rank), abandoned_reason_);
  }

  const int ranks_;
  std::mutex mutex_;
  std::condition_variable all_arrived_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;  // completed barriers
  Clock::time_point start_;       // of the last completed barrier
  std::string abandoned_reason_;
};

}  // namespace

std::vector<AllreduceCandidate> our_allreduce_candidates(const std::vector<std::string>& algorithms,
                                                         const std::vector<std::string>& codecs,
                                                         AllreduceOptions options) {
  std::vector<AllreduceCandidate> candidates;
  for (const std::string& codec : codecs) {
    make_codec(codec);  // validates the name
    for (const std::string& algorithm : algorithms) {
      AllreduceCandidate candidate;
      candidate.algorithm = algorithm;
      candidate.codec = codec;
      candidate.build = [algorithm, options](Transport& transport, std::size_t max_count,
                                             const Codec& codec_object) -> std::unique_ptr<Allreduce> {
        return make_allreduce(algorithm, transport, max_count, codec_object, options);
      };
      candidates.push_back(std::move(candidate));
    }
  }
  return candidates;
}

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
    if (bytes % 4 != 0 || bytes > (std::size_t{1} << 31)) {
      throw UsageError(concat("--sizes: ", item, " must be a multiple of 4 bytes and at most 2G"));
    }
    sizes.push_back(bytes);
    begin = comma + 1;
  }
  return sizes;
}

std::vector<AllreduceBenchmarkRow> run_allreduce_benchmark_rank(
    Transport& transport, const BenchmarkBarrier& barrier,
    const std::vector<AllreduceCandidate>& candidates, const AllreduceBenchmarkConfig& config,
    const std::function<void(const AllreduceBenchmarkRow&)>& on_row) {
  if (config.repeats < 1) throw UsageError(concat("--repeats must be >= 1, got ", config.repeats));
  if (config.warmup < 0) throw UsageError(concat("--warmup must be >= 0, got ", config.warmup));
  if (candidates.empty()) throw UsageError("nothing to benchmark");
  const int p = transport.size();
  const int rank = transport.rank();
  const std::vector<std::size_t> sizes =
      config.sizes_bytes.empty() ? default_benchmark_sizes() : config.sizes_bytes;
  std::vector<std::unique_ptr<Codec>> codecs;
  for (const auto& candidate : candidates) codecs.push_back(make_codec(candidate.codec));
  const std::size_t reference = static_cast<std::size_t>(
      std::find_if(candidates.begin(), candidates.end(), [](const auto& c) { return c.is_reference; }) -
      candidates.begin());
  const bool has_reference = reference < candidates.size();

  PIPESGD_ASSERT(barrier);
  std::uint64_t sequence = 0;  // of the benchmark channel: one per timed run and per gathering
  auto next_tag = [&] { return collective_tag(Channel::kBenchmark, sequence++); };

  // test_value(r, i) depends on i only through i % 17: the exact sums repeat.
  float exact_sum[17];
  for (std::size_t i = 0; i < 17; ++i) {
    double sum = 0;
    for (int r = 0; r < p; ++r) sum += test_value(r, i);
    exact_sum[i] = static_cast<float>(sum);  // exact: multiples of 1/4 of small magnitude
  }

  std::vector<AllreduceBenchmarkRow> rows;
  const int runs = config.warmup + config.repeats;
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<std::unique_ptr<Allreduce>> objects;
    for (std::size_t c = 0; c < candidates.size(); ++c) {
      objects.push_back(candidates[c].build(transport, count, *codecs[c]));
    }
    // Inputs and the exact result, computed once; a run only copies and compares them.
    std::vector<float> input(count), exact(count), data(count);
    for (std::size_t i = 0; i < count; ++i) {
      input[i] = test_value(rank, i);
      exact[i] = exact_sum[i % 17];
    }
    std::vector<float> reference_result(has_reference ? count : 0);
    // seconds[candidate][run] on this rank
    std::vector<std::vector<double>> seconds(candidates.size(), std::vector<double>(runs));
    std::vector<RankMeasurement> measured(candidates.size());
    std::vector<std::uint64_t> bytes_sent(candidates.size(), 0);  // over every run, barriers included
    for (int run = 0; run < runs; ++run) {
      // The reference runs first in every round, so the others can be compared with its result.
      for (std::size_t k = 0; k < candidates.size(); ++k) {
        const std::size_t c = has_reference ? (k == 0 ? reference : (k <= reference ? k - 1 : k)) : k;
        std::copy(input.begin(), input.end(), data.begin());
        const std::uint64_t sent_before = transport.bytes_sent();
        const Clock::time_point start = barrier(config.timeout);
        const double cpu_start = thread_cpu_seconds();
        objects[c]->run(data, next_tag());
        seconds[c][run] = seconds_since(start);
        if (run >= config.warmup) measured[c].timed_cpu_seconds += thread_cpu_seconds() - cpu_start;
        // Checking waits until every rank is done: a rank that finished early must not take CPU
        // from the ranks still in the timed operation (ranks may outnumber cores).
        barrier(config.timeout);
        bytes_sent[c] += transport.bytes_sent() - sent_before;
        RankMeasurement& m = measured[c];
        m.max_error = std::max(m.max_error, max_difference(data, exact));
        if (has_reference && c == reference) {
          std::copy(data.begin(), data.end(), reference_result.begin());
        } else if (has_reference) {
          m.max_reference_difference =
              std::max(m.max_reference_difference, max_difference(data, reference_result));
        }
        if (run == runs - 1) m.result_checksum = checksum_of(data);
      }
    }

    // Rank 0 gathers every rank's timings and measurements.
    const Tag gather_tag = next_tag();
    if (rank != 0) {
      std::vector<Request> sends;
      for (std::size_t c = 0; c < candidates.size(); ++c) {
        sends.push_back(transport.send(0, step_tag(gather_tag, 0, 2 * c),
                                       std::as_bytes(std::span(seconds[c])), kOperation));
        sends.push_back(transport.send(0, step_tag(gather_tag, 0, 2 * c + 1),
                                       std::as_bytes(std::span(&measured[c], 1)), kOperation));
      }
      for (Request& send : sends) send.wait(config.timeout);
      continue;
    }
    std::vector<double> peer_seconds(runs);
    for (std::size_t c = 0; c < candidates.size(); ++c) {
      std::vector<double> slowest = seconds[c];
      RankMeasurement all = measured[c];
      bool identical = true;
      for (int peer = 1; peer < p; ++peer) {
        RankMeasurement peer_measured;
        Request times = transport.recv(peer, step_tag(gather_tag, 0, 2 * c),
                                       std::as_writable_bytes(std::span(peer_seconds)), kOperation);
        Request others = transport.recv(peer, step_tag(gather_tag, 0, 2 * c + 1),
                                        std::as_writable_bytes(std::span(&peer_measured, 1)), kOperation);
        times.wait(config.timeout);
        others.wait(config.timeout);
        for (int run = 0; run < runs; ++run) slowest[run] = std::max(slowest[run], peer_seconds[run]);
        all.timed_cpu_seconds += peer_measured.timed_cpu_seconds;
        all.max_error = std::max(all.max_error, peer_measured.max_error);
        all.max_reference_difference =
            std::max(all.max_reference_difference, peer_measured.max_reference_difference);
        identical &= peer_measured.result_checksum == measured[c].result_checksum;
      }
      const std::vector<double> timed(slowest.begin() + config.warmup, slowest.end());
      AllreduceBenchmarkRow row;
      row.algorithm = candidates[c].algorithm;
      row.codec = candidates[c].codec;
      row.workers = p;
      row.bytes = bytes;
      row.median_seconds = median(timed);
      row.min_seconds = *std::min_element(timed.begin(), timed.end());
      row.max_seconds = *std::max_element(timed.begin(), timed.end());
      row.algbw = row.median_seconds > 0 ? static_cast<double>(bytes) / row.median_seconds : 0;
      row.busbw = row.algbw * (p > 1 ? 2.0 * (p - 1) / p : 0.0);
      row.max_error = all.max_error;
      row.cpu_seconds_per_byte =
          bytes > 0 ? all.timed_cpu_seconds / (static_cast<double>(p) * config.repeats * static_cast<double>(bytes)) : 0;
      row.rank0_bytes_sent_per_run = bytes_sent[c] / static_cast<std::uint64_t>(runs);
      // Each of up to p encodings may add the codec's error of a partial sum of at most 2p.
      row.error_bound = p * codecs[c]->error_bound(2.0 * p);
      // Exact codecs must reproduce the reference bit for bit (the sums are exact in any order);
      // lossy ones must stay within their bound of it.
      row.matches_reference = !has_reference || c == reference ||
                              (codecs[c]->is_identity() ? all.max_reference_difference == 0
                                                        : all.max_reference_difference <= row.error_bound);
      row.correct = identical && row.max_error <= row.error_bound && row.matches_reference;
      if (on_row) on_row(row);
      rows.push_back(row);
    }
  }
  return rows;
}

std::vector<AllreduceBenchmarkRow> run_local_allreduce_benchmark(
    int workers, const NetworkSpec& network, const std::vector<AllreduceCandidate>& candidates,
    const AllreduceBenchmarkConfig& config,
    const std::function<void(const AllreduceBenchmarkRow&)>& on_row) {
  if (workers < 1) throw UsageError(concat("--workers must be >= 1, got ", workers));
  LocalFabric fabric(workers, network);
  ThreadStartBarrier start_barrier(workers);
  std::vector<std::exception_ptr> failures(workers);
  std::vector<AllreduceBenchmarkRow> rows;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      Transport& transport = fabric.endpoint(rank);
      const BenchmarkBarrier barrier = [&start_barrier, rank](Timeout timeout) {
        return start_barrier.arrive_and_wait(rank, timeout);
      };
      try {
        auto result = run_allreduce_benchmark_rank(transport, barrier, candidates, config,
                                                   rank == 0 ? on_row : nullptr);
        if (rank == 0) rows = std::move(result);
      } catch (const std::exception& error) {
        failures[rank] = std::current_exception();
        transport.report_failure(error.what());
        start_barrier.abandon(rank, error.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  rethrow_root_cause(failures);  // the root cause, not the others' "peer failed"
  return rows;
}

}  // namespace pipesgd
