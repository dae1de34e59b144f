// The C++ API's cost against a bare LibTorch loop and against the CLI (run by
// scripts/api-overhead-bench.sh, which git show d620cdd:docs/results.md, "C++ API overhead", quotes). Public headers
// only, as a user would write it.
//
//   pipesgd_api_bench bare [--iters N] [--batch B] [--lr LR]
//   pipesgd_api_bench api  [--iters N] [--batch B] [--lr LR] [--workers W] [--method SPEC]
//
// Both modes train the same module, LeNet exactly as the CLI's `--model cnn` (Conv2d(1,6,5,pad 2),
// ReLU, MaxPool 2; Conv2d(6,16,5), ReLU, MaxPool 2; Linear 400-120, ReLU; 84; 10: 61706
// parameters), on fixed synthetic batches made before training (worker r's: seeded with r, cycled),
// so no data loading is timed. One step is the loop body a user writes and the CLI's model runs:
// forward, cross_entropy, the batch's correct count and loss.item(), backward, then
//   bare: torch::optim::SGD step and zero_grad, on the calling thread;
//   api:  DistributedOptimizer::step() (method SPEC, default dsync) on W workers (default 1) that
//         are threads of this process (pipesgd::run_threads), each with its own batches; a
//         parameter-server method (pssync, ...) gets one server thread, as the CLI's --servers 1.
// Both keep freed memory in the heap: api through pipesgd::run_threads (WorldOptions::keep_freed_memory,
// the default), bare by the same two mallopt calls, so that the figure is the API's own per-step
// work and not glibc's page faults (which the API's setting removes).
// Torch runs one intra-op thread in both (at::set_num_threads(1) on every thread that computes, and
// one inter-op thread), as the CLI does (init_torch_runtime(1)).
//
// Prints one line of KEY=VALUE on stdout:
//   mode method workers batch iters measured   (measured: the steps in the figures, see below)
//   step_median_ms  the median step time over every worker's measured steps
//   step_mean_ms    their mean: the CLI's iteration_s definition (mean over workers and iterations)
//   samples_per_s   workers * batch / step_mean (the CLI's throughput_samples_per_s)
//   optimizer_median_ms  the median of the steps' part after backward (bare: SGD step and
//                   zero_grad; api: DistributedOptimizer::step), a diagnostic of where time goes
//   forward_mean_ms backward_mean_ms optimizer_mean_ms  the mean of the step's three parts (forward,
//                   loss and correct count; backward; after backward): with step_mean_ms, to set
//                   beside the CLI's summary.json mean.forward_s, mean.backward_s and the rest
//   loop_s          wall time of training: bare from the optimizer's construction, api from
//                   run_threads' start, to the end of the last step (api: after finish())
//   final_loss      worker 0's last loss (a sanity check that training ran on finite numbers)
// A step's time runs from the start of one iteration's body to the next's. The measured steps are
// the CLI's: iterations [min(10, iters / 10), iters), skipping the start-up (the API's first step
// rebuilds the flat buffer). Exit status: 0, 2 for a bad argument (one line on stderr), 1 for an
// error of the run.
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "pipesgd/pipesgd.h"

namespace {

using Clock = std::chrono::steady_clock;

struct LeNetImpl : torch::nn::Module {
  LeNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 5).padding(2)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 16, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(400, 120))),
        fc2(register_module("fc2", torch::nn::Linear(120, 84))),
        fc3(register_module("fc3", torch::nn::Linear(84, 10))) {}
  // x: [batch, 784] flat 28x28 images, as the CLI's models take them.
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = x.view({x.size(0), 1, 28, 28});
    h = torch::max_pool2d(torch::relu(conv1(h)), 2);
    h = torch::max_pool2d(torch::relu(conv2(h)), 2);
    h = torch::relu(fc1(h.flatten(1)));
    h = torch::relu(fc2(h));
    return fc3(h);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(LeNet);

struct Flags {
  std::string mode;
  std::int64_t iterations = 1000;
  std::int64_t batch = 25;
  double learning_rate = 0.01;
  int workers = 1;
  std::string method = "dsync";
};

struct UsageFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr const char* kUsage =
    "usage: pipesgd_api_bench bare [--iters N] [--batch B] [--lr LR]\n"
    "       pipesgd_api_bench api  [--iters N] [--batch B] [--lr LR] [--workers W] [--method SPEC]\n";

std::int64_t parse_int(const std::string& flag, const std::string& text, std::int64_t low, std::int64_t high) {
  std::size_t used = 0;
  std::int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || value < low || value > high) {
    throw UsageFailure(flag + " must be an integer in [" + std::to_string(low) + ", " + std::to_string(high) +
                       "], got '" + text + "'");
  }
  return value;
}

Flags parse_flags(int argc, char** argv) {
  if (argc < 2) throw UsageFailure("give a mode: bare or api");
  Flags flags;
  flags.mode = argv[1];
  if (flags.mode != "bare" && flags.mode != "api") throw UsageFailure("unknown mode '" + flags.mode + "' (expected bare or api)");
  for (int k = 2; k < argc; ++k) {
    const std::string flag = argv[k];
    if (k + 1 >= argc) throw UsageFailure(flag + " needs a value");
    const std::string value = argv[++k];
    if (flag == "--iters") {
      flags.iterations = parse_int(flag, value, 1, 10000000);
    } else if (flag == "--batch") {
      flags.batch = parse_int(flag, value, 1, 100000);
    } else if (flag == "--lr") {
      std::size_t used = 0;
      try {
        flags.learning_rate = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != value.size() || !(flags.learning_rate > 0)) throw UsageFailure("--lr must be a positive number, got '" + value + "'");
    } else if (flag == "--workers" && flags.mode == "api") {
      flags.workers = static_cast<int>(parse_int(flag, value, 1, 256));
    } else if (flag == "--method" && flags.mode == "api") {
      flags.method = value;
    } else {
      throw UsageFailure("unknown flag '" + flag + "' for mode " + flags.mode);
    }
  }
  return flags;
}

// Worker `rank`'s fixed batches: inputs uniform in [0, 1) [batch, 784], the range of the CLI's
// images (its synthetic data is clamped to [0, 1]), labels uniform in 0..9. The input range matters
// to the LeNet's speed: with N(0, 1) inputs the API at one worker ran 13% slower than the CLI on its
// data (2000 iterations, 4 alternated pairs); with inputs in [0, 1) the two match.
struct Batches {
  std::vector<torch::Tensor> inputs, labels;
};
constexpr int kBatchesPerWorker = 16;

Batches make_batches(int rank, std::int64_t batch) {
  torch::manual_seed(static_cast<std::uint64_t>(1000 + rank));
  Batches out;
  for (int k = 0; k < kBatchesPerWorker; ++k) {
    out.inputs.push_back(torch::rand({batch, 784}));
    out.labels.push_back(torch::randint(0, 10, {batch}, torch::kInt64));
  }
  return out;
}

// The loop body before the optimizer: forward, loss, the correct count and the loss's value (what the
// CLI's model computes every step), backward. Returns the loss; `forward_done` gets the time between
// the forward part (forward, loss, correct count: the CLI's forward_s) and backward.
double forward_backward(LeNet& model, const Batches& batches, std::int64_t t, std::int64_t& correct,
                        Clock::time_point& forward_done) {
  const auto k = static_cast<std::size_t>(t % kBatchesPerWorker);
  const torch::Tensor logits = model->forward(batches.inputs[k]);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(logits, batches.labels[k]);
  {
    torch::NoGradGuard no_grad;
    correct += logits.argmax(1).eq(batches.labels[k]).sum().item<std::int64_t>();
  }
  forward_done = Clock::now();
  loss.backward();
  return loss.item<double>();
}

// One worker's times: entry t of `step` is iteration t's (from its start to the next one's), its
// parts `forward` (forward, loss, correct count), `backward`, and `optimizer` the part after backward
// (bare: SGD step and zero_grad; api: DistributedOptimizer::step).
struct StepTimes {
  std::vector<double> step, forward, backward, optimizer;
  void reserve(std::int64_t iterations) {
    for (std::vector<double>* part : {&step, &forward, &backward, &optimizer}) part->reserve(static_cast<std::size_t>(iterations));
  }
};

// Called at the end of the step, with the times the step's forward part and its backward ended.
void record_step(StepTimes& times, Clock::time_point& start, Clock::time_point forward_done,
                 Clock::time_point backward_done) {
  const Clock::time_point end = Clock::now();
  auto seconds = [](Clock::time_point from, Clock::time_point to) { return std::chrono::duration<double>(to - from).count(); };
  times.step.push_back(seconds(start, end));
  times.forward.push_back(seconds(start, forward_done));
  times.backward.push_back(seconds(forward_done, backward_done));
  times.optimizer.push_back(seconds(backward_done, end));
  start = end;
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

void print_result(const Flags& flags, const std::vector<StepTimes>& per_worker, double loop_seconds, double final_loss) {
  const std::int64_t first = std::min<std::int64_t>(10, flags.iterations / 10);
  std::vector<double> measured, forward, backward, optimizer;
  for (const StepTimes& times : per_worker) {
    measured.insert(measured.end(), times.step.begin() + first, times.step.end());
    forward.insert(forward.end(), times.forward.begin() + first, times.forward.end());
    backward.insert(backward.end(), times.backward.begin() + first, times.backward.end());
    optimizer.insert(optimizer.end(), times.optimizer.begin() + first, times.optimizer.end());
  }
  auto mean_of = [](const std::vector<double>& values) {
    return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  };
  const double median = median_of(measured);
  const double mean = mean_of(measured);
  std::printf(
      "mode=%s method=%s workers=%d batch=%lld iters=%lld measured=%lld step_median_ms=%.4f step_mean_ms=%.4f "
      "samples_per_s=%.1f optimizer_median_ms=%.4f forward_mean_ms=%.4f backward_mean_ms=%.4f "
      "optimizer_mean_ms=%.4f loop_s=%.4f final_loss=%.4f\n",
      flags.mode.c_str(), flags.mode == "api" ? flags.method.c_str() : "torch.optim.SGD", flags.workers,
      static_cast<long long>(flags.batch), static_cast<long long>(flags.iterations),
      static_cast<long long>(flags.iterations - first), median * 1e3, mean * 1e3,
      static_cast<double>(flags.workers * flags.batch) / mean, median_of(optimizer) * 1e3, mean_of(forward) * 1e3,
      mean_of(backward) * 1e3, mean_of(optimizer) * 1e3, loop_seconds, final_loss);
}

void run_bare(const Flags& flags) {
  // What pipesgd::run_threads does by default (include/pipesgd/world.h, WorldOptions::keep_freed_memory).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  at::set_num_threads(1);
  const Batches batches = make_batches(0, flags.batch);
  torch::manual_seed(1);
  LeNet model;
  model->train();
  std::vector<StepTimes> times(1);
  times[0].reserve(flags.iterations);
  std::int64_t correct = 0;
  double loss = 0;
  const Clock::time_point loop_start = Clock::now();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(flags.learning_rate));
  Clock::time_point step_start = Clock::now();
  for (std::int64_t t = 0; t < flags.iterations; ++t) {
    Clock::time_point forward_done;
    loss = forward_backward(model, batches, t, correct, forward_done);
    const Clock::time_point backward_done = Clock::now();
    optimizer.step();
    optimizer.zero_grad();
    record_step(times[0], step_start, forward_done, backward_done);
  }
  print_result(flags, times, std::chrono::duration<double>(Clock::now() - loop_start).count(), loss);
}

void run_api(const Flags& flags) {
  std::vector<Batches> batches;
  std::vector<LeNet> models;
  for (int rank = 0; rank < flags.workers; ++rank) batches.push_back(make_batches(rank, flags.batch));
  for (int rank = 0; rank < flags.workers; ++rank) {
    torch::manual_seed(1);  // every replica starts from worker 0's weights anyway (broadcast)
    models.emplace_back();
  }
  std::vector<StepTimes> times(static_cast<std::size_t>(flags.workers));
  double final_loss = 0;
  pipesgd::DistributedOptimizerOptions options;
  options.learning_rate = static_cast<float>(flags.learning_rate);
  const Clock::time_point loop_start = Clock::now();
  // A parameter-server method gets one server thread, as the CLI's default --servers 1.
  pipesgd::WorldOptions world;
  world.workers = flags.workers;
  const std::string name = flags.method.substr(0, flags.method.find('+'));
  for (const pipesgd::MethodInfo& method : pipesgd::available_methods()) {
    if (method.name == name && method.uses_servers) world.servers = 1;
  }
  pipesgd::run_threads(world, [&](pipesgd::Worker& worker) {
    at::set_num_threads(1);  // OpenMP keeps the count per thread
    const auto rank = static_cast<std::size_t>(worker.rank());
    LeNet& model = models[rank];
    model->train();
    StepTimes& mine = times[rank];
    mine.reserve(flags.iterations);
    std::int64_t correct = 0;
    double loss = 0;
    pipesgd::DistributedOptimizer optimizer(worker, model, flags.method, options);
    Clock::time_point step_start = Clock::now();
    for (std::int64_t t = 0; t < flags.iterations; ++t) {
      Clock::time_point forward_done;
      loss = forward_backward(model, batches[rank], t, correct, forward_done);
      const Clock::time_point backward_done = Clock::now();
      optimizer.step();
      record_step(mine, step_start, forward_done, backward_done);
    }
    optimizer.finish();
    if (rank == 0) final_loss = loss;
  });
  print_result(flags, times, std::chrono::duration<double>(Clock::now() - loop_start).count(), final_loss);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse_flags(argc, argv);
  } catch (const UsageFailure& error) {
    std::fprintf(stderr, "pipesgd_api_bench: error: %s\n%s", error.what(), kUsage);
    return 2;
  }
  try {
    // As the CLI's init_torch_runtime(1): one intra-op and one inter-op thread.
    at::set_num_threads(1);
    at::set_num_interop_threads(1);
    if (flags.mode == "bare") {
      run_bare(flags);
    } else {
      run_api(flags);
    }
  } catch (const pipesgd::UsageError& error) {
    std::fprintf(stderr, "pipesgd_api_bench: error: %s\n", error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "pipesgd_api_bench: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
