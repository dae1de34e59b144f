#pragma once
// A model's profile: what the simulator (pipesgd simulate, advise) knows of a model on a device.
// Measured by `pipesgd profile` (built-in and TorchScript models on this machine) or derived from a
// paper model's architecture (profiles/*.json, each stating its source and assumptions).
//
// File format (JSON, "format": "pipesgd-profile", "version": 1):
//   model, source     names and where the numbers come from (free text)
//   batch             examples per worker and iteration the times are for
//   data_seconds      loading one batch
//   update_seconds    the optimizer's update of every parameter
//   layers            forward order: [{name, parameters, forward_seconds, backward_seconds}]
//   codecs            {"none"|"bf16"|"int8": {encode, decode, decode_add}}: CPU seconds per fp32
//                     byte of gradient (encode reads them, decode and decode_add write them); a codec
//                     left out costs nothing
//   method_costs      optional {"<method>:<variant>": seconds per parameter}: work of a method's own
//                     measured by the method itself (MethodDescriptor::measure_costs), e.g.
//                     "sapipe:wp3", the stale range's compensated update per element and iteration;
//                     a method without its entry estimates the cost from update_seconds
//   bucket_launch_seconds  optional (0): kappa, the backward time each allreduce launched during
//                     backward takes from it (its comm thread's CPU time and wake-ups on the
//                     compute's cores), as the layer-wise methods measure it in a run
//                     (`pipesgd profile --in-run`); 0 = communication costs the computation nothing
#include <cstddef>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "pipesgd/core/layout.h"
#include "pipesgd/timing/bucket_plan.h"

namespace pipesgd {

// CPU seconds per fp32 byte a codec processes.
struct CodecCost {
  double encode = 0;
  double decode = 0;
  double decode_add = 0;
};

struct ProfiledLayer {
  std::string name;
  std::size_t parameters = 0;  // fp32 elements of its gradient
  double forward_seconds = 0;
  double backward_seconds = 0;
};

struct ModelProfile {
  std::string model;
  std::string source;
  int batch = 1;
  double data_seconds = 0;
  double update_seconds = 0;
  std::vector<ProfiledLayer> layers;
  std::map<std::string, CodecCost> codecs;
  std::map<std::string, double> method_costs;  // seconds per parameter, by "<method>:<variant>"
  double bucket_launch_seconds = 0;            // kappa (see the format above)

  std::size_t parameters() const;        // sum over layers
  double forward_seconds() const;        // sum over layers
  double backward_seconds() const;       // sum over layers
  double compute_seconds() const;        // data + forward + backward + update: l_up + l_comp
  CodecCost codec_cost(const std::string& codec) const;  // zero if not profiled
  const double* method_cost(const std::string& name) const;  // nullptr if not profiled
  // The update of `elements` of the parameters: update_seconds in proportion (0 without parameters).
  double update_seconds_of(std::size_t elements) const;
};

// The layers as a Layout (names and parameter counts): what the runtime's planners take.
Layout profile_layout(const ModelProfile& profile);

// Throws DataError ("<source>: <problem>", one line) unless the profile has at least one layer,
// a batch >= 1, finite non-negative times and codecs named none, bf16 or int8.
void validate_model_profile(const ModelProfile& profile, const std::string& source);

ModelProfile model_profile_from_json(const nlohmann::json& root, const std::string& source);
nlohmann::json to_json(const ModelProfile& profile);

// Loads and validates `path` (DataError naming the file and the problem).
ModelProfile load_model_profile(const std::string& path);
// Writes `path` atomically (validated first: DataError).
void save_model_profile(const ModelProfile& profile, const std::string& path);

// Every time multiplied by `scale` (> 0): a device `1/scale` times as fast (--compute-scale).
// Codec costs and bucket_launch_seconds are the comm thread's CPU costs and stay.
ModelProfile scale_compute(const ModelProfile& profile, double scale);

// The bucket planners' input (timing/bucket_plan.h): per-layer gradient bytes on the wire with
// `codec` (its encoded size), backward times, and t_f = data + update + forward.
LayerProfile layer_profile(const ModelProfile& profile, const std::string& codec);

}  // namespace pipesgd
