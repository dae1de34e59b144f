#pragma once
// The registry entry of OD-SGD (`odsgd`, OD-SGD paper Alg. 1-2; algo/odsgd/od_sgd.h).
#include "pipesgd/algo/method_descriptor.h"

namespace pipesgd {

MethodDescriptor odsgd_method();

}  // namespace pipesgd
