#pragma once
// summary.json's "configuration": everything the run was asked to do, resolved: the command line,
// seed, learning rate and its schedule, optimizer and its hyper-parameters, method (spec, options
// given, options in effect, warm-up, staleness), model, data set, workers and servers, batch and
// length, transport and network, reliability options, and the versions the run was built with.
#include <nlohmann/json.hpp>

#include "pipesgd/core/model.h"
#include "pipesgd/train/run_context.h"

namespace pipesgd {

nlohmann::json describe_configuration(const RunContext& run, const FlatParameters& model);

}  // namespace pipesgd
