#pragma once
// What the subcommands of the `pipesgd` command share: the MPI session of a process started by
// mpirun with --transport mpi (passed explicitly to each subcommand, never held globally), lists
// on the command line, output directories.
#include <memory>
#include <string>
#include <vector>

#include "pipesgd/core/model.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/mpi/mpi_runtime.h"
#include "pipesgd/mpi/mpi_transport.h"
#include "pipesgd/train/run_config.h"

namespace pipesgd {

// The MPI side of a process started by mpirun with --transport mpi: one worker per rank.
struct MpiSession {
  MpiSession(int* argc, char*** argv) : runtime(argc, argv), transport(runtime) {}
  MpiRuntime runtime;
  MpiTransport transport;
  bool leader() const { return runtime.rank() == 0; }
};

// Checks --transport; returns true for mpi.
bool uses_mpi(const std::string& transport);

// Only rank 0 of an MPI run writes results to stdout (session: nullptr without MPI).
inline bool prints_results(const MpiSession* session) { return session == nullptr || session->leader(); }

// Under MPI the world size comes from mpirun; an explicit --workers must agree with it.
int resolve_workers(int workers, bool workers_given, const MpiSession* session);

// "a,b,c" -> {"a", "b", "c"}; UsageError for an empty list or entry.
std::vector<std::string> split_list(const std::string& text);

// The data set `data` (fashion-mnist: MNIST-format files in `dir`, default kDefaultDataDir;
// synthetic, from `seed`; or npy:DIR, NumPy files in DIR, which takes no `dir`). UsageError /
// DataError naming the flag or file.
DataSplits load_data_set(const std::string& data, const std::string& dir, std::int64_t seed);

// How summary.json names a data set: set "fashion-mnist", "synthetic" or "npy"; source the
// directory read or how the data was made.
struct DataSetDescription {
  std::string set;
  std::string source;
};
DataSetDescription describe_data_set(const std::string& data, const std::string& dir, std::int64_t seed);

// For the built-in models (torch_model_names(): 784 features, labels 0 to 9) only: UsageError naming
// the model and the data's shape if `data` does not fit `model` (another example size, regression
// targets, more classes); call it before any training. Any other model name passes (its own loader
// checks its data).
void check_data_fits_builtin_model(const std::string& model, const DataSplits& data, const std::string& data_flag);
// The --model help text shared by train, compare, plan and profile, and --loss's.
extern const char* const kModelFlagHelp;
extern const char* const kLossFlagHelp;
// train's (and compare's and profile's) --data and --data-dir help texts.
extern const char* const kDataFlagHelp;
std::string data_dir_flag_help();

// Checks --model and --loss before any data is read: a built-in model's name (torch_model_factory)
// and that --loss other than cross-entropy comes with a TorchScript file (built-ins are
// cross-entropy classifiers). A file itself is read by make_model_factory.
void check_model_flags(const std::string& model, const std::string& loss);

// The factory of --model for data like `train`: a built-in model, or a TorchScript file
// (torchscript_model_factory: loaded and probed here, errors name the file).
ModelFactory make_model_factory(const std::string& model, const std::string& loss, const Dataset& train);

// pipesgd's version: the git description of the source tree it was built from ("git unknown"
// without git).
std::string pipesgd_version();

// --out: a directory for every subcommand. Creates it and checks that files can be written there
// (before any work); "" when not given.
void prepare_output_directory(const std::string& dir);

// A run of the layer-wise profiling method (algo/registry.h: layer_wise_profiling_spec()) on
// `workers` threads over `network`, to the end of its first plan (warm-up + `profile_iterations`;
// `method_options` the method's other flags, e.g. --codec), without evaluation or progress output:
// how `plan` and `profile --in-run` measure a model as a run's workers compute. UsageError naming
// the flag for anything out of range (validate_train_config).
TrainConfig layer_wise_profiling_config(OptionValues method_options, std::int64_t profile_iterations, int workers,
                                        const std::string& model, std::int64_t batch, std::int64_t seed,
                                        const NetworkSpec& network);

}  // namespace pipesgd
