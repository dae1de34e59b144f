#pragma once
// Users' modules (not pipesgd's) shared by the API's tests.
#include <torch/torch.h>

namespace pipesgd_test {

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
