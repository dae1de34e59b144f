// The shipped profiles of the papers' models (profiles/*.json, written by scripts/make_paper_profiles.py,
// documented in profiles/README.md): every file loads and validates; its parameter total is the
// architecture's exact count, computed here in closed form from the architectures (independently of
// the script) and equal to the published totals; its layer count, batch and forward order are as
// documented; every layer has a finite positive time with backward = 2 x forward; spot checks of
// times against their FLOPs at the stated device rates.
#include "pipesgd/timing/model_profile.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipesgd {
namespace {

std::string profile_path(const std::string& name) {
  return std::string(PIPESGD_SOURCE_DIR) + "/profiles/" + name + ".json";
}

// Parameter counts of the building blocks.
constexpr std::size_t linear(std::size_t in, std::size_t out) { return in * out + out; }
constexpr std::size_t conv_with_bias(std::size_t in, std::size_t out, std::size_t k) { return in * out * k * k + out; }
constexpr std::size_t conv_without_bias(std::size_t in, std::size_t out, std::size_t k) { return in * out * k * k; }
constexpr std::size_t batch_norm(std::size_t channels) { return 2 * channels; }  // weight and bias
// torchvision's BasicConv2d (GoogLeNet): a convolution without bias and a batch norm.
constexpr std::size_t basic_conv(std::size_t in, std::size_t out, std::size_t k) {
  return conv_without_bias(in, out, k) + batch_norm(out);
}

// ResNet-50 (He et al. 2016, Table 1): a 7x7 stem, then bottleneck stages of [3, 4, 6, 3] blocks
// 1x1 (mid) - 3x3 (mid) - 1x1 (4 mid), each conv followed by a batch norm; the first block of each
// stage has a 1x1 projection (conv + batch norm) of its input; a 2048-1000 classifier.
std::size_t resnet50_parameters() {
  std::size_t total = conv_without_bias(3, 64, 7) + batch_norm(64);
  std::size_t in = 64;
  const std::size_t mids[] = {64, 128, 256, 512};
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const std::size_t mid = mids[stage];
    const std::size_t out = 4 * mid;
    for (int block = 0; block < blocks[stage]; ++block) {
      total += conv_without_bias(in, mid, 1) + batch_norm(mid) + conv_without_bias(mid, mid, 3) + batch_norm(mid) +
               conv_without_bias(mid, out, 1) + batch_norm(out);
      if (block == 0) total += conv_without_bias(in, out, 1) + batch_norm(out);
      in = out;
    }
  }
  return total + linear(2048, 1000);
}

// GoogLeNet as torchvision builds it (Szegedy et al. 2015, Table 1, with batch norm after every conv
// and, in torchvision, a 3x3 instead of 5x5 kernel in the third branch of each inception module).
// Inception(in, 1x1, 3x3 reduce, 3x3, "5x5" reduce, "5x5", pool proj).
std::size_t googlenet_parameters(bool auxiliary_classifiers) {
  struct Inception {
    std::size_t in, ch1x1, ch3x3red, ch3x3, ch5x5red, ch5x5, pool_proj;
  };
  const Inception modules[] = {{192, 64, 96, 128, 16, 32, 32},     {256, 128, 128, 192, 32, 96, 64},
                               {480, 192, 96, 208, 16, 48, 64},    {512, 160, 112, 224, 24, 64, 64},
                               {512, 128, 128, 256, 24, 64, 64},   {512, 112, 144, 288, 32, 64, 64},
                               {528, 256, 160, 320, 32, 128, 128}, {832, 256, 160, 320, 32, 128, 128},
                               {832, 384, 192, 384, 48, 128, 128}};
  std::size_t total = basic_conv(3, 64, 7) + basic_conv(64, 64, 1) + basic_conv(64, 192, 3);
  for (const Inception& m : modules) {
    total += basic_conv(m.in, m.ch1x1, 1) + basic_conv(m.in, m.ch3x3red, 1) + basic_conv(m.ch3x3red, m.ch3x3, 3) +
             basic_conv(m.in, m.ch5x5red, 1) + basic_conv(m.ch5x5red, m.ch5x5, 3) + basic_conv(m.in, m.pool_proj, 1);
  }
  total += linear(1024, 1000);
  if (auxiliary_classifiers) {
    // After inception 4a (512 channels) and 4d (528): 1x1 conv to 128, 4x4x128 -> 1024 -> 1000.
    for (std::size_t in : {512, 528}) total += basic_conv(in, 128, 1) + linear(2048, 1024) + linear(1024, 1000);
  }
  return total;
}

// VGG-16 (Simonyan and Zisserman 2015, configuration D): 13 3x3 convolutions with bias, three
// classifier layers on the 7x7x512 features.
std::size_t vgg16_parameters() {
  const std::size_t channels[] = {3, 64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512};
  std::size_t total = 0;
  for (int i = 0; i < 13; ++i) total += conv_with_bias(channels[i], channels[i + 1], 3);
  return total + linear(7 * 7 * 512, 4096) + linear(4096, 4096) + linear(4096, 1000);
}

// AlexNet as torchvision builds it (Krizhevsky 2014, "One weird trick", single-GPU columns):
// conv 11x11 64, 5x5 192, 3x3 384, 3x3 256, 3x3 256; classifier 6x6x256 - 4096 - 4096 - 1000.
std::size_t alexnet_parameters() {
  return conv_with_bias(3, 64, 11) + conv_with_bias(64, 192, 5) + conv_with_bias(192, 384, 3) +
         conv_with_bias(384, 256, 3) + conv_with_bias(256, 256, 3) + linear(6 * 6 * 256, 4096) + linear(4096, 4096) +
         linear(4096, 1000);
}

// Pipe-SGD Sec. 4's MNIST-MLP: 784 inputs, two hidden layers of 500, 10 classes.
std::size_t mnist_mlp_parameters() { return linear(784, 500) + linear(500, 500) + linear(500, 10); }

struct Shipped {
  const char* file;
  std::size_t parameters;  // the closed form above
  std::size_t layers;      // profiles/README.md
  int batch;
  const char* first_layer;
  const char* last_layer;
};

std::vector<Shipped> shipped_profiles() {
  return {{"resnet50", resnet50_parameters(), 107, 32, "conv1", "fc"},
          {"googlenet", googlenet_parameters(false), 115, 64, "conv1.conv", "fc"},
          {"googlenet-aux", googlenet_parameters(true), 123, 64, "conv1.conv", "fc"},
          {"vgg16", vgg16_parameters(), 16, 128, "features.0", "classifier.6"},
          {"alexnet", alexnet_parameters(), 8, 64, "features.0", "classifier.6"},
          {"mnist-mlp", mnist_mlp_parameters(), 3, 25, "fc1", "fc3"}};
}

TEST(PaperProfiles, ClosedFormsEqualThePublishedCounts) {
  EXPECT_EQ(resnet50_parameters(), 25557032u);
  EXPECT_EQ(vgg16_parameters(), 138357544u);
  EXPECT_EQ(alexnet_parameters(), 61100840u);
  EXPECT_EQ(googlenet_parameters(false), 6624904u);
  EXPECT_EQ(googlenet_parameters(true), 13004888u);  // MG-WFBP Sec. V: "about 13 millions"
  EXPECT_EQ(mnist_mlp_parameters(), 648010u);
}

TEST(PaperProfiles, EveryProfileHasItsArchitecturesParametersLayersAndBatch) {
  for (const Shipped& expected : shipped_profiles()) {
    SCOPED_TRACE(expected.file);
    const ModelProfile profile = load_model_profile(profile_path(expected.file));
    EXPECT_EQ(profile.parameters(), expected.parameters);
    EXPECT_EQ(profile.layers.size(), expected.layers);
    EXPECT_EQ(profile.batch, expected.batch);
    ASSERT_FALSE(profile.layers.empty());
    EXPECT_EQ(profile.layers.front().name, expected.first_layer);  // forward order
    EXPECT_EQ(profile.layers.back().name, expected.last_layer);
    EXPECT_FALSE(profile.model.empty());
    EXPECT_NE(profile.source.find("make_paper_profiles.py"), std::string::npos) << profile.source;
    EXPECT_NO_THROW(validate_model_profile(profile, expected.file));
    // What the file says survives the runtime's own writer and reader.
    const ModelProfile again = model_profile_from_json(to_json(profile), expected.file);
    EXPECT_EQ(again.parameters(), profile.parameters());
    EXPECT_EQ(again.layers.size(), profile.layers.size());
    EXPECT_DOUBLE_EQ(again.compute_seconds(), profile.compute_seconds());
  }
}

TEST(PaperProfiles, EveryLayerHasAFinitePositiveTimeAndBackwardIsTwiceForward) {
  for (const Shipped& expected : shipped_profiles()) {
    SCOPED_TRACE(expected.file);
    const ModelProfile profile = load_model_profile(profile_path(expected.file));
    // Every layer owns parameters and does FLOPs (a conv, a batch norm or a linear layer).
    for (const ProfiledLayer& layer : profile.layers) {
      SCOPED_TRACE(layer.name);
      EXPECT_GT(layer.parameters, 0u);
      EXPECT_TRUE(std::isfinite(layer.forward_seconds));
      EXPECT_TRUE(std::isfinite(layer.backward_seconds));
      EXPECT_GT(layer.forward_seconds, 0.0);
      EXPECT_NEAR(layer.backward_seconds, 2 * layer.forward_seconds, 1e-5 * layer.backward_seconds);
    }
    EXPECT_EQ(profile.data_seconds, 0.0);
    EXPECT_GT(profile.update_seconds, 0.0);
    EXPECT_TRUE(std::isfinite(profile.compute_seconds()));
    EXPECT_TRUE(profile.codecs.empty());  // no paper gives a codec cost
  }
}

// The stated rates: 1.2e12 FLOP/s on one K80 GPU (27.5% of 2496 cores x 875 MHz x 2), the same
// fraction of a Titan XP's 3840 x 1582 MHz x 2; momentum SGD moves 20 bytes per parameter.
constexpr double kK80Rate = 1.2e12;
constexpr double kTitanXpRate = kK80Rate * (3840 * 1582e6 * 2) / (2496 * 875e6 * 2);

const ProfiledLayer& layer_named(const ModelProfile& profile, const std::string& name) {
  for (const ProfiledLayer& layer : profile.layers) {
    if (layer.name == name) return layer;
  }
  throw std::runtime_error("no layer " + name);
}

TEST(PaperProfiles, MlpTimesAreItsFlopsAtTheTitanXpRate) {
  const ModelProfile mlp = load_model_profile(profile_path("mnist-mlp"));
  const double batch = 25;
  const std::size_t widths[] = {784, 500, 500, 10};
  for (int i = 0; i < 3; ++i) {
    const ProfiledLayer& layer = mlp.layers[i];
    EXPECT_EQ(layer.parameters, linear(widths[i], widths[i + 1]));
    const double forward = 2.0 * widths[i] * widths[i + 1] * batch / kTitanXpRate;
    EXPECT_NEAR(layer.forward_seconds, forward, 1e-5 * forward) << layer.name;
  }
  const double update = 20.0 * mnist_mlp_parameters() / 547.7e9;
  EXPECT_NEAR(mlp.update_seconds, update, 1e-5 * update);
}

TEST(PaperProfiles, ConvolutionAndLinearTimesAreTheirFlopsAtTheK80Rate) {
  const ModelProfile resnet = load_model_profile(profile_path("resnet50"));
  // conv1: 7x7, 3 -> 64 channels, 112x112 outputs; fc: 2048 -> 1000; batch 32.
  const double conv1 = 2.0 * 3 * 7 * 7 * 64 * 112 * 112 * 32 / kK80Rate;
  EXPECT_NEAR(layer_named(resnet, "conv1").forward_seconds, conv1, 1e-5 * conv1);
  const double fc = 2.0 * 2048 * 1000 * 32 / kK80Rate;
  EXPECT_NEAR(layer_named(resnet, "fc").forward_seconds, fc, 1e-5 * fc);
  EXPECT_EQ(layer_named(resnet, "fc").parameters, linear(2048, 1000));
  // bn1: 7 FLOPs per output element, 64 x 112 x 112 outputs.
  const double bn1 = 7.0 * 64 * 112 * 112 * 32 / kK80Rate;
  EXPECT_NEAR(layer_named(resnet, "bn1").forward_seconds, bn1, 1e-5 * bn1);
  const double update = 20.0 * resnet50_parameters() / 240e9;
  EXPECT_NEAR(resnet.update_seconds, update, 1e-5 * update);

  const ModelProfile vgg = load_model_profile(profile_path("vgg16"));
  // The first classifier layer: 25088 -> 4096 at batch 128, and 74% of the model's parameters.
  const ProfiledLayer& fc6 = layer_named(vgg, "classifier.0");
  EXPECT_EQ(fc6.parameters, linear(7 * 7 * 512, 4096));
  const double fc6_forward = 2.0 * 25088 * 4096 * 128 / kK80Rate;
  EXPECT_NEAR(fc6.forward_seconds, fc6_forward, 1e-5 * fc6_forward);

  const ModelProfile alexnet = load_model_profile(profile_path("alexnet"));
  // conv1: 11x11 stride 4, 3 -> 64 channels, 55x55 outputs, batch 64.
  const double alexnet_conv1 = 2.0 * 3 * 11 * 11 * 64 * 55 * 55 * 64 / kK80Rate;
  EXPECT_NEAR(layer_named(alexnet, "features.0").forward_seconds, alexnet_conv1, 1e-5 * alexnet_conv1);
}

}  // namespace
}  // namespace pipesgd
