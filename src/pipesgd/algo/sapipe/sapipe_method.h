#pragma once
// The registry entry of SAPipe (`sapipe`, SAPipe paper; algo/sapipe/sapipe.h).
#include "pipesgd/algo/method_descriptor.h"

namespace pipesgd {

// `baseline`: the method spec compare's Table 2 form compares SAPipe with (SAPipe paper compares with Pipe-SGD).
MethodDescriptor sapipe_method(const std::string& baseline);

}  // namespace pipesgd
