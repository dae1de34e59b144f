// AllreduceMeter, ScopedAllreduceMeter (collective/allreduce_meter.h) and TracedAllreduce's use of
// them (collective/traced_allreduce.h): a TracedAllreduce records into the meter installed on the
// thread that built it, whichever thread runs it: one call, the fp32 bytes (4 per element whatever
// the codec) and the running thread's CPU time per run. Built without a meter it records nothing.
#include "pipesgd/collective/allreduce_meter.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "allreduce_test_support.h"
#include "pipesgd/collective/codec.h"
#include "pipesgd/collective/ring_allreduce.h"
#include "pipesgd/collective/traced_allreduce.h"
#include "pipesgd/core/clock.h"
#include "test_world.h"

namespace pipesgd {
namespace {

// An allreduce that leaves the data alone and keeps the calling thread's processor busy until the
// thread's CPU clock has advanced by `cpu_seconds`: the CPU time of a run is at least that.
class SpinningAllreduce final : public Allreduce {
 public:
  explicit SpinningAllreduce(double cpu_seconds) : cpu_seconds_(cpu_seconds) {}
  std::string_view name() const override { return "spinning"; }
  void run(std::span<float>, Tag) override {
    const double start = thread_cpu_seconds();
    volatile std::uint64_t turns = 0;
    while (thread_cpu_seconds() - start < cpu_seconds_) turns = turns + 1;
  }

 private:
  double cpu_seconds_;
};

std::uint64_t calls(const AllreduceMeter& meter) { return meter.calls.load(); }
std::uint64_t bytes(const AllreduceMeter& meter) { return meter.bytes.load(); }
std::uint64_t cpu_ns(const AllreduceMeter& meter) { return meter.cpu_nanoseconds.load(); }

// What the calling thread sees installed, asked from a thread of its own.
AllreduceMeter* installed_on_a_new_thread() {
  AllreduceMeter* seen = reinterpret_cast<AllreduceMeter*>(1);
  std::thread other([&] { seen = current_allreduce_meter(); });
  other.join();
  return seen;
}

TEST(ScopedAllreduceMeter, InstallsPerThreadAndRestoresThePreviousMeterWhenNested) {
  std::thread fresh([] {
    AllreduceMeter outer, inner;
    EXPECT_EQ(current_allreduce_meter(), nullptr);
    {
      const ScopedAllreduceMeter a(&outer);
      EXPECT_EQ(current_allreduce_meter(), &outer);
      EXPECT_EQ(installed_on_a_new_thread(), nullptr) << "a meter leaked to another thread";
      {
        const ScopedAllreduceMeter b(&inner);
        EXPECT_EQ(current_allreduce_meter(), &inner);
        {
          const ScopedAllreduceMeter none(nullptr);
          EXPECT_EQ(current_allreduce_meter(), nullptr);
        }
        EXPECT_EQ(current_allreduce_meter(), &inner);
      }
      EXPECT_EQ(current_allreduce_meter(), &outer);
    }
    EXPECT_EQ(current_allreduce_meter(), nullptr);
  });
  fresh.join();
}

TEST(AllreduceMeter, RecordAddsCpuNanosecondsBytesAndOneCall) {
  AllreduceMeter meter;
  meter.record(0.25, 4000);
  meter.record(1.5e-6, 12);
  meter.record(-1.0, 8);  // a clock that went backwards adds no time
  EXPECT_EQ(calls(meter), 3u);
  EXPECT_EQ(bytes(meter), 4020u);
  EXPECT_EQ(cpu_ns(meter), 250000000u + 1500u);
}

// ---------------------------------------------------------------------------------------------
// TracedAllreduce over a ring of 2 ranks (two threads of a LocalFabric).

struct MeteredCase {
  std::string codec;
};
void PrintTo(const MeteredCase& c, std::ostream* out) { *out << "codec " << c.codec; }

class TracedAllreduceMetering : public ::testing::TestWithParam<MeteredCase> {};

TEST_P(TracedAllreduceMetering, RecordsEveryRunsFp32BytesAndCpuTimeIntoTheBuildersMeter) {
  const std::unique_ptr<Codec> codec = make_codec(GetParam().codec);
  constexpr std::size_t kLarge = std::size_t{1} << 20;
  const std::vector<std::size_t> counts = {kLarge, 1000, 0, kLarge};
  std::vector<AllreduceMeter> meters(2);
  std::vector<std::vector<float>> results(2);
  run_ranks(2, [&](int rank, Transport& transport) {
    const ScopedAllreduceMeter installed(&meters[static_cast<std::size_t>(rank)]);
    TracedAllreduce allreduce(std::make_unique<RingAllreduce>(transport, kLarge, *codec, patient_options), *codec);
    Tag tag = 1;
    for (std::size_t count : counts) {
      std::vector<float> data = values_of_rank(GetParam().codec, rank, count);
      allreduce.run(data, tag++);
      results[static_cast<std::size_t>(rank)] = std::move(data);
    }
  });
  std::uint64_t fp32_bytes = 0;
  for (std::size_t count : counts) fp32_bytes += 4 * count;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(::testing::Message() << "rank " << rank);
    const AllreduceMeter& meter = meters[static_cast<std::size_t>(rank)];
    EXPECT_EQ(calls(meter), counts.size());
    EXPECT_EQ(bytes(meter), fp32_bytes) << "not 4 bytes per element (the codec's bytes?)";
    EXPECT_GT(cpu_ns(meter), 0u) << "a million-element allreduce cost no CPU time";
  }
  // The meter only watches: the sums are what the ring gives.
  const bool exact = GetParam().codec == "none";
  expect_close_to_sum(results[0], expected_sum(GetParam().codec, 2, kLarge),
                      exact ? 0.0 : ring_error_bound(*codec, 2, largest_mixed_magnitude), exact);
  expect_bit_identical_across_ranks(results);
}

INSTANTIATE_TEST_SUITE_P(Codecs, TracedAllreduceMetering,
                         ::testing::Values(MeteredCase{"none"}, MeteredCase{"int8"}, MeteredCase{"bf16"}),
                         [](const ::testing::TestParamInfo<MeteredCase>& info) { return info.param.codec; });

TEST(TracedAllreduceMetering, BuiltWithoutAMeterRecordsNothingEvenWhereOneIsInstalledLater) {
  const std::unique_ptr<Codec> codec = make_codec("none");
  std::vector<AllreduceMeter> meters(2);
  run_ranks(2, [&](int rank, Transport& transport) {
    TracedAllreduce allreduce(std::make_unique<RingAllreduce>(transport, 4096, *codec, patient_options), *codec);
    // Installed after the build, on the running thread: not the allreduce's meter.
    const ScopedAllreduceMeter installed(&meters[static_cast<std::size_t>(rank)]);
    std::vector<float> data = values_of_rank("none", rank, 4096);
    allreduce.run(data, 1);
    allreduce.run(data, 2);
  });
  for (const AllreduceMeter& meter : meters) {
    EXPECT_EQ(calls(meter), 0u);
    EXPECT_EQ(bytes(meter), 0u);
    EXPECT_EQ(cpu_ns(meter), 0u);
  }
}

// The meter is the building thread's; the time is the running thread's CPU clock (here a thread
// without a meter of its own), and at least what the run kept its processor busy.
TEST(TracedAllreduceMetering, RecordsTheRunningThreadsCpuTimeIntoTheMeterInstalledWhereItWasBuilt) {
  const std::unique_ptr<Codec> codec = make_codec("none");
  constexpr double kSpin = 0.005;
  AllreduceMeter builders, runners;
  std::unique_ptr<TracedAllreduce> allreduce;
  {
    const ScopedAllreduceMeter installed(&builders);
    allreduce = std::make_unique<TracedAllreduce>(std::make_unique<SpinningAllreduce>(kSpin), *codec);
  }  // uninstalled: the allreduce keeps the meter it was built with
  std::thread runner([&] {
    const ScopedAllreduceMeter other(&runners);
    std::vector<float> data(250);
    allreduce->run(data, 1);
    allreduce->run(std::span<float>(data).first(10), 2);
  });
  runner.join();
  EXPECT_EQ(calls(builders), 2u);
  EXPECT_EQ(bytes(builders), 4u * (250 + 10));
  EXPECT_GE(cpu_ns(builders), static_cast<std::uint64_t>(2 * kSpin * 1e9));
  EXPECT_EQ(calls(runners), 0u);
  EXPECT_EQ(cpu_ns(runners), 0u);
}

}  // namespace
}  // namespace pipesgd
