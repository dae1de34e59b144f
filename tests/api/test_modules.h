#pragma once
// Users' modules (not pipesgd's) shared by the API's tests, and how the tests compare weights.
#include <torch/torch.h>

#include <cmath>
#include <vector>

namespace pipesgd_test {

// A copy of the module's parameters (detached).
inline std::vector<torch::Tensor> clone_parameters(torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.detach().clone());
  return out;
}

// ||a - b|| / ||b|| over all the tensors together, in double.
inline double relative_error(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double diff = 0, norm = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    diff += (a[k].to(torch::kFloat64) - b[k].to(torch::kFloat64)).pow(2).sum().item<double>();
    norm += b[k].to(torch::kFloat64).pow(2).sum().item<double>();
  }
  return std::sqrt(diff / norm);
}

// Three parameter layers with ReLUs: 4 inputs, 3 classes (enough for every method's options).
struct ThreeLayerNetImpl : torch::nn::Module {
  ThreeLayerNetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(4, 8))), fc2(register_module("fc2", torch::nn::Linear(8, 8))),
        fc3(register_module("fc3", torch::nn::Linear(8, 3))) {}
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::relu(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(ThreeLayerNet);

// Layers registered in the opposite of the order its forward uses them ("last" 5->2 first,
// "first" 3->5 second): the first step's readiness rebuild puts "first" first.
struct ReversedImpl : torch::nn::Module {
  ReversedImpl() : last(register_module("last", torch::nn::Linear(5, 2))), first(register_module("first", torch::nn::Linear(3, 5))) {}
  torch::Tensor forward(torch::Tensor x) { return last(torch::tanh(first(x))); }
  torch::nn::Linear last, first;
};
TORCH_MODULE(Reversed);

}  // namespace pipesgd_test
