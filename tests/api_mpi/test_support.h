#pragma once
// What the public API's MPI test programs share (api_mpi_main.cpp, api_session_main.cpp): a small
// user module and a check that throws.
#include <torch/torch.h>

#include <string>

#include "pipesgd/pipesgd.h"

namespace api_mpi_test {

struct NetImpl : torch::nn::Module {
  NetImpl() : fc1(register_module("fc1", torch::nn::Linear(4, 6))), fc2(register_module("fc2", torch::nn::Linear(6, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

inline void check(bool condition, const std::string& what) {
  if (!condition) throw pipesgd::Error("check failed: " + what);
}

}  // namespace api_mpi_test
