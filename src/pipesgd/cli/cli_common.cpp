#include "pipesgd/cli/cli_common.h"

#include <sstream>

#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd_version.h"  // generated at build time (CMakeLists.txt)

namespace pipesgd {

bool uses_mpi(const std::string& transport) {
  if (transport == "local") return false;
  if (transport == "mpi") return true;
  throw UsageError(concat("--transport '", transport, "': expected local or mpi"));
}

int resolve_workers(int workers, bool workers_given, const MpiSession* session) {
  if (session == nullptr) return workers;
  if (workers_given && workers != session->runtime.size()) {
    throw UsageError(concat("--workers ", workers, " does not match the ", session->runtime.size(),
                            " MPI ranks (mpirun -np); leave --workers out under --transport mpi"));
  }
  return session->runtime.size();
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (item.empty()) throw UsageError(concat("empty entry in list '", text, "'"));
    items.push_back(item);
  }
  if (items.empty()) throw UsageError("empty list");
  return items;
}

DataSplits load_data_set(const std::string& data, const std::string& dir, std::int64_t seed) {
  if (data == "synthetic") {
    if (!dir.empty()) throw UsageError("--data-dir cannot be combined with --data synthetic");
    return make_synthetic(12000, 2000, static_cast<std::uint64_t>(seed));
  }
  if (data != "fashion-mnist" && data != "mnist-format") {
    throw UsageError(concat("unknown data set '", data, "' (expected fashion-mnist or synthetic)"));
  }
  return load_mnist_format(dir.empty() ? kDefaultDataDir : dir);
}

std::string pipesgd_version() { return PIPESGD_VERSION; }

void prepare_output_directory(const std::string& dir) {
  if (!dir.empty()) ensure_writable_directory(dir, "--out");
}

}  // namespace pipesgd
