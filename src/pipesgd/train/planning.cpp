#include "pipesgd/train/planning.h"

#include "pipesgd/algo/bucketed_dsync.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <thread>

#include "pipesgd/comm/local_transport.h"
#include "pipesgd/core/clock.h"
#include "pipesgd/core/error.h"
#include "pipesgd/data/sampler.h"
#include "pipesgd/optim/sgd.h"

namespace pipesgd {
namespace {

bool calibrated_here(const MethodConfig& config, int workers, const std::string& algorithm) {
  return config.calibration && config.calibration->world_size == workers &&
         config.calibration->measured.count(algorithm) > 0;
}

}  // namespace

LinearCost planning_cost(const MethodConfig& config, const NetworkSpec& network, int workers,
                         double gradient_bytes) {
  const std::string algorithm = resolve_allreduce_algorithm(config, workers, gradient_bytes);
  if (calibrated_here(config, workers, algorithm)) return config.calibration->measured.at(algorithm);
  if (config.calibration) return allreduce_cost(algorithm, workers, config.calibration->link);
  LinkParameters link = default_link_parameters();
  if (network.emulated()) {
    link.alpha += network.latency_seconds;
    if (network.bits_per_second > 0) link.beta += 1.0 / network.bytes_per_second();
  }
  return allreduce_cost(algorithm, workers, link);
}

std::string planning_cost_source(const MethodConfig& config, const NetworkSpec& network, int workers) {
  if (config.calibration) {
    return config.calibration->world_size == workers
               ? "the calibration file's measured a + b*M"
               : "the calibration file's link parameters (Table II; it was measured at another world size)";
  }
  return concat("the allreduce timed over ", network.emulated() ? network.name : std::string("this transport"),
                " at ", kCostProbes, " sizes");
}

LinearCost measure_local_allreduce_cost(const MethodConfig& config, const NetworkSpec& network,
                                        int workers, const LayerProfile& profile) {
  const std::vector<double> sizes = cost_probe_sizes(profile);
  const double bytes_per_element =
      static_cast<double>(make_codec(config.codec)->encoded_bytes(1000)) / 1000.0;
  const std::size_t count = static_cast<std::size_t>(sizes.back() / bytes_per_element) + 1;
  const std::string algorithm =
      resolve_allreduce_algorithm(config, workers, static_cast<double>(count) * sizeof(float));
  if (workers < 2) return LinearCost{};
  LocalFabric fabric(workers, network);
  std::vector<std::vector<double>> medians(static_cast<std::size_t>(workers));
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(workers));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      Transport& transport = fabric.endpoint(rank);
      try {
        const auto codec = make_codec(config.codec);
        auto allreduce = make_method_allreduce(config, transport, count, *codec);
        std::vector<float> scratch(count, 1.0f);
        measure_allreduce_seconds(*allreduce, scratch, sizes, bytes_per_element, 1, 0);  // warm-up
        medians[static_cast<std::size_t>(rank)] =
            measure_allreduce_seconds(*allreduce, scratch, sizes, bytes_per_element, 5, 1000);
      } catch (const std::exception& error) {
        failures[static_cast<std::size_t>(rank)] = std::current_exception();
        transport.report_failure(error.what());
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  std::vector<double> mean(sizes.size(), 0.0);
  for (const auto& rank_medians : medians) {
    for (std::size_t k = 0; k < sizes.size(); ++k) mean[k] += rank_medians[k] / workers;
  }
  return fit_measured_cost(sizes, mean, algorithm, workers);
}

MeasuredProfile measure_layer_profile(const ModelFactory& factory, const DataSplits& data, int workers,
                                      std::size_t batch, std::int64_t iterations, std::uint64_t seed,
                                      double bytes_per_element) {
  if (workers < 1) throw UsageError(concat("--workers must be >= 1, got ", workers));
  if (iterations < 1) throw UsageError(concat("--profile-iters must be >= 1, got ", iterations));
  std::vector<std::unique_ptr<Model>> models;
  for (int rank = 0; rank < workers; ++rank) models.push_back(factory(seed));
  const Layout& layout = models[0]->layout();
  const std::size_t layers = layout.segment_count();
  if (layers == 0) throw UsageError("the model has no layers");
  const std::size_t global_batch = static_cast<std::size_t>(workers) * batch;
  if (data.train.size < global_batch) {
    throw UsageError(concat("the training set has ", data.train.size, " examples, fewer than one global batch (",
                            workers, " workers x batch ", batch, ")"));
  }
  const std::int64_t per_epoch = static_cast<std::int64_t>(data.train.size / global_batch);

  struct Sums {
    std::vector<double> backward;
    double before_backward = 0, update = 0;
  };
  std::vector<Sums> sums(static_cast<std::size_t>(workers));
  std::vector<std::exception_ptr> failures(static_cast<std::size_t>(workers));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Model& model = *models[static_cast<std::size_t>(rank)];
        Sums& mine = sums[static_cast<std::size_t>(rank)];
        mine.backward.assign(layers, 0.0);
        ShardedSampler sampler(data.train.size, static_cast<std::size_t>(workers),
                               static_cast<std::size_t>(rank), batch, seed);
        BatchAssembler assembler(data.train, batch);
        Sgd sgd(layout.total(), SgdOptions{0.01f, 0.0f, 0.0f});
        std::vector<float> gradients(layout.total());
        bool counted = false;
        const SegmentReadyFn on_ready = [&](std::size_t segment, double seconds) {
          if (counted && segment < layers) mine.backward[segment] += seconds;
        };
        sampler.start_epoch(0);
        for (std::int64_t i = 0; i <= iterations; ++i) {
          counted = i > 0;
          Stopwatch iteration;
          const Batch batch_rows = assembler.assemble(sampler.batch_indices(static_cast<std::size_t>(i % per_epoch)));
          const StepResult step = model.forward_backward(batch_rows, gradients, on_ready);
          const double before_backward = iteration.seconds() - step.backward_seconds;
          Stopwatch update;
          sgd.step(model.parameters(), gradients, 1.0f / static_cast<float>(workers));
          if (counted) {
            mine.before_backward += before_backward;
            mine.update += update.seconds();
          }
        }
      } catch (...) {
        failures[static_cast<std::size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  MeasuredProfile profile;
  profile.iterations = iterations;
  const double n = static_cast<double>(workers) * static_cast<double>(iterations);
  profile.layers.backward_seconds.assign(layers, 0.0);
  for (std::size_t s = 0; s < layers; ++s) {
    profile.layers.bytes.push_back(static_cast<double>(layout.segment(s).count) * bytes_per_element);
  }
  for (const Sums& worker : sums) {
    for (std::size_t s = 0; s < layers; ++s) profile.layers.backward_seconds[s] += worker.backward[s] / n;
    profile.layers.forward_seconds += worker.before_backward / n;
    profile.update_seconds += worker.update / n;
  }
  return profile;
}

}  // namespace pipesgd
