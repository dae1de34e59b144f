// A user's own convnet (batch norm, dropout) and own training loop on Fashion-MNIST, trained with
// Pipe-SGD and int8 gradients (`pipe+int8`) on 2 workers that are threads of this process.
//
//   fashion_convnet [ITERATIONS=60] [DATA_DIR=/usr/share/datasets/fashion-mnist] [METHOD=pipe+int8] [LR=0.01]
//
// Prints the mean training loss over the workers every 10 iterations; exits non-zero if the loss of
// the last 10 iterations is not below that of the first 10.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <pipesgd/pipesgd.h>
#include <torch/torch.h>

namespace {

// The user's own reader of a gzip'd IDX file (big-endian header: magic, dimensions, then bytes).
std::vector<std::uint8_t> read_idx_gz(const std::string& path, std::vector<std::int64_t>& dims) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw std::runtime_error("cannot open " + path);
  auto read_u32 = [&] {
    unsigned char b[4];
    if (gzread(file, b, 4) != 4) throw std::runtime_error("truncated " + path);
    return static_cast<std::int64_t>((std::uint32_t(b[0]) << 24) | (b[1] << 16) | (b[2] << 8) | b[3]);
  };
  const std::int64_t magic = read_u32();
  dims.assign(static_cast<std::size_t>(magic & 0xff), 0);
  std::int64_t total = 1;
  for (auto& d : dims) total *= (d = read_u32());
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(total));
  if (gzread(file, bytes.data(), static_cast<unsigned>(bytes.size())) != static_cast<int>(bytes.size())) {
    gzclose(file);
    throw std::runtime_error("truncated " + path);
  }
  gzclose(file);
  return bytes;
}

struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 5)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(8))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 5)))),
        dropout(register_module("dropout", torch::nn::Dropout(0.25))),
        fc(register_module("fc", torch::nn::Linear(16 * 4 * 4, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    return fc(dropout(x.flatten(1)));
  }
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::Dropout dropout;
  torch::nn::Linear fc;
};
TORCH_MODULE(ConvNet);

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::stoi(argv[1]) : 60;
  const std::string dir = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
  const std::string method = argc > 3 ? argv[3] : "pipe+int8";
  const float learning_rate = argc > 4 ? std::stof(argv[4]) : 0.01f;
  constexpr int kWorkers = 2;
  constexpr std::int64_t kBatch = 32;
  if (iterations < 20) {
    std::cerr << "fashion_convnet: ITERATIONS must be >= 20\n";
    return 2;
  }
  try {
    std::vector<std::int64_t> image_dims, label_dims;
    const auto images = read_idx_gz(dir + "/train-images-idx3-ubyte.gz", image_dims);
    const auto labels = read_idx_gz(dir + "/train-labels-idx1-ubyte.gz", label_dims);
    const torch::Tensor x = torch::from_blob(const_cast<std::uint8_t*>(images.data()), {image_dims[0], 1, 28, 28}, torch::kUInt8)
                                .to(torch::kFloat32)
                                .div_(255.0)
                                .sub_(0.2860)
                                .div_(0.3530);
    const torch::Tensor y = torch::from_blob(const_cast<std::uint8_t*>(labels.data()), {label_dims[0]}, torch::kUInt8).to(torch::kInt64);
    torch::set_num_threads(1);  // two workers share the cores

    std::vector<double> losses(static_cast<std::size_t>(iterations));
    pipesgd::run_threads(kWorkers, [&](pipesgd::Worker& worker) {
      torch::manual_seed(1 + worker.rank());  // any start: the optimizer broadcasts worker 0's weights
      ConvNet model;
      pipesgd::DistributedOptimizerOptions options;
      options.learning_rate = learning_rate;
      options.momentum = 0.9f;
      pipesgd::DistributedOptimizer optimizer(worker, model, method, options);
      model->train();
      for (int t = 0; t < iterations; ++t) {
        // Worker r's shard of the data: every kWorkers-th batch.
        const std::int64_t first = ((t * kWorkers + worker.rank()) * kBatch) % (x.size(0) - kBatch);
        torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x.slice(0, first, first + kBatch)),
                                                                 y.slice(0, first, first + kBatch));
        loss.backward();
        optimizer.step();
        torch::Tensor mean = loss.detach().reshape({1});
        worker.allreduce(mean, pipesgd::ReduceOp::kAverage);
        if (worker.rank() == 0) {
          losses[static_cast<std::size_t>(t)] = mean.item<double>();
          if ((t + 1) % 10 == 0) std::printf("iteration %d: loss %.4f\n", t + 1, mean.item<double>());
        }
      }
      optimizer.finish();
    });
    double first = 0, last = 0;
    for (int k = 0; k < 10; ++k) {
      first += losses[static_cast<std::size_t>(k)] / 10;
      last += losses[static_cast<std::size_t>(iterations - 10 + k)] / 10;
    }
    std::printf("%s, %d workers: mean loss of the first 10 iterations %.4f, of the last 10 %.4f\n", method.c_str(), kWorkers,
                first, last);
    if (!(last < first)) {
      std::fprintf(stderr, "fashion_convnet: the loss did not fall\n");
      return 1;
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "fashion_convnet: %s\n", error.what());
    return 1;
  }
  return 0;
}
