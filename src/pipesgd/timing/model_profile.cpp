#include "pipesgd/timing/model_profile.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "pipesgd/collective/codec_names.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/json_file.h"

namespace pipesgd {
namespace {

using json = nlohmann::json;
constexpr const char* kFormat = "pipesgd-profile";
constexpr int kVersion = 1;

[[noreturn]] void fail(const std::string& source, const std::string& problem) {
  throw DataError(concat(source, ": ", problem));
}

bool finite_nonnegative(double value) { return std::isfinite(value) && value >= 0; }

const json& field(const json& object, const char* name, const std::string& where, const std::string& source) {
  if (!object.is_object() || !object.contains(name)) fail(source, concat(where, "has no '", name, "'"));
  return object.at(name);
}

double number(const json& object, const char* name, const std::string& where, const std::string& source) {
  const json& value = field(object, name, where, source);
  if (!value.is_number()) fail(source, concat(where, "'", name, "' is not a number"));
  return value.get<double>();
}

std::string text(const json& object, const char* name, const std::string& where, const std::string& source) {
  const json& value = field(object, name, where, source);
  if (!value.is_string()) fail(source, concat(where, "'", name, "' is not a string"));
  return value.get<std::string>();
}

}  // namespace

std::size_t ModelProfile::parameters() const {
  std::size_t total = 0;
  for (const ProfiledLayer& layer : layers) total += layer.parameters;
  return total;
}

double ModelProfile::forward_seconds() const {
  double total = 0;
  for (const ProfiledLayer& layer : layers) total += layer.forward_seconds;
  return total;
}

double ModelProfile::backward_seconds() const {
  double total = 0;
  for (const ProfiledLayer& layer : layers) total += layer.backward_seconds;
  return total;
}

double ModelProfile::compute_seconds() const {
  return data_seconds + forward_seconds() + backward_seconds() + update_seconds;
}

CodecCost ModelProfile::codec_cost(const std::string& codec) const {
  const auto found = codecs.find(codec);
  return found == codecs.end() ? CodecCost{} : found->second;
}

const double* ModelProfile::method_cost(const std::string& name) const {
  const auto found = method_costs.find(name);
  return found == method_costs.end() ? nullptr : &found->second;
}

double ModelProfile::update_seconds_of(std::size_t elements) const {
  const std::size_t total = parameters();
  return total > 0 ? update_seconds * static_cast<double>(elements) / static_cast<double>(total) : 0;
}

Layout profile_layout(const ModelProfile& profile) {
  Layout layout;
  for (const ProfiledLayer& layer : profile.layers) layout.add(layer.name, layer.parameters);
  return layout;
}

void validate_model_profile(const ModelProfile& profile, const std::string& source) {
  if (profile.layers.empty()) fail(source, "has no layers");
  if (profile.batch < 1) fail(source, concat("batch must be at least 1, got ", profile.batch));
  if (!finite_nonnegative(profile.data_seconds)) fail(source, "data_seconds must be finite and >= 0");
  if (!finite_nonnegative(profile.update_seconds)) fail(source, "update_seconds must be finite and >= 0");
  for (std::size_t i = 0; i < profile.layers.size(); ++i) {
    const ProfiledLayer& layer = profile.layers[i];
    const std::string where = concat("layer ", i, " ('", layer.name, "'): ");
    if (!finite_nonnegative(layer.forward_seconds)) fail(source, where + "forward_seconds must be finite and >= 0");
    if (!finite_nonnegative(layer.backward_seconds)) fail(source, where + "backward_seconds must be finite and >= 0");
  }
  const std::vector<std::string> known = codec_names();
  for (const auto& [name, cost] : profile.codecs) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      fail(source, concat("unknown codec '", name, "' (expected none, bf16 or int8)"));
    }
    for (double value : {cost.encode, cost.decode, cost.decode_add}) {
      if (!finite_nonnegative(value)) fail(source, concat("codec ", name, ": costs must be finite and >= 0"));
    }
  }
  if (!finite_nonnegative(profile.bucket_launch_seconds)) fail(source, "bucket_launch_seconds must be finite and >= 0");
  for (const auto& [name, cost] : profile.method_costs) {
    if (!finite_nonnegative(cost)) fail(source, concat("method cost '", name, "' must be finite and >= 0"));
  }
}

ModelProfile model_profile_from_json(const json& root, const std::string& source) {
  if (!root.is_object()) fail(source, "is not a JSON object");
  if (!root.contains("format") || root.at("format") != kFormat) {
    fail(source, concat("is not a pipesgd profile (expected \"format\": \"", kFormat, "\")"));
  }
  const double version = number(root, "version", "", source);
  if (version != kVersion) fail(source, concat("has version ", version, "; this pipesgd reads version ", kVersion));
  ModelProfile profile;
  profile.model = text(root, "model", "", source);
  profile.source = root.contains("source") && root.at("source").is_string() ? root.at("source").get<std::string>() : "";
  const double batch = number(root, "batch", "", source);
  if (!(batch >= 1 && batch <= 1e9 && batch == std::floor(batch))) fail(source, "batch must be a whole number >= 1");
  profile.batch = static_cast<int>(batch);
  profile.data_seconds = number(root, "data_seconds", "", source);
  profile.update_seconds = number(root, "update_seconds", "", source);
  const json& layers = field(root, "layers", "", source);
  if (!layers.is_array()) fail(source, "'layers' is not an array");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string where = concat("layer ", i, ": ");
    ProfiledLayer layer;
    layer.name = text(layers[i], "name", where, source);
    const double parameters = number(layers[i], "parameters", where, source);
    if (!(parameters >= 0 && parameters <= 1e13 && parameters == std::floor(parameters))) {
      fail(source, where + "'parameters' must be a whole number >= 0");
    }
    layer.parameters = static_cast<std::size_t>(parameters);
    layer.forward_seconds = number(layers[i], "forward_seconds", where, source);
    layer.backward_seconds = number(layers[i], "backward_seconds", where, source);
    profile.layers.push_back(std::move(layer));
  }
  if (root.contains("codecs")) {
    const json& codecs = root.at("codecs");
    if (!codecs.is_object()) fail(source, "'codecs' is not an object");
    for (const auto& [name, cost] : codecs.items()) {
      const std::string where = concat("codec ", name, ": ");
      profile.codecs[name] = {number(cost, "encode", where, source), number(cost, "decode", where, source),
                              number(cost, "decode_add", where, source)};
    }
  }
  if (root.contains("method_costs")) {
    const json& costs = root.at("method_costs");
    if (!costs.is_object()) fail(source, "'method_costs' is not an object");
    for (const auto& [name, cost] : costs.items()) profile.method_costs[name] = number(costs, name.c_str(), "method_costs: ", source);
  }
  if (root.contains("bucket_launch_seconds")) {
    profile.bucket_launch_seconds = number(root, "bucket_launch_seconds", "", source);
  }
  validate_model_profile(profile, source);
  return profile;
}

json to_json(const ModelProfile& profile) {
  json root;
  root["format"] = kFormat;
  root["version"] = kVersion;
  root["model"] = profile.model;
  root["source"] = profile.source;
  root["batch"] = profile.batch;
  root["data_seconds"] = profile.data_seconds;
  root["update_seconds"] = profile.update_seconds;
  json layers = json::array();
  for (const ProfiledLayer& layer : profile.layers) {
    layers.push_back({{"name", layer.name},
                      {"parameters", layer.parameters},
                      {"forward_seconds", layer.forward_seconds},
                      {"backward_seconds", layer.backward_seconds}});
  }
  root["layers"] = std::move(layers);
  json codecs = json::object();
  for (const auto& [name, cost] : profile.codecs) {
    codecs[name] = {{"encode", cost.encode}, {"decode", cost.decode}, {"decode_add", cost.decode_add}};
  }
  root["codecs"] = std::move(codecs);
  if (!profile.method_costs.empty()) root["method_costs"] = profile.method_costs;
  if (profile.bucket_launch_seconds > 0) root["bucket_launch_seconds"] = profile.bucket_launch_seconds;
  return root;
}

ModelProfile load_model_profile(const std::string& path) {
  const std::string source = concat("profile file '", path, "'");
  return model_profile_from_json(read_json_file(path, source), source);
}

void save_model_profile(const ModelProfile& profile, const std::string& path) {
  validate_model_profile(profile, concat("cannot save profile to '", path, "'"));
  write_json_file(path, to_json(profile), "profile file");
}

ModelProfile scale_compute(const ModelProfile& profile, double scale) {
  if (!(scale > 0 && std::isfinite(scale))) {
    throw UsageError(concat("--compute-scale must be positive and finite, got ", scale));
  }
  ModelProfile scaled = profile;
  scaled.data_seconds *= scale;
  scaled.update_seconds *= scale;
  for (ProfiledLayer& layer : scaled.layers) {
    layer.forward_seconds *= scale;
    layer.backward_seconds *= scale;
  }
  return scaled;
}

LayerProfile layer_profile(const ModelProfile& profile, const std::string& codec) {
  LayerProfile layers;
  for (const ProfiledLayer& layer : profile.layers) {
    layers.bytes.push_back(static_cast<double>(codec_encoded_bytes(codec, layer.parameters)));
    layers.backward_seconds.push_back(layer.backward_seconds);
  }
  layers.forward_seconds = profile.data_seconds + profile.update_seconds + profile.forward_seconds();
  layers.per_bucket_compute_seconds = profile.bucket_launch_seconds;
  return layers;
}

}  // namespace pipesgd
