#pragma once
// The registry entry of Pipe-SGD (`pipe`, Pipe-SGD paper Alg. 1; algo/pipe/pipe_sgd.h).
#include "pipesgd/algo/method_descriptor.h"

namespace pipesgd {

MethodDescriptor pipe_method();

}  // namespace pipesgd
