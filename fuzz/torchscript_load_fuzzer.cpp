// Fuzzes the TorchScript load path of `--model PATH.pt` (torch/torchscript_load.h): arbitrary bytes
// given to check_torchscript_bytes, i.e. torch::jit::load from memory (LibTorch's zip reader and
// unpickler). Expected outcome for anything LibTorch cannot load: DataError with a one-line message
// naming the origin. Checked besides ASan/UBSan on our code: no other exception escapes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "pipesgd/core/error.h"
#include "pipesgd/torch/torchscript_model.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "torchscript_load_fuzzer: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    pipesgd::check_torchscript_bytes(bytes, "fuzz.pt");
  } catch (const pipesgd::DataError& error) {
    const std::string message = error.what();
    if (message.find('\n') != std::string::npos) finding("DataError message is not one line", message);
    if (message.find("'fuzz.pt'") == std::string::npos) finding("DataError message does not name the file", message);
  } catch (const std::exception& error) {
    finding("an exception other than DataError escaped", error.what());
  } catch (...) {
    finding("a non-standard exception escaped");
  }
  return 0;
}
