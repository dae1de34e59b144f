#pragma once
// Loading TorchScript bytes (torch.jit.save's zip file) with every failure turned into our one-line
// error. Includes LibTorch, so only code under src/pipesgd/torch/ includes it; its .cpp compiles as
// C++17 too (the fuzz build compiles it with clang in C++17: LibTorch 1.13's headers do not compile
// with clang 14 in C++20).
#include <torch/script.h>

#include <exception>
#include <string>
#include <string_view>

namespace pipesgd {

// The module in `bytes`, on the CPU. Throws DataError("model file '<name>' is not a TorchScript
// module saved by torch.jit.save (<LibTorch's reason>)") for anything LibTorch cannot load.
torch::jit::Module load_torchscript(std::string_view bytes, const std::string& name);

// Loads and discards (declared for torch-free callers in torchscript_model.h).
void check_torchscript_bytes(std::string_view bytes, const std::string& name);

// One line of a LibTorch error: the first, without the C++ backtrace; for an error raised inside the
// TorchScript interpreter (which prints the script's traceback first), the last.
std::string torch_error_line(const std::exception& error);

}  // namespace pipesgd
