#pragma once
// The registry entries of the D-Sync family (algo/registry.cpp lists them):
//   dsync      D-Sync (the Pipe-SGD paper's synchronous baseline), optionally layer-wise with a bucket
//              plan (--buckets PLAN or dsync+PLAN);
//   wfbp       layer-wise D-Sync with one bucket per layer (the MG-WFBP paper's WFBP);
//   synceasgd  layer-wise D-Sync with one bucket (SyncEASGD: one allreduce after backward, on the
//              comm thread);
//   mgwfbp     layer-wise D-Sync with MG-WFBP's merged buckets (MG-WFBP paper Alg. 1).
#include "pipesgd/algo/method_descriptor.h"

namespace pipesgd {

MethodDescriptor dsync_method();
MethodDescriptor wfbp_method();
MethodDescriptor synceasgd_method();
MethodDescriptor mgwfbp_method();

}  // namespace pipesgd
