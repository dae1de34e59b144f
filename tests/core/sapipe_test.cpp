// SAPipe (algo/sapipe/sapipe.h) on the tiny pure-C++ models: the limits k = 0 (D-Sync) and k = every layer
// (Pipe-SGD with K = 2) bit for bit; the weights each worker computes on, iteration by iteration,
// and the final weights against an independent replay of the header's semantics (the stale range
// on G(t-2), the synchronous range on G(t-1), dc, wp1, wp2, wp3 with the DC term as printed or
// clamped by --dc-bound on) from the recorded local gradients, with 1 to 4 ranks, momentum, weight
// decay, the int8 codec (the replay's sums come from the same collective and codec), and the
// pipeline start taken from the configuration; the defaults (SAPipe paper Sec. 5.1: wp3, lambda 0.2,
// no clamp); usage errors; the partition report; Adam.
#include "pipesgd/algo/sapipe/sapipe.h"
#include "pipesgd/algo/sapipe/sapipe_report.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "pipesgd/algo/planning.h"
#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/core/error.h"
#include "pipesgd/train/trainer.h"
#include "allreduce_test_support.h"
#include "resegmented_model.h"
#include "test_world.h"
#include "tiny_run.h"

namespace pipesgd {
namespace {

// The sapipe report of a run.
const SapipeFacts& facts_of(const RunSummary& summary) {
  const auto* report = dynamic_cast<const SapipeReport*>(summary.figures.report.get());
  if (report == nullptr) throw std::logic_error("not a sapipe run");
  return report->facts;
}

bool equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The models of the equivalence tests: the softmax model (2 segments, reports forward progress)
// and the same model cut into 14 segments (no forward hook: the synchronous update comes at the
// start of the iteration).
enum class TinyModel { kSoftmax, kResegmented14 };

ModelFactory factory_of(TinyModel model) {
  return model == TinyModel::kSoftmax ? softmax_factory() : resegmented_softmax_factory(7);
}

std::size_t layers_of(TinyModel model) { return model == TinyModel::kSoftmax ? 2 : 14; }

const char* name_of(TinyModel model) { return model == TinyModel::kSoftmax ? "softmax" : "resegmented14"; }
void PrintTo(TinyModel model, std::ostream* out) { *out << name_of(model); }

void expect_same_final_parameters(const RunSummary& a, const RunSummary& b, int workers) {
  ASSERT_EQ(a.final_parameters.size(), static_cast<std::size_t>(workers));
  ASSERT_EQ(b.final_parameters.size(), static_cast<std::size_t>(workers));
  for (std::size_t r = 0; r < a.final_parameters.size(); ++r) {
    ASSERT_FALSE(a.final_parameters[r].empty());
    EXPECT_TRUE(equal(a.final_parameters[r], b.final_parameters[r])) << "rank " << r;
  }
}

// ---------------------------------------------------------------------------------------------
// 1. k = 0: every layer synchronous, one bucket: D-Sync bit for bit.

using DSyncLimitParam = std::tuple<int, std::string, TinyModel>;

class SapipeStaleLayersZero : public ::testing::TestWithParam<DSyncLimitParam> {};

TEST_P(SapipeStaleLayersZero, StaleLayersZeroIsDSyncBitForBit) {
  const auto& [workers, codec, model] = GetParam();
  const TrainConfig sapipe =
      tiny_config("sapipe", workers, 0, {{"--stale-layers", "0"}, {"--buckets", "single"}, {"--codec", codec}});
  const TrainConfig dsync = tiny_config("dsync", workers, 0, {{"--codec", codec}});
  const RunSummary a = run_training(sapipe, factory_of(model), small_data());
  const RunSummary b = run_training(dsync, factory_of(model), small_data());
  expect_same_final_parameters(a, b, workers);
  const SapipeFacts& facts = facts_of(a);
  EXPECT_EQ(facts.stale_layers, 0u);
  EXPECT_EQ(facts.stale_fraction, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Sapipe, SapipeStaleLayersZero,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("none", "bf16", "int8"),
                       ::testing::Values(TinyModel::kSoftmax, TinyModel::kResegmented14)),
    [](const ::testing::TestParamInfo<DSyncLimitParam>& info) {
      return concat(std::get<0>(info.param), "workers_", std::get<1>(info.param), "_",
                    name_of(std::get<2>(info.param)));
    });

// ---------------------------------------------------------------------------------------------
// 2. k = every layer, no compensation, one bucket (no profiling): Pipe-SGD with K = 2 bit for bit,
// with the same warm-up.

using PipeLimitParam = std::tuple<int, std::string, TinyModel, int>;

class SapipeAllLayersStale : public ::testing::TestWithParam<PipeLimitParam> {};

TEST_P(SapipeAllLayersStale, AllLayersStaleIsPipeK2BitForBit) {
  const auto& [workers, codec, model, warmup] = GetParam();
  const TrainConfig sapipe = tiny_config("sapipe", workers, 0,
                                         {{"--stale-layers", std::to_string(layers_of(model))},
                                          {"--compensation", "none"},
                                          {"--buckets", "single"},
                                          {"--codec", codec},
                                          {"--warmup-iters", std::to_string(warmup)}});
  const TrainConfig pipe = tiny_config(
      "pipe", workers, 0, {{"--staleness-k", "2"}, {"--codec", codec}, {"--warmup-iters", std::to_string(warmup)}});
  const TrainConfig dsync = tiny_config("dsync", workers, 0, {{"--codec", codec}});
  const RunSummary a = run_training(sapipe, factory_of(model), small_data());
  const RunSummary b = run_training(pipe, factory_of(model), small_data());
  const RunSummary c = run_training(dsync, factory_of(model), small_data());
  expect_same_final_parameters(a, b, workers);
  // Not vacuous: the stale updates differ from D-Sync's.
  EXPECT_FALSE(equal(a.final_parameters[0], c.final_parameters[0]));
  const SapipeFacts& facts = facts_of(a);
  EXPECT_EQ(facts.stale_layers, layers_of(model));
  EXPECT_EQ(facts.stale_fraction, 1.0);
  EXPECT_EQ(facts.pipeline_start, warmup);
}

INSTANTIATE_TEST_SUITE_P(
    Sapipe, SapipeAllLayersStale,
    ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("none", "int8"),
                       ::testing::Values(TinyModel::kSoftmax, TinyModel::kResegmented14),
                       ::testing::Values(0, 3)),
    [](const ::testing::TestParamInfo<PipeLimitParam>& info) {
      return concat(std::get<0>(info.param), "workers_", std::get<1>(info.param), "_",
                    name_of(std::get<2>(info.param)), "_warmup", std::get<3>(info.param));
    });

// ---------------------------------------------------------------------------------------------
// 3. The weights computed on, against a replay of the header's semantics.

// Records, for every forward_backward call, the parameters forward read (after the forward hook:
// the synchronous update is applied there) and the gradient backward wrote, plus the parameters at
// the call's entry (before the hook). Forwards the inner model's forward hook.
class RecordingModel final : public Model {
 public:
  struct Record {
    std::vector<std::vector<float>> entry, weights, gradients;  // [iteration]
  };
  RecordingModel(std::unique_ptr<Model> inner, Record& record) : inner_(std::move(inner)), record_(record) {}
  const Layout& layout() const override { return inner_->layout(); }
  std::span<float> parameters() override { return inner_->parameters(); }
  bool reports_forward_progress() const override { return inner_->reports_forward_progress(); }
  void set_forward_hook(SegmentsNeededFn hook) override {
    if (!hook) {
      inner_->set_forward_hook({});
      return;
    }
    inner_->set_forward_hook([this, hook = std::move(hook)](std::size_t first, std::size_t end) {
      hook(first, end);
      // What forward reads for segments [first, end): the parameters now.
      const Layout& layout = inner_->layout();
      const std::span<float> w = inner_->parameters();
      const std::size_t begin = layout.segment(first).offset;
      const std::size_t stop = layout.segment(end - 1).offset + layout.segment(end - 1).count;
      std::copy(w.begin() + static_cast<std::ptrdiff_t>(begin), w.begin() + static_cast<std::ptrdiff_t>(stop),
                current_.begin() + static_cast<std::ptrdiff_t>(begin));
    });
  }
  StepResult forward_backward(const Batch& batch, std::span<float> gradients,
                              const SegmentReadyFn& ready) override {
    const auto w = inner_->parameters();
    record_.entry.emplace_back(w.begin(), w.end());
    current_.assign(w.begin(), w.end());
    // The local gradient of each segment as it is reported ready, before the method's callback
    // hands it to the comm thread (which reduces it in place).
    const Layout& layout = inner_->layout();
    std::vector<float> local(gradients.size(), 0.0f);
    std::vector<bool> copied(layout.segment_count(), false);
    auto copy_segment = [&](std::size_t s) {
      const Segment& segment = layout.segment(s);
      std::copy_n(gradients.begin() + static_cast<std::ptrdiff_t>(segment.offset), segment.count,
                  local.begin() + static_cast<std::ptrdiff_t>(segment.offset));
      copied[s] = true;
    };
    SegmentReadyFn recording_ready;
    if (ready) {
      recording_ready = [&](std::size_t segment, double seconds) {
        copy_segment(segment);
        ready(segment, seconds);
      };
    }
    StepResult result = inner_->forward_backward(batch, gradients, recording_ready);
    // Segments never reported are sent in end_iteration, after this returns.
    for (std::size_t s = 0; s < copied.size(); ++s) {
      if (!copied[s]) copy_segment(s);
    }
    record_.weights.push_back(current_);
    record_.gradients.push_back(std::move(local));
    return result;
  }
  Evaluation evaluate(const Batch& batch) override { return inner_->evaluate(batch); }

 private:
  std::unique_ptr<Model> inner_;
  Record& record_;
  std::vector<float> current_;
};

struct RecordedRun {
  RunSummary summary;
  std::vector<RecordingModel::Record> ranks;
  std::vector<float> initial;
};

RecordedRun run_recorded(const TrainConfig& config) {
  RecordedRun run;
  run.ranks.resize(static_cast<std::size_t>(config.workers));
  std::mutex mutex;
  std::size_t built = 0;  // run_training builds the replicas in rank order
  ModelFactory factory = [&](std::uint64_t seed) -> std::unique_ptr<Model> {
    std::lock_guard lock(mutex);
    const std::size_t rank = built++;
    auto inner = softmax_factory()(seed);
    if (rank == 0) run.initial.assign(inner->parameters().begin(), inner->parameters().end());
    return std::make_unique<RecordingModel>(std::move(inner), run.ranks[rank]);
  };
  run.summary = run_training(config, factory, small_data());
  return run;
}

// G(t), the summed gradient of every iteration t, as the run's allreduce computes it: the recorded
// local gradients L_r(t) of the n ranks reduced by the algorithm and codec the run is configured
// with (make_allreduce over a LocalFabric: the collective is tested on its own, against exact sums
// and its codec's error bounds), over the jobs sapipe.h describes: a synchronous iteration (t < P)
// reduces the whole buffer in one allreduce; a pipelined one the synchronous range (one bucket
// here: the synchronous layer is the bias) and the stale range [0, S) separately. The partition
// matters for the bits: int8 scales each message by its own largest magnitude, and the ring's
// order of summation follows the message's chunks. Every rank's result must be the same.
std::vector<std::vector<float>> reduced_gradients(const RecordedRun& run, const MethodSelection& method,
                                                  std::size_t stale, std::int64_t P) {
  const int ranks = static_cast<int>(run.ranks.size());
  const std::size_t total = run.initial.size();
  const std::size_t iterations = run.ranks[0].gradients.size();
  std::vector<std::vector<std::vector<float>>> sums(static_cast<std::size_t>(ranks));  // [rank][t]
  run_ranks(ranks, [&](int rank, Transport& transport) {
    const std::unique_ptr<Codec> codec = make_codec(method.common.codec);
    const std::unique_ptr<Allreduce> allreduce =
        make_allreduce(method.common.allreduce, transport, total, *codec,
                       method_allreduce_options(method.common, method.options->default_segment_bytes()));
    std::uint64_t sequence = 0;
    for (std::size_t t = 0; t < iterations; ++t) {
      std::vector<float> buffer = run.ranks[static_cast<std::size_t>(rank)].gradients[t];
      const std::span<float> all(buffer);
      if (static_cast<std::int64_t>(t) < P) {
        allreduce->run(all, collective_tag(Channel::kGradients, sequence++));
      } else {
        allreduce->run(all.subspan(stale), collective_tag(Channel::kGradients, sequence++));
        allreduce->run(all.first(stale), collective_tag(Channel::kGradients, sequence++));
      }
      sums[static_cast<std::size_t>(rank)].push_back(std::move(buffer));
    }
  });
  for (int r = 1; r < ranks; ++r) {
    for (std::size_t t = 0; t < iterations; ++t) {
      EXPECT_TRUE(equal(sums[static_cast<std::size_t>(r)][t], sums[0][t])) << "rank " << r << ", iteration " << t;
    }
  }
  // The oracle's sums are sums: within the codec's documented bound of the exact ones (largest: the
  // largest |L_r(t)| over the message and the ranks).
  const std::unique_ptr<Codec> codec = make_codec(method.common.codec);
  bool lossy = false;
  std::size_t outside = 0;
  std::string first_outside;
  for (std::size_t t = 0; t < iterations; ++t) {
    const bool pipelined = static_cast<std::int64_t>(t) >= P;
    const std::vector<std::pair<std::size_t, std::size_t>> messages =
        pipelined ? std::vector<std::pair<std::size_t, std::size_t>>{{0, stale}, {stale, total}}
                  : std::vector<std::pair<std::size_t, std::size_t>>{{0, total}};
    for (const auto& [begin, end] : messages) {
      double largest = 0;
      for (const auto& record : run.ranks) {
        for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, double(std::fabs(record.gradients[t][i])));
      }
      const double bound = allreduce_error_bound(method.common.allreduce, *codec, ranks, largest);
      for (std::size_t i = begin; i < end; ++i) {
        double exact = 0;
        float in_rank_order = 0;
        for (const auto& record : run.ranks) {
          exact += record.gradients[t][i];
          in_rank_order += record.gradients[t][i];
        }
        if (std::fabs(sums[0][t][i] - exact) > bound && outside++ == 0) {
          first_outside = concat("iteration ", t, ", element ", i, ": ", sums[0][t][i], " vs exact ", exact,
                                 ", bound ", bound);
        }
        lossy = lossy || sums[0][t][i] != in_rank_order;
      }
    }
  }
  EXPECT_EQ(outside, 0u) << "sums outside the codec's error bound, the first at " << first_outside;
  if (method.common.codec != "none" && ranks > 1) {
    EXPECT_TRUE(lossy) << "the codec never changed a sum";
  }
  return sums[0];
}

// What the replay replays: SGD (learning rate lr, momentum, weight decay) on a stale range of S
// elements (the first S of the flat buffer) and a synchronous rest, pipelined from iteration P.
struct ReplayParams {
  std::string compensation;
  std::size_t stale = 0;
  float lr = 0.1f, momentum = 0, weight_decay = 0, lambda = 0.2f;
  std::int64_t pipeline_start = 0;
  bool dc_bound = false;  // --dc-bound on
};

// The expected weights of the header's semantics, replayed from G(t) (reduced_gradients) and the
// recorded local gradients L_r(t), with n ranks:
//   t < P (synchronous): at the start of t, every element steps with G(t-1)/n (no compensation).
//   t >= P: at the start of t the stale range X steps with G(t-2)/n if t-2 >= P (dc: compensated
//   with D, the last step of X), the synchronous range W with G(t-1)/n; for wp the model computes
//   on predict(X, g~) when t-1 >= P.
//   The DC term is g + lambda * g * (g . D) (SAPipe paper Eq. 1, Alg. 2 line 9, Alg. 3 line 10);
//   with --dc-bound on, g . D clamped to |lambda * (g . D)| <= 1 - 1/sqrt(2).
//   finish: W with G(T-1)/n, then X with G(T-2)/n and G(T-1)/n (the pipelined ones, compensated).
// A step is LibTorch's SGD (optim/sgd.h): d = g + weight_decay * w, v = momentum * v + d,
// w = w - lr * v; a prediction is the same without storing v.
struct Expected {
  std::vector<std::vector<std::vector<float>>> weights;  // [rank][iteration]
  std::vector<float> final_weights;
  // DC terms of rank 0 with |lambda * (g . D)| > 1 - 1/sqrt(2): those --dc-bound on clamps.
  std::int64_t over_bound = 0;
};

Expected replay(const RecordedRun& run, const std::vector<std::vector<float>>& reduced, const ReplayParams& params) {
  const std::string& compensation = params.compensation;
  const std::size_t stale = params.stale;
  const float lr = params.lr, momentum = params.momentum, weight_decay = params.weight_decay, lambda = params.lambda;
  const std::size_t ranks = run.ranks.size();
  const auto iterations = static_cast<std::int64_t>(run.ranks[0].gradients.size());
  const std::size_t total = run.initial.size();
  const float scale = 1.0f / static_cast<float>(ranks);
  const std::int64_t P = params.pipeline_start;
  // G(t)/n.
  std::vector<std::vector<float>> mean(static_cast<std::size_t>(iterations), std::vector<float>(total));
  for (std::int64_t t = 0; t < iterations; ++t) {
    for (std::size_t i = 0; i < total; ++i) {
      mean[static_cast<std::size_t>(t)][i] = reduced[static_cast<std::size_t>(t)][i] * scale;
    }
  }
  auto local = [&](std::size_t r, std::int64_t t) -> const std::vector<float>& {
    return run.ranks[r].gradients[static_cast<std::size_t>(t)];
  };
  std::vector<float> w = run.initial;               // X = w[0, S), W = w[S, total)
  std::vector<float> velocity(total, 0.0f);
  std::vector<float> last_step(stale, 0.0f);        // D
  Expected expected;
  // The DC scalar g . D (rank 0 counts the terms over Theorem 3's bound 1 - 1/sqrt(2)).
  auto dc_scalar = [&](double dot, std::size_t rank) {
    const double bound = (1.0 - 1.0 / std::sqrt(2.0)) / lambda;
    if (std::fabs(dot) <= bound) return static_cast<float>(dot);
    if (rank == 0) ++expected.over_bound;
    return static_cast<float>(params.dc_bound ? std::clamp(dot, -bound, bound) : dot);
  };
  auto sgd_step = [&](std::size_t i, float g) {
    const float d = g + weight_decay * w[i];
    if (momentum == 0) {
      w[i] = w[i] - lr * d;
    } else {
      velocity[i] = momentum * velocity[i] + d;
      w[i] = w[i] - lr * velocity[i];
    }
  };
  auto sgd_predict = [&](std::size_t i, float g) {
    const float d = g + weight_decay * w[i];
    return momentum == 0 ? w[i] - lr * d : w[i] - lr * (momentum * velocity[i] + d);
  };
  auto step_stale = [&](std::int64_t t, bool compensate) {
    const std::vector<float>& g = mean[static_cast<std::size_t>(t)];
    float projection = 0;
    if (compensate && compensation == "dc") {
      double dot = 0;
      for (std::size_t i = 0; i < stale; ++i) dot += static_cast<double>(g[i]) * last_step[i];
      projection = dc_scalar(dot, 0);
    }
    for (std::size_t i = 0; i < stale; ++i) {
      const float gi = compensate && compensation == "dc" ? g[i] + lambda * g[i] * projection : g[i];
      const float old = w[i];
      sgd_step(i, gi);
      last_step[i] = w[i] - old;
    }
  };
  auto step_sync = [&](std::int64_t t) {
    for (std::size_t i = stale; i < total; ++i) sgd_step(i, mean[static_cast<std::size_t>(t)][i]);
  };
  const bool predicts = compensation == "wp1" || compensation == "wp2" || compensation == "wp3";

  expected.weights.resize(ranks);
  for (std::int64_t t = 0; t < iterations; ++t) {
    if (t >= 1 && t - 1 < P) {
      step_stale(t - 1, /*compensate=*/false);
      step_sync(t - 1);
    } else if (t >= 1) {
      if (t - 2 >= P) step_stale(t - 2, /*compensate=*/true);
      step_sync(t - 1);
    }
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<float> computed = w;
      if (predicts && t >= 1 && t - 1 >= P) {
        std::vector<float> guess(stale, 0.0f);  // g~
        if (compensation == "wp1") {
          for (std::size_t i = 0; i < stale; ++i) guess[i] = local(r, t - 1)[i];
        } else if (compensation == "wp2") {
          if (t >= 2) {
            for (std::size_t i = 0; i < stale; ++i) guess[i] = mean[static_cast<std::size_t>(t - 2)][i];
          }
        } else {
          std::vector<float> h(stale, 0.0f);
          if (t >= 2) {
            for (std::size_t i = 0; i < stale; ++i) {
              h[i] = mean[static_cast<std::size_t>(t - 2)][i] - local(r, t - 2)[i] * scale;
            }
          }
          double dot = 0;
          for (std::size_t i = 0; i < stale; ++i) dot += static_cast<double>(h[i]) * last_step[i];
          const float projection = dc_scalar(dot, r);
          for (std::size_t i = 0; i < stale; ++i) {
            guess[i] = h[i] + lambda * h[i] * projection + local(r, t - 1)[i] * scale;
          }
        }
        for (std::size_t i = 0; i < stale; ++i) computed[i] = sgd_predict(i, guess[i]);
      }
      expected.weights[r].push_back(std::move(computed));
    }
  }
  const std::int64_t last = iterations - 1;
  if (last < P) {
    step_stale(last, false);
    step_sync(last);
  } else {
    step_sync(last);
    for (std::int64_t g = last - 1; g <= last; ++g) {
      if (g >= 0 && g >= P) step_stale(g, true);
    }
  }
  expected.final_weights = w;
  return expected;
}

// Largest |a - b| / (1 + |b|), for the failure message.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double largest = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    largest = std::max(largest, std::fabs(double(a[i]) - double(b[i])) / (1.0 + std::fabs(double(b[i]))));
  }
  return largest;
}

// The replay evaluates the same fp32 formulas in the same order as the method, and its sums come
// from the same collective: it matches bit for bit. Only dc and wp3 get a margin: their scalar
// g . D is a double-precision reduction over the stale range whose order of summation the header
// leaves to the implementation (a different order may move the rounded fp32 scalar by an ulp).
double tolerance_for(const std::string& compensation) {
  return compensation == "dc" || compensation == "wp3" ? 1e-6 : 0.0;
}

// The first i with |a - b| > tolerance * (1 + |b|), or a.size().
std::size_t first_mismatch(const std::vector<float>& a, const std::vector<float>& b, double tolerance) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(double(a[i]) - double(b[i])) > tolerance * (1.0 + std::fabs(double(b[i])))) return i;
  }
  return a.size();
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double largest = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    largest = std::max(largest, std::fabs(double(a[i]) - double(b[i])));
  }
  return largest;
}

struct ReplayCase {
  std::string compensation;
  float momentum = 0;
  int iterations = 6;
  // How the pipeline starts: after `warmup` synchronous iterations (--buckets single), or with
  // `profile`, --buckets optimal with one profiled iteration after kProfileWarmupIterations (the
  // later of the two).
  int warmup = 0;
  bool profile = false;
  // DC's lambda: 0.2 (the paper's; |lambda * (g . D)| often exceeds 1 - 1/sqrt(2) here) or 0.002
  // (never does on this model).
  float lambda = 0.2f;
  // dc, wp3: --dc-bound on (clamps the DC scalar); off: not given, the default.
  bool dc_bound = false;
  int workers = 2;
  float weight_decay = 0;
  std::string codec = "none";
};

std::string case_name(const ReplayCase& c) {
  std::string momentum = c.momentum == 0 ? "m0" : "m09";
  return concat(c.compensation, "_", momentum, "_", c.iterations, "iters",
                c.warmup == 0 ? std::string() : concat("_warmup", c.warmup), c.profile ? "_profile" : "",
                c.lambda == 0.2f ? "" : "_small_lambda", c.dc_bound ? "_dc_bound" : "", c.workers == 2 ? std::string() : concat("_", c.workers, "ranks"),
                c.weight_decay == 0 ? "" : "_wd", c.codec == "none" ? "" : "_" + c.codec);
}

TrainConfig replay_config(const ReplayCase& c, const std::string& compensation) {
  // The weight segment is stale, the bias synchronous. The collective is stated here because
  // reduced_gradients() runs the same: the ring, with messages of 8 KiB (several per ring chunk of
  // the stale range; int8 scales each message on its own).
  OptionValues options{{"--stale-layers", "1"},
                       {"--compensation", compensation},
                       {"--dc-lambda", option_text(c.lambda)},
                       {"--codec", c.codec},
                       {"--allreduce", "ring"},
                       {"--segment-bytes", "8K"},
                       {"--buckets", c.profile ? "optimal" : "single"},
                       {"--warmup-iters", std::to_string(c.warmup)}};
  if (c.profile) options.set("--profile-iters", "1");
  if (c.dc_bound && (compensation == "dc" || compensation == "wp3")) options.set("--dc-bound", "on");
  TrainConfig config = tiny_config("sapipe", c.workers, 0, options);
  config.iterations = c.iterations;
  set_sgd(config, SgdOptions{0.1f, c.momentum, c.weight_decay});
  return config;
}

// The first pipelined iteration, from the configuration as sapipe.h states it: after the warm-up,
// and, when the synchronous plan needs measured times (optimal), after kProfileWarmupIterations
// synchronous iterations and the profiled one.
std::int64_t configured_pipeline_start(const ReplayCase& c) {
  return c.profile ? std::max<std::int64_t>(c.warmup, kProfileWarmupIterations + 1) : c.warmup;
}

void PrintTo(const ReplayCase& c, std::ostream* out) { *out << case_name(c); }

class SapipeReplay : public ::testing::TestWithParam<ReplayCase> {};

TEST_P(SapipeReplay, WeightsComputedOnAndFinalWeightsMatchTheHeaderSemantics) {
  const ReplayCase& c = GetParam();
  const TrainConfig config = replay_config(c, c.compensation);
  const std::int64_t start = configured_pipeline_start(c);
  const auto ranks = static_cast<std::size_t>(c.workers);
  const RecordedRun run = run_recorded(config);
  ASSERT_EQ(run.ranks.size(), ranks);
  const SapipeFacts& facts = facts_of(run.summary);
  EXPECT_EQ(facts.stale_layers, 1u);
  EXPECT_EQ(facts.pipeline_start, start);
  const std::size_t stale = 784 * 10;
  const std::vector<std::vector<float>> reduced = reduced_gradients(run, config.method, stale, start);
  const Expected expected = replay(
      run, reduced, ReplayParams{c.compensation, stale, 0.1f, c.momentum, c.weight_decay, c.lambda, start, c.dc_bound});
  // The clamp fires exactly where |lambda * (g . D)| exceeds its bound, and only when asked for.
  EXPECT_EQ(facts.bounded_compensations, c.dc_bound ? expected.over_bound : 0);
  const bool dc_term = c.compensation == "dc" || c.compensation == "wp3";
  if (dc_term && c.lambda != 0.2f) {
    EXPECT_EQ(expected.over_bound, 0);
  }
  // Not vacuous: the short runs with the paper's lambda exceed the bound, so the clamp changes them.
  if (dc_term && c.lambda == 0.2f && c.iterations == 6) {
    EXPECT_GT(expected.over_bound, 0);
  }
  const double tolerance = tolerance_for(c.compensation);
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto& record = run.ranks[r];
    ASSERT_EQ(record.weights.size(), static_cast<std::size_t>(c.iterations));
    for (std::size_t t = 0; t < record.weights.size(); ++t) {
      const std::size_t i = first_mismatch(record.weights[t], expected.weights[r][t], tolerance);
      ASSERT_EQ(i, record.weights[t].size())
          << "rank " << r << ", iteration " << t << ", element " << i << " ("
          << (i < stale ? "stale weight" : "synchronous bias") << "): got " << record.weights[t][i]
          << ", expected " << expected.weights[r][t][i] << "; largest relative difference "
          << relative_difference(record.weights[t], expected.weights[r][t]);
      // The synchronous update of t-1 is applied inside forward (the hook), not before the call.
      if (t >= 1 && static_cast<std::int64_t>(t) >= start + 1) {
        EXPECT_NE(record.entry[t][stale], record.weights[t][stale]) << "rank " << r << ", iteration " << t;
      }
    }
    const std::vector<float>& final_weights = run.summary.final_parameters[r];
    const std::size_t i = first_mismatch(final_weights, expected.final_weights, tolerance);
    ASSERT_EQ(i, final_weights.size()) << "final weights, rank " << r << ", element " << i << ": got "
                                       << final_weights[i] << ", expected " << expected.final_weights[i];
    EXPECT_TRUE(equal(final_weights, run.summary.final_parameters[0])) << "rank " << r;
  }

  // Not vacuous: the compensation changes something (weights computed on or final weights).
  if (c.compensation != "none") {
    const RecordedRun plain = run_recorded(replay_config(c, "none"));
    double largest = max_abs_difference(run.summary.final_parameters[0], plain.summary.final_parameters[0]);
    for (std::size_t r = 0; r < ranks; ++r) {
      for (std::size_t t = 0; t < run.ranks[r].weights.size(); ++t) {
        largest = std::max(largest, max_abs_difference(run.ranks[r].weights[t], plain.ranks[r].weights[t]));
      }
    }
    EXPECT_GT(largest, 1e-7) << c.compensation << " computed on exactly the weights of none";
  }
  if (c.dc_bound && expected.over_bound > 0) {
    ReplayCase unbounded = c;
    unbounded.dc_bound = false;
    const RecordedRun printed = run_recorded(replay_config(unbounded, c.compensation));
    EXPECT_GT(max_abs_difference(run.summary.final_parameters[0], printed.summary.final_parameters[0]), 1e-7)
        << "the clamp changed nothing";
  }
}

std::vector<ReplayCase> replay_cases() {
  std::vector<ReplayCase> cases;
  for (const char* compensation : {"none", "dc", "wp1", "wp2", "wp3"}) {
    for (float momentum : {0.0f, 0.9f}) {
      for (int iterations : {3, 6}) cases.push_back({.compensation = compensation, .momentum = momentum, .iterations = iterations});
      cases.push_back({.compensation = compensation, .momentum = momentum, .iterations = 8, .warmup = 2});
      cases.push_back({.compensation = compensation, .momentum = momentum, .iterations = 14, .profile = true});
    }
  }
  for (const char* compensation : {"dc", "wp3"}) {
    for (float momentum : {0.0f, 0.9f}) {
      cases.push_back({.compensation = compensation, .momentum = momentum, .iterations = 6, .lambda = 0.002f});
    }
  }
  // --dc-bound on, on runs like the default's above.
  for (const char* compensation : {"dc", "wp3"}) {
    for (float momentum : {0.0f, 0.9f}) {
      cases.push_back({.compensation = compensation, .momentum = momentum, .iterations = 6, .dc_bound = true});
      cases.push_back({.compensation = compensation, .momentum = momentum, .iterations = 14, .profile = true, .dc_bound = true});
    }
    cases.push_back({.compensation = compensation, .momentum = 0.9f, .iterations = 9, .warmup = 3, .dc_bound = true,
                     .workers = 3, .weight_decay = 0.01f});
  }
  // More ranks (odd and even), weight decay, the int8 codec, and pipeline starts from the warm-up
  // or from the profiling, whichever is later.
  for (const char* compensation : {"none", "dc", "wp1", "wp2", "wp3"}) {
    for (int workers : {1, 3, 4}) {
      cases.push_back({.compensation = compensation, .momentum = 0.9f, .iterations = 9, .warmup = 3,
                       .workers = workers, .weight_decay = 0.01f});
    }
    for (int workers : {2, 3, 4}) {
      cases.push_back({.compensation = compensation, .momentum = 0.9f, .iterations = 8, .warmup = 2,
                       .workers = workers, .weight_decay = 0.01f, .codec = "int8"});
    }
  }
  cases.push_back({.compensation = "wp3", .momentum = 0.9f, .iterations = 14, .profile = true, .workers = 3,
                   .weight_decay = 0.01f, .codec = "int8"});
  cases.push_back({.compensation = "dc", .momentum = 0.9f, .iterations = 15, .warmup = 11, .profile = true,
                   .lambda = 0.002f, .workers = 3, .weight_decay = 0.01f});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sapipe, SapipeReplay, ::testing::ValuesIn(replay_cases()),
                         [](const ::testing::TestParamInfo<ReplayCase>& info) { return case_name(info.param); });

// ---------------------------------------------------------------------------------------------
// 4. Usage errors.

std::string usage_error(const TrainConfig& config, const ModelFactory& factory = softmax_factory()) {
  try {
    run_training(config, factory, small_data());
  } catch (const UsageError& error) {
    return error.what();
  }
  return "no error";
}

// The error of selecting `spec` with `options` ("no error" if none).
std::string spec_error(const std::string& spec, const OptionValues& options = {}) {
  try {
    select_for_test(spec, options);
  } catch (const UsageError& error) {
    return error.what();
  }
  return "no error";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(SapipeUsage, UsageErrors) {
  const std::string foo = spec_error("sapipe+foo");
  EXPECT_TRUE(contains(foo, "compensation") || contains(foo, "unknown option")) << foo;
  EXPECT_TRUE(contains(foo, "foo")) << foo;

  const std::string unknown = spec_error("sapipe", {{"--compensation", "foo"}});
  EXPECT_TRUE(contains(unknown, "compensation") || contains(unknown, "unknown option")) << unknown;

  // Not a layer count: refused when the method is selected; more layers than the model has (2 for
  // the softmax model): when the run builds it.
  for (const char* stale : {"abc", "-1", "1.5", ""}) {
    const std::string message = spec_error("sapipe", {{"--stale-layers", stale}});
    EXPECT_TRUE(contains(message, "--stale-layers")) << "'" << stale << "': " << message;
  }
  for (const char* stale : {"99", "3"}) {
    const std::string message = usage_error(tiny_config("sapipe", 2, 0, {{"--stale-layers", stale}}));
    EXPECT_TRUE(contains(message, "--stale-layers")) << "'" << stale << "': " << message;
  }
  // The resegmented model has 14 layers: 14 is fine, 15 is not.
  TrainConfig config = tiny_config("sapipe", 2, 0, {{"--stale-layers", "14"}, {"--buckets", "single"}});
  config.iterations = 3;
  EXPECT_EQ(usage_error(config, resegmented_softmax_factory(7)), "no error");
  set_method_options(config, {{"--stale-layers", "15"}});
  EXPECT_TRUE(contains(usage_error(config, resegmented_softmax_factory(7)), "--stale-layers"));

  EXPECT_TRUE(contains(spec_error("sapipe+dc+wp1"), "more than one compensation")) << spec_error("sapipe+dc+wp1");
  EXPECT_EQ(spec_error("sapipe+wp3+int8+single"), "no error");

  EXPECT_TRUE(contains(spec_error("sapipe", {{"--dc-lambda", "-1"}}), "--dc-lambda"))
      << spec_error("sapipe", {{"--dc-lambda", "-1"}});

  EXPECT_EQ(spec_error("sapipe", {{"--dc-bound", "yes"}}), "--dc-bound must be off or on, got 'yes'");
  // The bound is of the DC term: only dc and wp3 have one.
  EXPECT_EQ(spec_error("sapipe+none", {{"--dc-bound", "on"}}),
            "--dc-bound applies only to sapipe with --compensation dc or wp3 (the DC term's bound), not none");
  EXPECT_EQ(spec_error("sapipe", {{"--compensation", "wp1"}, {"--dc-bound", "off"}}),
            "--dc-bound applies only to sapipe with --compensation dc or wp3 (the DC term's bound), not wp1");
  EXPECT_EQ(spec_error("sapipe+wp2", {{"--dc-bound", "on"}}),
            "--dc-bound applies only to sapipe with --compensation dc or wp3 (the DC term's bound), not wp2");
  EXPECT_EQ(spec_error("pipe", {{"--dc-bound", "on"}}),
            "--dc-bound applies only to sapipe with --compensation dc or wp3, not 'pipe'");
  for (const char* spec : {"sapipe", "sapipe+dc", "sapipe+wp3"}) {
    EXPECT_EQ(spec_error(spec, {{"--dc-bound", "on"}}), "no error") << spec;
  }
}

// ---------------------------------------------------------------------------------------------
// 5. The defaults: sapipe is the paper's SAPipe (SAPipe paper Sec. 5.1: "SAPipe uses Option 3 in
// Algorithm 3 as the default staleness compensation method, with lambda empirically set as 0.2"),
// its DC term as printed (no clamp); sapipe+none is vanilla SAPipe (Alg. 1).

const SapipeOptions& sapipe_options(const MethodSelection& selection) {
  return options_as<SapipeOptions>(*selection.options);
}

TEST(SapipeDefaults, SapipeIsThePapersWeightPredictionOption3) {
  const MethodSelection plain = select_for_test("sapipe");
  EXPECT_EQ(sapipe_options(plain).compensation, Compensation::kPredictCombined);
  EXPECT_EQ(sapipe_options(plain).lambda, 0.2);
  EXPECT_FALSE(sapipe_options(plain).dc_bound);
  EXPECT_TRUE(contains(plain.options->fingerprint(), "compensation wp3, lambda 0.2, dc bound off,"))
      << plain.options->fingerprint();

  // +none names the compensation, not the codec (none either way); with a codec too.
  const MethodSelection none = select_for_test("sapipe+none");
  EXPECT_EQ(sapipe_options(none).compensation, Compensation::kNone);
  EXPECT_EQ(none.common.codec, "none");
  const MethodSelection none_int8 = select_for_test("sapipe+none+int8");
  EXPECT_EQ(sapipe_options(none_int8).compensation, Compensation::kNone);
  EXPECT_EQ(none_int8.common.codec, "int8");
  EXPECT_EQ(sapipe_options(select_for_test("sapipe", {{"--compensation", "none"}})).compensation, Compensation::kNone);

  const MethodSelection bounded = select_for_test("sapipe+dc", {{"--dc-bound", "on"}});
  EXPECT_EQ(sapipe_options(bounded).compensation, Compensation::kDelay);
  EXPECT_TRUE(sapipe_options(bounded).dc_bound);
  EXPECT_TRUE(contains(bounded.options->fingerprint(), "compensation dc, lambda 0.2, dc bound on,"));
}

// A run of the default reports wp3, lambda 0.2 and no bound; with --dc-bound on it reports the count.
TEST(SapipeDefaults, ReportStatesTheCompensationAndTheBound) {
  TrainConfig config = tiny_config("sapipe", 2, 0, {{"--stale-layers", "2"}, {"--buckets", "single"}});
  const RunSummary plain = run_training(config, softmax_factory(), small_data());
  const SapipeFacts& facts = facts_of(plain);
  EXPECT_EQ(facts.compensation, "wp3");
  EXPECT_TRUE(facts.dc_term);
  EXPECT_EQ(facts.lambda, 0.2);
  EXPECT_FALSE(facts.dc_bound);
  EXPECT_EQ(facts.bounded_compensations, 0);
  EXPECT_TRUE(contains(describe_sapipe(facts), "compensation wp3 (lambda 0.2, DC term unbounded, as printed)"))
      << describe_sapipe(facts);

  set_method_options(config, {{"--dc-bound", "on"}, {"--dc-lambda", "1e6"}});
  const RunSummary bounded = run_training(config, softmax_factory(), small_data());
  const SapipeFacts& clamped = facts_of(bounded);
  EXPECT_TRUE(clamped.dc_bound);
  EXPECT_GT(clamped.bounded_compensations, 0);
  EXPECT_TRUE(contains(describe_sapipe(clamped),
                       concat("compensation wp3 (lambda 1e+06, --dc-bound on: the DC scalar clamped to Theorem 3's "
                              "condition in ", clamped.bounded_compensations, " predictions of rank 0)")))
      << describe_sapipe(clamped);

  const RunSummary none = run_training(tiny_config("sapipe+none+single", 2, 0, {{"--stale-layers", "2"}}),
                                       softmax_factory(), small_data());
  EXPECT_EQ(facts_of(none).compensation, "none");
  EXPECT_FALSE(facts_of(none).dc_term);
  EXPECT_TRUE(contains(describe_sapipe(facts_of(none)), "compensation none, pipelined")) << describe_sapipe(facts_of(none));
}

// ---------------------------------------------------------------------------------------------
// 6. The partition report.

TEST(SapipeReport, ReportsKAndKappa) {
  TrainConfig config = tiny_config("sapipe+single", 2, 0, {{"--stale-layers", "1"}});
  RunSummary summary = run_training(config, softmax_factory(), small_data());
  const SapipeFacts given = facts_of(summary);
  EXPECT_EQ(given.stale_layers, 1u);
  EXPECT_EQ(given.layers, 2u);
  EXPECT_DOUBLE_EQ(given.stale_fraction, 7840.0 / 7850);
  EXPECT_FALSE(given.automatic);
  EXPECT_EQ(given.compensation, "wp3");
  EXPECT_EQ(given.pipeline_start, 0);

  config = tiny_config("sapipe", 2, 0, {{"--stale-layers", "auto"}, {"--profile-iters", "2"}});
  config.iterations = 25;
  summary = run_training(config, softmax_factory(), small_data());
  const SapipeFacts& automatic = facts_of(summary);
  EXPECT_TRUE(automatic.automatic);
  EXPECT_TRUE(automatic.profiled);
  EXPECT_LE(automatic.stale_layers, 2u);
  EXPECT_EQ(automatic.layers, 2u);
  // Pipelined after the warm-up and the profiling (later if a stall check re-planned k).
  EXPECT_GE(automatic.pipeline_start, kProfileWarmupIterations + 2);
  const double expected_fraction =
      automatic.stale_layers == 0 ? 0.0 : automatic.stale_layers == 1 ? 7840.0 / 7850 : 1.0;
  EXPECT_DOUBLE_EQ(automatic.stale_fraction, expected_fraction);
  for (std::size_t r = 1; r < summary.final_parameters.size(); ++r) {
    EXPECT_TRUE(equal(summary.final_parameters[r], summary.final_parameters[0])) << "rank " << r;
  }
}

// --dc-bound on bounds the DC scalar by Theorem 3's condition |lambda * (g . D)| <= 1 - 1/sqrt(2):
// with an absurd lambda every stale update is bounded and training stays finite.
TEST(SapipeDelayCompensation, HugeLambdaIsBoundedAndTrainingStaysFinite) {
  for (const char* spec : {"sapipe+dc+single", "sapipe+wp3+single"}) {
    SCOPED_TRACE(spec);
    const TrainConfig config =
        tiny_config(spec, 2, 0, {{"--stale-layers", "2"}, {"--dc-lambda", "1e6"}, {"--dc-bound", "on"}});
    const RunSummary summary = run_training(config, softmax_factory(), small_data());
    EXPECT_GT(facts_of(summary).bounded_compensations, 10);
    for (float w : summary.final_parameters[0]) ASSERT_TRUE(std::isfinite(w));
    EXPECT_TRUE(std::isfinite(summary.epochs.back().train_loss));
  }
}

// ---------------------------------------------------------------------------------------------
// 7. Adam.

TEST(SapipeAdam, AdamWorks) {
  TrainConfig config =
      tiny_config("sapipe+wp3", 2, 0, {{"--stale-layers", "1"}, {"--buckets", "single"}});
  config.method = reselect(config.method, {{"--optimizer", "adam"}}, SgdOptions{0.01f, 0.0f, 0.0f});
  const RunSummary summary = run_training(config, softmax_factory(), small_data());
  EXPECT_TRUE(std::isfinite(summary.figures.mean.loss));
  EXPECT_GT(summary.figures.mean.loss, 0);
  const std::unique_ptr<Model> initial = softmax_factory()(config.seed);
  const std::vector<float> start(initial->parameters().begin(), initial->parameters().end());
  for (const auto& final_weights : summary.final_parameters) {
    for (float w : final_weights) ASSERT_TRUE(std::isfinite(w));
    EXPECT_GT(max_abs_difference(final_weights, start), 1e-4);
    EXPECT_TRUE(equal(final_weights, summary.final_parameters[0]));
  }

  for (int warmup : {0, 3}) {
    SCOPED_TRACE(concat("warm-up ", warmup));
    const SgdOptions adam_rate{0.01f, 0.0f, 0.0f};
    TrainConfig sapipe = tiny_config("sapipe", 3);
    sapipe.method = reselect(sapipe.method,
                             {{"--optimizer", "adam"},
                              {"--stale-layers", "2"},
                              {"--compensation", "none"},
                              {"--buckets", "single"},
                              {"--warmup-iters", std::to_string(warmup)}},
                             adam_rate);
    TrainConfig pipe = tiny_config("pipe", 3);
    pipe.method = reselect(
        pipe.method, {{"--optimizer", "adam"}, {"--staleness-k", "2"}, {"--warmup-iters", std::to_string(warmup)}},
        adam_rate);
    const RunSummary a = run_training(sapipe, softmax_factory(), small_data());
    const RunSummary b = run_training(pipe, softmax_factory(), small_data());
    expect_same_final_parameters(a, b, 3);
  }
}

}  // namespace
}  // namespace pipesgd
