#pragma once
// The registry entry of Pipe-SGD (`pipe`, pipe-sgd.txt Alg. 1; algo/pipe/pipe_sgd.h).
#include "pipesgd/algo/method_descriptor.h"

namespace pipesgd {

MethodDescriptor pipe_method();

}  // namespace pipesgd
