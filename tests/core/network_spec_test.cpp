// Tests of parse_network_spec (the --net flag) and describe().
#include "pipesgd/comm/network_spec.h"

#include <gtest/gtest.h>

#include <cctype>
#include <string>
#include <vector>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

TEST(NetworkSpecParse, NoneAndEmptyMeanNoEmulation) {
  for (const std::string text : {"none", "", "NONE"}) {
    const NetworkSpec spec = parse_network_spec(text);
    EXPECT_FALSE(spec.emulated()) << "'" << text << "'";
    EXPECT_EQ(spec.bits_per_second, 0.0);
    EXPECT_EQ(spec.latency_seconds, 0.0);
  }
}

struct PresetCase {
  const char* name;
  double bits_per_second;
};

TEST(NetworkSpecParse, PresetsHaveTheirNominalBandwidthAndAPositiveLatency) {
  const std::vector<PresetCase> presets = {
      {"1gbe", 1e9}, {"10gbe", 10e9}, {"25gbe", 25e9}, {"100gbe", 100e9}};
  double previous_latency = 1.0;
  for (const PresetCase& preset : presets) {
    const NetworkSpec spec = parse_network_spec(preset.name);
    EXPECT_EQ(spec.bits_per_second, preset.bits_per_second) << preset.name;
    EXPECT_DOUBLE_EQ(spec.bytes_per_second(), preset.bits_per_second / 8) << preset.name;
    EXPECT_GT(spec.latency_seconds, 0.0) << preset.name;
    // Preset constants, not measured times.
    EXPECT_GT(1e-3, spec.latency_seconds) << preset.name << ": a LAN latency is microseconds";
    EXPECT_GE(previous_latency, spec.latency_seconds) << preset.name << ": faster class, no slower";
    previous_latency = spec.latency_seconds;
    EXPECT_TRUE(spec.emulated());
    EXPECT_EQ(spec.name, preset.name);
  }
  EXPECT_EQ(parse_network_spec("10GbE").bits_per_second, 10e9) << "presets are case-insensitive";
}

TEST(NetworkSpecParse, ExplicitBandwidthAndLatency) {
  const NetworkSpec spec = parse_network_spec("bw=2.5Gbit,lat=30us");
  EXPECT_DOUBLE_EQ(spec.bits_per_second, 2.5e9);
  EXPECT_DOUBLE_EQ(spec.latency_seconds, 30e-6);
  EXPECT_TRUE(spec.emulated());

  const NetworkSpec reversed = parse_network_spec("lat=30us,bw=2.5Gbit");
  EXPECT_DOUBLE_EQ(reversed.bits_per_second, 2.5e9);
  EXPECT_DOUBLE_EQ(reversed.latency_seconds, 30e-6);
}

TEST(NetworkSpecParse, LatencyAloneLeavesBandwidthUnlimited) {
  const NetworkSpec spec = parse_network_spec("lat=1ms");
  EXPECT_EQ(spec.bits_per_second, 0.0);
  EXPECT_DOUBLE_EQ(spec.latency_seconds, 1e-3);
  EXPECT_TRUE(spec.emulated());
}

TEST(NetworkSpecParse, BandwidthAloneHasZeroLatency) {
  const NetworkSpec spec = parse_network_spec("bw=100Mbit");
  EXPECT_DOUBLE_EQ(spec.bits_per_second, 100e6);
  EXPECT_EQ(spec.latency_seconds, 0.0);
  EXPECT_TRUE(spec.emulated());
}

TEST(NetworkSpecParse, EveryUnitScalesCorrectly) {
  EXPECT_DOUBLE_EQ(parse_network_spec("bw=7bit").bits_per_second, 7.0);
  EXPECT_DOUBLE_EQ(parse_network_spec("bw=7Kbit").bits_per_second, 7e3);
  EXPECT_DOUBLE_EQ(parse_network_spec("bw=7Mbit").bits_per_second, 7e6);
  EXPECT_DOUBLE_EQ(parse_network_spec("bw=7Gbit").bits_per_second, 7e9);
  EXPECT_DOUBLE_EQ(parse_network_spec("lat=7ns").latency_seconds, 7e-9);
  EXPECT_DOUBLE_EQ(parse_network_spec("lat=7us").latency_seconds, 7e-6);
  EXPECT_DOUBLE_EQ(parse_network_spec("lat=7ms").latency_seconds, 7e-3);
  EXPECT_DOUBLE_EQ(parse_network_spec("lat=7s").latency_seconds, 7.0);
  EXPECT_DOUBLE_EQ(parse_network_spec("lat=0us").latency_seconds, 0.0);
}

TEST(NetworkSpecDescribe, NamesBandwidthAndLatency) {
  EXPECT_EQ(describe(parse_network_spec("none")), "no emulation");
  const std::string text = describe(parse_network_spec("bw=2.5Gbit,lat=30us"));
  EXPECT_NE(text.find("2.5 Gbit/s"), std::string::npos) << text;
  EXPECT_NE(text.find("30 us"), std::string::npos) << text;
}

class MalformedNetworkSpec : public ::testing::TestWithParam<std::string> {};

TEST(NetworkSpecParse, MessageNamesTheOptionThatGaveIt) {
  try {
    parse_network_spec("2gbe", "--net");
    FAIL() << "'2gbe' was accepted";
  } catch (const UsageError& error) {
    EXPECT_EQ(std::string(error.what()).rfind("--net '2gbe': unknown preset", 0), 0u) << error.what();
  }
}

TEST_P(MalformedNetworkSpec, ThrowsUsageErrorWithAOneLineMessageNamingTheNetwork) {
  const std::string& text = GetParam();
  try {
    const NetworkSpec spec = parse_network_spec(text);
    FAIL() << "'" << text << "' was accepted as bw " << spec.bits_per_second << " bit/s, lat "
           << spec.latency_seconds << " s";
  } catch (const UsageError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.rfind("network", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, MalformedNetworkSpec,
    ::testing::Values("bw=", "bw=fastGbit", "bw=10Gbps2", "lat=5parsecs", "foo", "bw=-1Gbit",
                      "bw=1Gbit,bw=2Gbit", "xyz=3", "lat=1ms,lat=2ms", "bw=0Gbit", "bw=nanGbit",
                      "bw=infGbit", "lat=-3us", "bw=10", "lat=", "bw=1Gbit,foo", "2gbe"),
    [](const ::testing::TestParamInfo<std::string>& info) {
      std::string name;
      for (char c : info.param) {
        name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      }
      return "Case" + std::to_string(info.index) + "_" + name;
    });

}  // namespace
}  // namespace pipesgd
