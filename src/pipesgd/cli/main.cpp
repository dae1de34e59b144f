// The `pipesgd` command: train, compare, bench allreduce.
#include <CLI/CLI.hpp>

#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>
#include <thread>

#include "pipesgd/algo/bucketed_dsync.h"
#include "pipesgd/algo/od_sgd.h"
#include "pipesgd/algo/ps_methods.h"
#include "pipesgd/algo/sapipe.h"
#include "pipesgd/collective/allreduce_factory.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/comm/timeout.h"
#include "pipesgd/core/error.h"
#include "pipesgd/data/dataset.h"
#include "pipesgd/mpi/mpi_library_allreduce.h"
#include "pipesgd/mpi/mpi_transport.h"
#include "pipesgd/timing/allreduce_cost_model.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/train/allreduce_benchmark.h"
#include "pipesgd/train/planning.h"
#include "pipesgd/train/report.h"
#include "pipesgd/train/trainer.h"

namespace pipesgd {
namespace {

// The MPI side of a process started by mpirun with --transport mpi: one worker per rank.
struct MpiSession {
  MpiSession(int* argc, char*** argv) : runtime(argc, argv), transport(runtime) {}
  MpiRuntime runtime;
  MpiTransport transport;
  bool leader() const { return runtime.rank() == 0; }
};
// Set while the process runs under --transport mpi; errors are then reported to the other ranks.
MpiSession* active_mpi_session = nullptr;

// Checks an algorithm name (or "auto" where allowed) against collective/allreduce_factory.h.
void check_allreduce_name(const std::string& name, const char* flag, bool auto_allowed) {
  const std::vector<std::string> names = allreduce_algorithm_names();
  if (auto_allowed && name == "auto") return;
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  throw UsageError(concat(flag, " '", name, "': expected ", join(names), auto_allowed ? ", or auto" : ""));
}

// Checks --transport; returns true for mpi.
bool uses_mpi(const std::string& transport) {
  if (transport == "local") return false;
  if (transport == "mpi") return true;
  throw UsageError(concat("--transport '", transport, "': expected local or mpi"));
}

// Under MPI the world size comes from mpirun; an explicit --workers must agree with it.
int resolve_workers(int workers, bool workers_given, MpiSession* session) {
  if (!session) return workers;
  if (workers_given && workers != session->runtime.size()) {
    throw UsageError(concat("--workers ", workers, " does not match the ", session->runtime.size(),
                            " MPI ranks (mpirun -np); leave --workers out under --transport mpi"));
  }
  return session->runtime.size();
}

// Flags shared by `train` and `compare`, as typed, before validation.
struct TrainFlags {
  int workers = 4;
  int servers = 0;
  std::string model = "mlp";
  std::string data = "fashion-mnist";
  std::string data_dir;
  std::int64_t epochs = 1;
  std::int64_t iterations = 0;
  std::int64_t seed = 1;
  // Plain SGD at 0.1: the setting of the Pipe-SGD paper's analysis; stale gradients under heavy
  // momentum overshoot (see docs/results.md), so momentum is opt-in.
  float learning_rate = 0.1f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  std::int64_t batch = 25;
  int staleness = 2;
  std::int64_t warmup_epochs = 0;
  std::int64_t warmup_iterations = 0;
  std::string codec = "none";
  std::string network = "none";
  double comm_timeout_seconds = 120;
  std::string segment_bytes = "auto";
  std::string out_dir;
  std::string transport = "local";
  std::string allreduce = "ring";
  std::string calibration_file;
  // DC-ASGD (dcasgd's servers; odsgd's dcasgd-* local updaters) and OD-SGD's local updater.
  std::string dc_variant = "c";
  float dc_lambda = 0.04f;
  float dc_momentum = 0.95f;
  std::string local_updater = "sgd";
  float local_learning_rate = 0;
  // Layer-wise communication (dsync and its plans).
  std::string buckets;
  std::int64_t profile_iterations = 10;
  std::int64_t replan_every = 0;
  // sapipe.
  std::string stale_layers = "auto";
  std::string compensation = "none";
  // The optimizer (dsync, pipe, layer-wise, sapipe).
  std::string optimizer = "sgd";
  float adam_beta1 = 0.9f, adam_beta2 = 0.999f, adam_epsilon = 1e-8f;
  // Reliability.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  bool resume = false;
  std::string on_nonfinite = "stop";
  std::int64_t check_consistency = 0;
  std::string inject_fault;
  bool quiet = false;
  bool no_eval = false;
  bool workers_given = false;  // --workers appeared on the command line
  std::set<std::string> given;  // the method-specific flags that appeared (see method_flags_given)
};

// Flags that apply to some methods only: `train` rejects them for the others, `compare` applies
// them to the methods of its list they concern.
const std::vector<std::string> kMethodSpecificFlags = {
    "--dc-variant", "--dc-lambda", "--dc-momentum", "--local-updater", "--local-lr",
    "--warmup-iters", "--warmup-epochs", "--buckets", "--profile-iters", "--replan-every",
    "--stale-layers", "--compensation"};

void add_train_flags(CLI::App& command, TrainFlags& flags) {
  command.add_option("--workers", flags.workers,
                     "Workers: threads of this process (--transport local); under mpi the ranks")
      ->capture_default_str();
  command.add_option("--servers", flags.servers,
                     "Parameter-server ranks of pssync, asgd, dcasgd and odsgd (threads after the workers; under "
                     "--transport mpi the last S ranks of mpirun -np); 0 = 1 for those methods, "
                     "rejected by the others")
      ->capture_default_str();
  command.add_option("--transport", flags.transport,
                     "local (workers are threads of this process) or mpi (one worker per rank of "
                     "mpirun -np N)")
      ->capture_default_str();
  command.add_option("--allreduce", flags.allreduce,
                     "Allreduce algorithm: ring, recursive-doubling, halving-doubling, tree, direct, or "
                     "auto (least predicted time from --calibration, else the default model)")
      ->capture_default_str();
  command.add_option("--calibration", flags.calibration_file,
                     "Calibration JSON written by `pipesgd calibrate` (the cost model of --allreduce auto)");
  command.add_option("--model", flags.model, "Model: mlp (784-500-500-10), cnn (LeNet-style), resnet (ResNet-20-style with batch norm), softmax")
      ->capture_default_str();
  command.add_option("--data", flags.data,
                     "Data set: fashion-mnist (MNIST-format files, see --data-dir) or synthetic")
      ->capture_default_str();
  command.add_option("--data-dir", flags.data_dir,
                     std::string("Directory of MNIST-format IDX files (gzip or plain) [default: ") +
                         kDefaultDataDir + "]");
  command.add_option("--epochs", flags.epochs, "Epochs to train")->capture_default_str();
  command.add_option("--iters", flags.iterations, "Train exactly this many iterations instead of --epochs");
  command.add_option("--seed", flags.seed, "Seed of the model initialisation and data shuffling")
      ->capture_default_str();
  command.add_option("--lr", flags.learning_rate, "SGD learning rate")->capture_default_str();
  command.add_option("--momentum", flags.momentum, "SGD momentum")->capture_default_str();
  command.add_option("--weight-decay", flags.weight_decay, "SGD weight decay (L2)")->capture_default_str();
  command.add_option("--batch", flags.batch,
                     "Per-worker batch (4 workers x 25 = the paper's global batch of 100)")
      ->capture_default_str();
  command.add_option("--staleness-k", flags.staleness,
                     "Pipe-SGD iteration dependency K: the update at t uses the gradient of t-K")
      ->capture_default_str();
  command.add_option("--warmup-epochs", flags.warmup_epochs,
                     "Synchronous epochs first: pipe runs them as D-Sync, odsgd trains them on the "
                     "global weights [default: 0]");
  command.add_option("--warmup-iters", flags.warmup_iterations,
                     concat("Synchronous iterations first, after --warmup-epochs (pipe: D-Sync; odsgd: the "
                            "warm-up and switching stage) [default: 0; odsgd: ",
                            kOdSgdDefaultWarmupIterations, " if neither warm-up flag is given]"));
  command.add_option("--dc-variant", flags.dc_variant,
                     "dcasgd: the servers' delay compensation, c (DC-ASGD-c, Eq. 4) or a (DC-ASGD-a, "
                     "Eq. 5-6)")
      ->capture_default_str();
  command.add_option("--dc-lambda", flags.dc_lambda,
                     "Delay compensation lambda (dcasgd; odsgd with --local-updater dcasgd-c|dcasgd-a; "
                     "sapipe with --compensation dc|wp3, where its default is the paper's 0.2)")
      ->capture_default_str();
  command.add_option("--dc-momentum", flags.dc_momentum,
                     "m of Eq. 6, the decay of DC-ASGD-a's mean square (--dc-variant a; --local-updater "
                     "dcasgd-a)")
      ->capture_default_str();
  command.add_option("--local-updater", flags.local_updater,
                     "odsgd: how a worker updates the pulled weights with its own gradient: sgd, "
                     "dcasgd-c or dcasgd-a")
      ->capture_default_str();
  command.add_option("--local-lr", flags.local_learning_rate,
                     "odsgd: the local updater's learning rate [default: --lr]");
  command.add_option("--buckets", flags.buckets,
                     "dsync: layer-wise allreduce of buckets of consecutive layers, launched as backward "
                     "makes them ready: wfbp (one per layer), single (one after backward, SyncEASGD), "
                     "mgwfbp (MG-WFBP Alg. 1), optimal (exact DP), fixed:<MiB> (DDP-like) [default: none, "
                     "one allreduce after backward on the compute thread]");
  command.add_option("--profile-iters", flags.profile_iterations,
                     "Layer-wise methods: iterations profiled before the plan is computed (the first half "
                     "with one bucket: per-layer backward times; the rest with one bucket per layer: the "
                     "slowdown each allreduce causes)")
      ->capture_default_str();
  command.add_option("--replan-every", flags.replan_every,
                     "Layer-wise methods: start a new profiling cycle (and plan) N iterations after each "
                     "plan (0: never)")
      ->capture_default_str();
  command.add_option("--stale-layers", flags.stale_layers,
                     "sapipe: how many first layers train on 1-step-stale gradients: auto (the least k whose "
                     "pipeline never stalls, from the profiled layer times and the allreduce cost) or a count")
      ->capture_default_str();
  command.add_option("--compensation", flags.compensation,
                     "sapipe: staleness compensation of the stale layers: none, dc (delay compensation, "
                     "Alg. 2), wp1|wp2|wp3 (weight prediction with the local, the synchronized, or the "
                     "combined gradient, Alg. 3); a method's +dc etc. overrides it")
      ->capture_default_str();
  command.add_option("--optimizer", flags.optimizer,
                     "Optimizer of dsync, pipe, the layer-wise methods and sapipe: sgd or adam (its learning "
                     "rate is --lr, its L2 --weight-decay); the parameter-server methods run sgd")
      ->capture_default_str();
  command.add_option("--adam-beta1", flags.adam_beta1, "Adam: first-moment decay")->capture_default_str();
  command.add_option("--adam-beta2", flags.adam_beta2, "Adam: second-moment decay")->capture_default_str();
  command.add_option("--adam-eps", flags.adam_epsilon, "Adam: epsilon")->capture_default_str();
  command.add_option("--checkpoint-dir", flags.checkpoint_dir,
                     "Directory of checkpoints: written every --checkpoint-every iterations (atomically, with a "
                     "checksum; the 2 newest complete ones are kept), read by --resume");
  command.add_option("--checkpoint-every", flags.checkpoint_every,
                     "Write a checkpoint every N iterations (every method; parameter servers write their shards too; 0: never)")
      ->capture_default_str();
  command.add_flag("--resume", flags.resume,
                   "Continue from the newest complete, valid checkpoint in --checkpoint-dir (torn or corrupt "
                   "ones are skipped with a warning); the result is bit-identical to an uninterrupted run");
  command.add_option("--on-nonfinite", flags.on_nonfinite,
                     "A NaN or Inf in a worker's gradient, found before it is sent: stop (the run ends naming "
                     "the rank, layer and iteration) or skip (that layer's gradient is replaced by zeros, "
                     "with a warning)")
      ->capture_default_str();
  command.add_option("--check-consistency", flags.check_consistency,
                     "Every N iterations the workers compare a checksum of their weights; a difference "
                     "stops the run naming the ranks (dsync, its plans, pipe, sapipe, pssync; 0: never)")
      ->capture_default_str();
  command.add_option("--inject-fault", flags.inject_fault,
                     "Testing: rank=R,iter=N,kind=crash|hang[,at=iteration|checkpoint|allreduce|push] "
                     "makes worker R die (crash) or go silent (hang) at the start of iteration N "
                     "(at=iteration), mid-write of its checkpoint after N (at=checkpoint), mid-way through "
                     "N's gradient allreduce (at=allreduce, allreduce methods) or N's push to the servers "
                     "(at=push, pssync, asgd, dcasgd, odsgd); the others must exit within --comm-timeout");
  command.add_option("--codec", flags.codec,
                     "Gradient codec inside the allreduce: none, bf16 (16-bit truncation), int8 "
                     "(8-bit quantization); a method's +codec overrides it")
      ->capture_default_str();
  command.add_option("--net", flags.network,
                     "Emulated network per worker: none, 1gbe, 10gbe, 25gbe, 100gbe or "
                     "bw=2.5Gbit,lat=30us")
      ->capture_default_str();
  command.add_option("--comm-timeout", flags.comm_timeout_seconds,
                     "Seconds any wait on a peer may take before the run fails")
      ->capture_default_str();
  command.add_option("--segment-bytes", flags.segment_bytes,
                     "Allreduce message segment size: auto (D-Sync 256K, Pipe-SGD unsegmented), none "
                     "(unsegmented) or a size such as 256K")
      ->capture_default_str();
  command.add_option("--out", flags.out_dir, "Write metrics.jsonl and summary.json (compare: compare.json) here");
  command.add_flag("--quiet", flags.quiet, "No progress output");
  command.add_flag("--no-eval", flags.no_eval, "Skip the test-set evaluation after each epoch");
}

// Which methods a method-specific flag concerns (given the local updater of odsgd).
bool flag_applies(const std::string& flag, const std::string& method, const TrainFlags& flags) {
  const bool adaptive_local = flags.local_updater == "dcasgd-a";
  const bool compensating_local = flags.local_updater != "sgd";
  if (flag == "--dc-variant") return method == "dcasgd";
  if (flag == "--dc-lambda") {
    return method == "dcasgd" || (method == "odsgd" && compensating_local) || method == "sapipe";
  }
  if (flag == "--dc-momentum") {
    return (method == "dcasgd" && flags.dc_variant == "a") || (method == "odsgd" && adaptive_local);
  }
  if (flag == "--local-updater" || flag == "--local-lr") return method == "odsgd";
  if (flag == "--warmup-iters" || flag == "--warmup-epochs") {
    return method == "pipe" || method == "odsgd" || method == "sapipe";
  }
  if (flag == "--buckets") return method == "dsync" || method == "sapipe";
  if (flag == "--profile-iters") return method == "dsync" || method == "sapipe" || !implied_bucket_plan(method).empty();
  if (flag == "--replan-every") return method == "dsync" || !implied_bucket_plan(method).empty();
  if (flag == "--stale-layers" || flag == "--compensation") return method == "sapipe";
  return true;
}

std::string flag_users(const std::string& flag) {
  if (flag == "--dc-variant") return "dcasgd";
  if (flag == "--dc-lambda") return "dcasgd, odsgd with --local-updater dcasgd-c or dcasgd-a, and sapipe";
  if (flag == "--dc-momentum") return "dcasgd --dc-variant a and odsgd --local-updater dcasgd-a";
  if (flag == "--warmup-iters" || flag == "--warmup-epochs") return "pipe, odsgd and sapipe";
  if (flag == "--buckets") return "dsync and sapipe (wfbp, synceasgd and mgwfbp have their own plans)";
  if (flag == "--profile-iters") {
    return "the layer-wise methods (dsync with --buckets or +PLAN, wfbp, synceasgd, mgwfbp) and sapipe";
  }
  if (flag == "--replan-every") {
    return "the layer-wise methods (dsync with --buckets or +PLAN, wfbp, synceasgd, mgwfbp)";
  }
  if (flag == "--stale-layers" || flag == "--compensation") return "sapipe";
  return "odsgd";
}

// The delay-compensation, local-updater and warm-up flags into config.method (config.method.name
// set). `train` rejects such a flag given for a method it does not concern; `compare` applies it to
// the methods of its list it concerns (as --servers).
void apply_method_specific_flags(const TrainFlags& flags, bool compare, TrainConfig& config) {
  const std::string& method = config.method.name;
  if (!compare) {
    for (const std::string& flag : kMethodSpecificFlags) {
      if (flags.given.count(flag) && !flag_applies(flag, method, flags)) {
        throw UsageError(concat(flag, " applies only to ", flag_users(flag), ", not '", method, "'"));
      }
    }
  }
  config.method.delay_compensation.variant = parse_delay_compensation_variant(flags.dc_variant);
  config.method.delay_compensation.lambda =
      method == "sapipe" && !flags.given.count("--dc-lambda") ? kSapipeDefaultLambda : flags.dc_lambda;
  if (method == "sapipe") {
    config.method.stale_layers = flags.stale_layers;
    if (flags.given.count("--compensation")) {
      // A compensation named in the method spec (sapipe+dc) wins in compare; train rejects both.
      if (config.method.compensation == "none" && config.method_spec.find("+none") == std::string::npos) {
        config.method.compensation = flags.compensation;
      } else if (!compare) {
        throw UsageError(concat("--compensation ", flags.compensation, " and the method's '",
                                config.method.compensation, "': give one"));
      }
    }
  }
  config.method.delay_compensation.mean_square_decay = flags.dc_momentum;
  config.method.local_updater = flags.local_updater;
  config.method.local_learning_rate = flags.local_learning_rate;
  if (flags.given.count("--local-lr") && !(flags.local_learning_rate > 0)) {
    throw UsageError(concat("--local-lr must be > 0, got ", flags.local_learning_rate));
  }
  if (flags.given.count("--buckets") && (method == "dsync" || method == "sapipe")) {
    // A plan named in the method spec (dsync+optimal) wins over --buckets in compare; train
    // rejects giving both.
    if (config.method.buckets.empty()) {
      config.method.buckets = flags.buckets;
    } else if (!compare) {
      throw UsageError(concat("--buckets ", flags.buckets, " and the method's plan '", config.method.buckets,
                              "': give one"));
    }
  }
  if (!compare && (flags.given.count("--profile-iters") || flags.given.count("--replan-every")) &&
      !layer_wise(config.method) && method != "sapipe") {
    throw UsageError(concat(flags.given.count("--profile-iters") ? "--profile-iters" : "--replan-every",
                            " applies only to layer-wise communication: add --buckets PLAN (or use wfbp, "
                            "synceasgd, mgwfbp, dsync+PLAN)"));
  }
  config.method.profile_iterations = flags.profile_iterations;
  config.method.replan_every = flags.replan_every;
  config.warmup_epochs = flags.warmup_epochs;
  config.warmup_iterations = flags.warmup_iterations;
  if (method == "odsgd" && !flags.given.count("--warmup-iters") && !flags.given.count("--warmup-epochs")) {
    config.warmup_iterations = kOdSgdDefaultWarmupIterations;
  }
}

// `compare`: --servers applies to the parameter-server methods of the list only (`train` rejects it
// for the others).
TrainConfig to_config(const TrainFlags& flags, const std::string& method_spec, bool compare = false) {
  TrainConfig config;
  config.method.codec = flags.codec;
  make_codec(flags.codec);  // validate --codec even when the method spec overrides it
  apply_method_spec(method_spec, config);
  config.method.staleness = flags.staleness;
  if (flags.seed < 0) throw UsageError(concat("--seed must be >= 0, got ", flags.seed));
  if (flags.batch < 1 || flags.batch > static_cast<std::int64_t>(kMaxBatch)) {
    throw UsageError(concat("--batch must be in [1, ", kMaxBatch, "], got ", flags.batch));
  }
  config.method.sgd = SgdOptions{flags.learning_rate, flags.momentum, flags.weight_decay};
  config.method.optimizer = flags.optimizer;
  config.on_nonfinite = flags.on_nonfinite;
  config.checkpoint_dir = flags.checkpoint_dir;
  config.checkpoint_every = flags.checkpoint_every;
  config.resume = flags.resume;
  config.check_consistency = flags.check_consistency;
  if (!flags.inject_fault.empty()) config.fault = parse_fault_injection(flags.inject_fault);
  config.method.adam.beta1 = flags.adam_beta1;
  config.method.adam.beta2 = flags.adam_beta2;
  config.method.adam.epsilon = flags.adam_epsilon;
  config.method.allreduce.timeout = timeout_from_seconds(flags.comm_timeout_seconds, "--comm-timeout");
  config.method.allreduce.segment_bytes = parse_segment_bytes(flags.segment_bytes);
  check_allreduce_name(flags.allreduce, "--allreduce", true);
  config.method.allreduce_algorithm = flags.allreduce;
  if (!flags.calibration_file.empty()) {
    if (flags.allreduce != "auto" && !layer_wise(config.method) &&
        !(flags.given.count("--buckets") && config.method.name == "dsync")) {
      if (!compare) {
        throw UsageError("--calibration is only used by --allreduce auto and by the bucket plans of "
                         "layer-wise methods; add --allreduce auto or drop it");
      }
    }
    config.method.calibration =
        std::make_shared<const Calibration>(load_calibration(flags.calibration_file));
  }
  config.servers = compare && !method_uses_servers(config.method.name) ? 0 : flags.servers;
  if (active_mpi_session && method_uses_servers(config.method.name) && flags.servers >= 0) {
    // Under MPI the last S ranks of mpirun -np N are the servers: N - S workers. (A negative
    // --servers is left to validate_train_config.)
    const int ranks = active_mpi_session->runtime.size();
    const int servers = flags.servers == 0 ? 1 : flags.servers;
    if (servers >= ranks) {
      throw UsageError(concat("--servers ", servers, " leaves no worker among the ", ranks,
                              " MPI ranks (mpirun -np): the last S ranks are the servers"));
    }
    if (flags.workers_given && flags.workers != ranks - servers) {
      throw UsageError(concat("--workers ", flags.workers, " does not match the ", ranks, " MPI ranks (mpirun -np) minus ",
                              servers, " server(s); leave --workers out under --transport mpi"));
    }
    config.workers = ranks - servers;
  } else {
    config.workers = resolve_workers(flags.workers, flags.workers_given, active_mpi_session);
  }
  config.model = flags.model;
  config.batch = static_cast<std::size_t>(flags.batch);
  config.epochs = flags.epochs;
  config.iterations = flags.iterations;
  apply_method_specific_flags(flags, compare, config);
  config.seed = static_cast<std::uint64_t>(flags.seed);
  config.network = parse_network_spec(flags.network);
  if (active_mpi_session && config.network.emulated()) {
    throw UsageError("--net emulates links between threads of one process; under --transport mpi the "
                     "network is the real one (drop --net)");
  }
  config.out_dir = flags.out_dir;
  config.progress = !flags.quiet;
  config.evaluate = !flags.no_eval;
  validate_train_config(config);  // before loading any data
  return config;
}

DataSplits load_data(const TrainFlags& flags) {
  if (flags.data == "synthetic") {
    if (!flags.data_dir.empty()) throw UsageError("--data-dir cannot be combined with --data synthetic");
    return make_synthetic(12000, 2000, static_cast<std::uint64_t>(flags.seed));
  }
  if (flags.data != "fashion-mnist" && flags.data != "mnist-format") {
    throw UsageError(concat("unknown data set '", flags.data, "' (expected fashion-mnist or synthetic)"));
  }
  return load_mnist_format(flags.data_dir.empty() ? kDefaultDataDir : flags.data_dir);
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

// Where the workers run: "4 workers (threads), network 10gbe (...)" or "4 workers (MPI ranks)".
std::string describe_workers(const TrainConfig& config) {
  const int servers = resolved_servers(config);
  const std::string workers =
      concat(config.workers, " workers",
             servers > 0 ? concat(" + ", servers, servers == 1 ? " server" : " servers") : std::string());
  if (active_mpi_session) return concat(workers, " as ", active_mpi_session->transport.describe());
  return concat(workers, " (threads), network ", describe(config.network));
}

// Trains over the transport in use: threads over a LocalFabric, or this process's MPI rank.
RunSummary train_on_transport(const TrainConfig& config, const ModelFactory& factory,
                              const DataSplits& data) {
  if (active_mpi_session) {
    return run_training_rank(config, factory, data, active_mpi_session->transport);
  }
  return run_training(config, factory, data);
}

// Only rank 0 of an MPI run writes to stdout.
bool prints_results() { return !active_mpi_session || active_mpi_session->leader(); }

int run_train(TrainFlags flags, const std::string& method_spec) {
  TrainConfig config = to_config(flags, method_spec);
  if (!prints_results()) config.progress = false;
  ModelFactory factory = torch_model_factory(config.model);
  const DataSplits data = load_data(flags);
  if (prints_results()) {
    std::cout << "pipesgd train: " << config.method_spec << " on " << config.model << " ("
              << data.train.name << ", " << data.train.size << " training examples), "
              << describe_workers(config) << std::endl;
  }
  RunSummary summary = train_on_transport(config, factory, data);
  if (!prints_results()) return 0;
  print_run_report(std::cout, summary);
  if (!config.out_dir.empty()) std::cout << "wrote " << config.out_dir << "/{metrics.jsonl,summary.json}\n";
  return 0;
}

int run_compare(const TrainFlags& flags, const std::string& algorithms) {
  const std::vector<std::string> specs = split_list(algorithms);
  std::vector<TrainConfig> configs;
  for (const std::string& spec : specs) configs.push_back(to_config(flags, spec, true));  // validate all first
  if (active_mpi_session) {
    // Under MPI the servers are ranks of mpirun -np, so the two families would train with different
    // numbers of workers: not a comparison.
    for (const TrainConfig& config : configs) {
      if (config.workers != configs[0].workers) {
        throw UsageError("under --transport mpi, compare cannot mix parameter-server methods (pssync, asgd, "
                         "dcasgd, odsgd: "
                         "the last --servers ranks serve) with dsync/pipe (every rank a worker); compare them "
                         "in separate runs");
      }
    }
  }
  ModelFactory factory = torch_model_factory(flags.model);
  const DataSplits data = load_data(flags);
  if (prints_results()) {
    // The header names the servers if any method of the list has them (the others run without).
    const TrainConfig* widest = &configs[0];
    for (const TrainConfig& config : configs) {
      if (resolved_servers(config) > resolved_servers(*widest)) widest = &config;
    }
    std::cout << "pipesgd compare: " << algorithms << " on " << flags.model << " (" << data.train.name
              << "), " << describe_workers(*widest) << std::endl;
  }
  std::vector<RunSummary> summaries;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    TrainConfig& config = configs[i];
    if (!prints_results()) config.progress = false;
    if (!flags.out_dir.empty()) config.out_dir = concat(flags.out_dir, "/", i + 1, "-", config.method_spec);
    if (prints_results()) {
      std::cerr << "[" << i + 1 << "/" << configs.size() << "] " << config.method_spec << std::endl;
    }
    summaries.push_back(train_on_transport(config, factory, data));
  }
  if (!prints_results()) return 0;
  std::cout << "\n";
  print_compare_table(std::cout, summaries);
  if (!flags.out_dir.empty()) {
    write_compare_outputs(flags.out_dir, summaries);
    std::cout << "wrote " << flags.out_dir << "/compare.json\n";
  }
  return 0;
}

// Flags of `bench allreduce` and `calibrate`.
struct BenchFlags {
  int workers = 4;
  bool workers_given = false;
  std::string transport = "local";
  std::string network = "none";
  std::string algorithms = "all";
  std::string codecs = "none,bf16,int8";
  std::string sizes;
  int repeats = 10;
  int warmup = 2;
  double timeout_seconds = 120;
  std::string segment_bytes = "auto";
  std::string calibration_file;
  std::string out;
};

void add_bench_flags(CLI::App& command, BenchFlags& flags, bool calibrate) {
  command.add_option("--workers", flags.workers, "Ranks (threads; under --transport mpi: mpirun -np)")
      ->capture_default_str();
  command.add_option("--transport", flags.transport, "local (threads of this process) or mpi")
      ->capture_default_str();
  command.add_option("--net", flags.network, "Emulated network (local transport, as for train)")
      ->capture_default_str();
  command.add_option("--algos", flags.algorithms,
                     "Comma-separated algorithms: ring, recursive-doubling, halving-doubling, tree, "
                     "direct, or all")
      ->capture_default_str();
  if (!calibrate) {
    command.add_option("--codecs", flags.codecs, "Comma-separated codecs")->capture_default_str();
    command.add_option("--calibration", flags.calibration_file,
                       "Calibration JSON for the `auto` rows [default: the built-in model]");
  }
  command.add_option("--sizes", flags.sizes, "Comma-separated sizes, e.g. 4K,1M,64M [default: 4K..64M x4]");
  command.add_option("--repeats", flags.repeats, "Timed runs per size and algorithm")->capture_default_str();
  command.add_option("--warmup", flags.warmup, "Untimed runs first")->capture_default_str();
  command.add_option("--comm-timeout", flags.timeout_seconds, "Seconds per wait")->capture_default_str();
  command.add_option("--segment-bytes", flags.segment_bytes,
                     "Ring and tree message segments: auto (= 256K), none (unsegmented) or a size")
      ->capture_default_str();
  command.add_option("--out", flags.out,
                     calibrate ? "Calibration JSON to write" : "Write allreduce.json here");
}

struct BenchSetup {
  std::vector<AllreduceCandidate> candidates;
  AllreduceBenchmarkConfig config;
  NetworkSpec network;
  int workers = 0;
  std::size_t segment_bytes = kDefaultSegmentBytes;
  std::vector<std::string> algorithms;
};

BenchSetup make_bench_setup(const BenchFlags& flags, const std::vector<std::string>& codecs) {
  BenchSetup setup;
  setup.segment_bytes = parse_segment_bytes(flags.segment_bytes);
  if (setup.segment_bytes == kAutoSegmentBytes) setup.segment_bytes = kDefaultSegmentBytes;
  setup.network = parse_network_spec(flags.network);
  if (active_mpi_session && setup.network.emulated()) {
    throw UsageError("--net emulates links between threads of one process; drop it under --transport mpi");
  }
  setup.workers = resolve_workers(flags.workers, flags.workers_given, active_mpi_session);
  if (setup.workers < 1 || setup.workers > kMaxWorkers) {
    throw UsageError(concat("--workers must be in [1, ", kMaxWorkers, "], got ", setup.workers));
  }
  setup.algorithms = flags.algorithms == "all" ? allreduce_algorithm_names() : split_list(flags.algorithms);
  for (const auto& algorithm : setup.algorithms) check_allreduce_name(algorithm, "--algos", false);
  for (const auto& codec : codecs) make_codec(codec);
  if (!flags.sizes.empty()) setup.config.sizes_bytes = parse_sizes(flags.sizes);
  setup.config.repeats = flags.repeats;
  setup.config.warmup = flags.warmup;
  setup.config.timeout = timeout_from_seconds(flags.timeout_seconds, "--comm-timeout");
  AllreduceOptions options;
  options.timeout = setup.config.timeout;
  options.segment_bytes = setup.segment_bytes;
  setup.candidates = our_allreduce_candidates(setup.algorithms, codecs, options);
  if (active_mpi_session) {
    AllreduceCandidate library;
    library.algorithm = "MPI_Allreduce";
    library.codec = "none";
    library.is_reference = true;
    MpiRuntime* runtime = &active_mpi_session->runtime;
    library.build = [runtime](Transport&, std::size_t, const Codec&) -> std::unique_ptr<Allreduce> {
      return std::make_unique<MpiLibraryAllreduce>(*runtime);
    };
    setup.candidates.insert(setup.candidates.begin(), std::move(library));
  }
  return setup;
}

std::vector<AllreduceBenchmarkRow> run_benchmark(const BenchSetup& setup,
                                                 const std::function<void(const AllreduceBenchmarkRow&)>& on_row) {
  if (active_mpi_session) {
    MpiTransport& transport = active_mpi_session->transport;
    // A real barrier, not through the transport being measured; each rank times from its own exit.
    const BenchmarkBarrier barrier = [&transport](Timeout timeout) {
      transport.barrier(timeout, "allreduce benchmark");
      return Clock::now();
    };
    return run_allreduce_benchmark_rank(transport, barrier, setup.candidates, setup.config, on_row);
  }
  return run_local_allreduce_benchmark(setup.workers, setup.network, setup.candidates, setup.config,
                                       on_row);
}

std::string describe_bench_transport(const BenchSetup& setup) {
  if (active_mpi_session) return active_mpi_session->transport.describe();
  return concat("LocalTransport, ", setup.workers, " ranks as threads, ", describe(setup.network));
}

nlohmann::json row_json(const AllreduceBenchmarkRow& row, const std::string& segments) {
  return {{"algorithm", row.algorithm}, {"codec", row.codec}, {"ranks", row.workers},
          {"segments", segments}, {"bytes", row.bytes}, {"time_s", row.median_seconds},
          {"min_time_s", row.min_seconds}, {"max_time_s", row.max_seconds},
          {"algbw_bytes_per_s", row.algbw}, {"busbw_bytes_per_s", row.busbw},
          {"max_error", row.max_error}, {"error_bound", row.error_bound},
          {"matches_reference", row.matches_reference}, {"correct", row.correct}};
}

int run_bench_allreduce(const BenchFlags& flags) {
  const std::vector<std::string> codecs = split_list(flags.codecs);
  const BenchSetup setup = make_bench_setup(flags, codecs);
  const Calibration calibration = flags.calibration_file.empty()
                                      ? Calibration{"built-in model", setup.workers,
                                                    default_link_parameters(), {}, {}}
                                      : load_calibration(flags.calibration_file);
  const bool leader = prints_results();
  const std::string segments = describe_segment_bytes(setup.segment_bytes);
  if (leader) {
    std::printf("pipesgd bench allreduce: %s, ring/tree segments %s, median of %d interleaved runs\n",
                describe_bench_transport(setup).c_str(), segments.c_str(), flags.repeats);
    std::printf("auto = the algorithm the cost model picks per size (%s)\n\n",
                flags.calibration_file.empty() ? "built-in model" : flags.calibration_file.c_str());
    std::printf("%-26s %-6s %10s %11s %10s %10s %9s %7s\n", "algorithm", "codec", "bytes", "time (us)",
                "algbw GB/s", "busbw GB/s", "vs MPI", "check");
    std::fflush(stdout);
  }
  nlohmann::json rows = nlohmann::json::array();
  bool all_correct = true;
  std::vector<AllreduceBenchmarkRow> size_rows;  // rows of the size being measured
  auto print_row = [&](const AllreduceBenchmarkRow& row, const std::string& label, double reference_busbw) {
    const std::string ratio = reference_busbw > 0 ? concat(std::fixed, std::setprecision(2),
                                                           row.busbw / reference_busbw, "x")
                                                  : std::string("-");
    std::printf("%-26s %-6s %10zu %11.1f %10.3f %10.3f %9s %7s\n", label.c_str(), row.codec.c_str(),
                row.bytes, row.median_seconds * 1e6, row.algbw / 1e9, row.busbw / 1e9, ratio.c_str(),
                row.correct ? "ok" : "WRONG");
  };
  auto flush_size = [&] {
    if (size_rows.empty()) return;
    double reference_busbw = 0;
    for (const auto& row : size_rows) {
      if (row.algorithm == "MPI_Allreduce") reference_busbw = row.busbw;
    }
    for (const auto& row : size_rows) {
      print_row(row, row.algorithm, reference_busbw);
      nlohmann::json json = row_json(row, segments);
      if (reference_busbw > 0) json["busbw_vs_mpi_allreduce"] = row.busbw / reference_busbw;
      rows.push_back(json);
    }
    // auto: per codec, the row of the algorithm the model picks for this size.
    const std::string chosen = choose_allreduce_algorithm(
        calibration, setup.workers, static_cast<double>(size_rows[0].bytes), setup.algorithms);
    for (const auto& codec : codecs) {
      for (const auto& row : size_rows) {
        if (row.codec != codec || row.algorithm != chosen) continue;
        AllreduceBenchmarkRow picked = row;
        picked.algorithm = "auto";
        print_row(picked, concat("auto (", chosen, ")"), reference_busbw);
        nlohmann::json json = row_json(picked, segments);
        json["chosen"] = chosen;
        if (reference_busbw > 0) json["busbw_vs_mpi_allreduce"] = row.busbw / reference_busbw;
        rows.push_back(json);
      }
    }
    std::fflush(stdout);
    size_rows.clear();
  };
  run_benchmark(setup, [&](const AllreduceBenchmarkRow& row) {
    all_correct &= row.correct;
    if (!size_rows.empty() && size_rows[0].bytes != row.bytes) flush_size();
    size_rows.push_back(row);
    if (size_rows.size() == setup.candidates.size()) flush_size();
  });
  if (!leader) return 0;
  flush_size();
  if (!flags.out.empty()) {
    ensure_directory(flags.out);
    std::ofstream out(flags.out + "/allreduce.json");
    if (!out) throw UsageError(concat("cannot write '", flags.out, "/allreduce.json'"));
    out << rows.dump(2) << '\n';
    std::printf("\nwrote %s/allreduce.json\n", flags.out.c_str());
  }
  if (!all_correct) {
    std::fprintf(stderr, "pipesgd: error: an allreduce result was wrong or outside its bound\n");
    return 1;
  }
  return 0;
}

// `pipesgd calibrate`: times every algorithm (codec none) over the sizes on the live transport, fits
// the link parameters and each algorithm's a + b*M, prints fit and residuals, saves the JSON.
int run_calibrate(const BenchFlags& flags) {
  const BenchSetup setup = make_bench_setup(flags, {"none"});
  const bool leader = prints_results();
  const std::string path = flags.out.empty() ? "calibration.json" : flags.out;
  if (leader) {
    std::printf("pipesgd calibrate: %s, algorithms", describe_bench_transport(setup).c_str());
    for (const auto& algorithm : setup.algorithms) std::printf(" %s", algorithm.c_str());
    std::printf(", median of %d interleaved runs per size\n", flags.repeats);
    std::fflush(stdout);
  }
  if (setup.workers < 2) throw UsageError("calibrate needs at least 2 ranks (--workers or mpirun -np)");
  std::vector<TimingSample> samples;
  run_benchmark(setup, [&](const AllreduceBenchmarkRow& row) {
    if (!row.correct) throw CommError(concat(row.algorithm, " gave a wrong result at ", row.bytes, " bytes"));
    if (row.algorithm == "MPI_Allreduce") return;
    samples.push_back({row.algorithm, row.workers, static_cast<double>(row.bytes), row.median_seconds});
    std::fprintf(stderr, "  measured %-20s %10zu bytes  %10.1f us\n", row.algorithm.c_str(), row.bytes,
                 row.median_seconds * 1e6);
  });
  if (!leader) return 0;
  Calibration calibration;
  calibration.transport = active_mpi_session ? "mpi" : concat("local ", setup.network.name);
  calibration.world_size = setup.workers;
  calibration.samples = samples;
  const LinkFit fit = fit_link_parameters(samples);
  calibration.link = fit.link;
  std::printf("\nfitted link model (least squares of relative error over all %zu timings):\n",
              samples.size());
  std::printf("  alpha = %.3f us per message, beta = %.4f ns per byte (%.2f GB/s), gamma = %.4f ns per "
              "byte reduced; rms relative residual %.1f%%\n",
              fit.link.alpha * 1e6, fit.link.beta * 1e9, fit.link.beta > 0 ? 1e-9 / fit.link.beta : 0.0,
              fit.link.gamma * 1e9, fit.rms_relative_residual * 100);
  if (!fit.unique) std::printf("  note: %s\n", fit.ambiguity.c_str());
  std::printf("\nper algorithm, T(M) = a + b*M fitted to its own timings:\n");
  std::printf("%-20s %12s %14s %14s %12s\n", "algorithm", "a (us)", "b (ns/byte)", "Table II a (us)",
              "Table II b");
  for (const auto& algorithm : setup.algorithms) {
    std::vector<TimingSample> own;
    for (const auto& sample : samples) {
      if (sample.algorithm == algorithm) own.push_back(sample);
    }
    const LinearCost measured = fit_linear_cost(own);
    calibration.measured[algorithm] = measured;
    const LinearCost model = allreduce_cost(algorithm, setup.workers, fit.link);
    std::printf("%-20s %12.2f %14.4f %14.2f %12.4f\n", algorithm.c_str(), measured.a * 1e6,
                measured.b * 1e9, model.a * 1e6, model.b * 1e9);
  }
  std::printf("\npredicted vs measured:\n%-20s %10s %12s %14s %12s %14s\n", "algorithm", "bytes",
              "measured us", "link model us", "residual", "own a+bM us");
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const auto& sample = samples[i];
    std::printf("%-20s %10.0f %12.1f %14.1f %11.1f%% %14.1f\n", sample.algorithm.c_str(), sample.bytes,
                sample.seconds * 1e6, fit.predicted_seconds[i] * 1e6, fit.relative_residuals[i] * 100,
                calibration.measured[sample.algorithm].time(sample.bytes) * 1e6);
  }
  std::printf("\n--allreduce auto picks:");
  for (std::size_t bytes : setup.config.sizes_bytes.empty() ? default_benchmark_sizes()
                                                             : setup.config.sizes_bytes) {
    std::printf(" %zu B: %s;", bytes,
                choose_allreduce_algorithm(calibration, setup.workers, static_cast<double>(bytes),
                                           setup.algorithms)
                    .c_str());
  }
  save_calibration(calibration, path);
  std::printf("\nwrote %s\n", path.c_str());
  return 0;
}

// `pipesgd plan`: each bucket plan's buckets and predicted iteration for a model, world size,
// network and calibration, from a profile of the model measured here (the replicas run at once, as
// the trainer's workers do), before any training.
struct PlanFlags {
  TrainFlags train;  // model, data, workers, batch, net, codec, allreduce, calibration, seed
  std::string plans = "wfbp,single,mgwfbp,optimal,fixed:25";
  std::int64_t profile_iterations = 10;
  std::string out;
};

void add_plan_flags(CLI::App& command, PlanFlags& flags) {
  TrainFlags& t = flags.train;
  command.add_option("--model", t.model, "Model: mlp, cnn, resnet, softmax")->capture_default_str();
  command.add_option("--workers", t.workers, "World size the plans are for (the profile runs this many replicas at once)")
      ->capture_default_str();
  command.add_option("--net", t.network, "Network: none, 1gbe, 10gbe, 25gbe, 100gbe or bw=1Gbit,lat=200us")
      ->capture_default_str();
  command.add_option("--calibration", t.calibration_file,
                     "Calibration JSON of `pipesgd calibrate` (its measured a + b*M is the cost model)");
  command.add_option("--allreduce", t.allreduce, "Allreduce algorithm whose cost the plans use (or auto)")
      ->capture_default_str();
  command.add_option("--codec", t.codec, "Gradient codec (sets the bytes per element on the wire)")
      ->capture_default_str();
  command.add_option("--batch", t.batch, "Per-worker batch of the profile")->capture_default_str();
  command.add_option("--data", t.data, "Data set of the profile: fashion-mnist or synthetic")->capture_default_str();
  command.add_option("--data-dir", t.data_dir, "Directory of MNIST-format IDX files");
  command.add_option("--seed", t.seed, "Seed of the model initialisation and data order")->capture_default_str();
  command.add_option("--plans", flags.plans, "Comma-separated plans: wfbp, single, mgwfbp, optimal, fixed:<MiB>")
      ->capture_default_str();
  command.add_option("--profile-iters", flags.profile_iterations, "Iterations profiled per replica")
      ->capture_default_str();
  command.add_option("--out", flags.out, "Write the plans and predictions as JSON to this file");
}

std::string plan_equation(const std::string& name) {
  if (name == "wfbp") return "Eq. 6-8";
  if (name == "single") return "t_f + t_b + T(all)";
  return "Eq. 19-21";
}

int run_plan(const PlanFlags& flags) {
  const TrainFlags& t = flags.train;
  if (flags.profile_iterations < 1 || flags.profile_iterations > 100000) {
    throw UsageError(concat("--profile-iters must be in [1, 100000], got ", flags.profile_iterations));
  }
  if (t.seed < 0) throw UsageError(concat("--seed must be >= 0, got ", t.seed));
  if (t.batch < 1 || t.batch > static_cast<std::int64_t>(kMaxBatch)) {
    throw UsageError(concat("--batch must be in [1, ", kMaxBatch, "], got ", t.batch));
  }
  const std::vector<std::string> plans = split_list(flags.plans);
  for (const std::string& plan : plans) check_bucket_plan_name(plan);
  // The profile is measured exactly as a layer-wise run measures it (algo/bucketed_dsync.h): a run
  // of layer-wise D-Sync on --workers threads over the emulated network, to the end of its planning
  // step (cost model, kappa), whose inputs every plan below is computed from.
  TrainConfig config;
  apply_method_spec("dsync+optimal", config);
  config.method.codec = t.codec;
  check_allreduce_name(t.allreduce, "--allreduce", true);
  config.method.allreduce_algorithm = t.allreduce;
  if (!t.calibration_file.empty()) {
    config.method.calibration = std::make_shared<const Calibration>(load_calibration(t.calibration_file));
  }
  config.method.profile_iterations = flags.profile_iterations;
  config.workers = t.workers;
  config.model = t.model;
  config.batch = static_cast<std::size_t>(t.batch);
  config.iterations = kProfileWarmupIterations + flags.profile_iterations;
  config.seed = static_cast<std::uint64_t>(t.seed);
  config.network = parse_network_spec(t.network);
  config.progress = false;
  config.evaluate = false;
  validate_train_config(config);  // before loading any data
  const NetworkSpec& network = config.network;
  const MethodConfig& method = config.method;
  ModelFactory factory = torch_model_factory(t.model);
  const DataSplits data = load_data(t);
  const double bytes_per_element = static_cast<double>(make_codec(t.codec)->encoded_bytes(1000)) / 1000.0;
  std::cerr << "profiling " << t.model << ": " << t.workers << " workers (threads), "
            << kProfileWarmupIterations << " + " << flags.profile_iterations << " iterations of batch "
            << t.batch << " over network " << describe(network) << std::endl;
  const RunSummary run = run_training(config, factory, data);
  PIPESGD_ASSERT(run.method_report.planned);
  const LayerProfile& profile = run.method_report.profile;
  const double update_seconds = run.method_report.update_seconds;
  const LinearCost cost = run.method_report.cost;
  double gradient_bytes = 0, backward = 0;
  for (double b : profile.bytes) gradient_bytes += b;
  for (double b : profile.backward_seconds) backward += b;
  const double fp32_bytes = gradient_bytes / bytes_per_element * sizeof(float);
  const std::string algorithm = resolve_allreduce_algorithm(method, t.workers, fp32_bytes);

  std::cout << "pipesgd plan: " << t.model << " (" << profile.bytes.size() << " layers, "
            << std::fixed << std::setprecision(0) << gradient_bytes << " gradient bytes with codec "
            << t.codec << "), " << t.workers << " workers, network " << describe(network) << "\n";
  std::cout << std::setprecision(3) << "allreduce " << algorithm << ": T(M) = a + b*M, a = " << cost.a * 1e3
            << " ms, b = " << cost.b * 1e9 << " ns/byte (from " << planning_cost_source(method, network, t.workers)
            << ")\n";
  std::cout << "profile: t_f (data + forward) = " << profile.forward_seconds * 1e3
            << " ms, t_b (backward) = " << backward * 1e3 << " ms, update = " << update_seconds * 1e3
            << " ms per iteration; each allreduce launched during backward slows it by kappa = "
            << profile.per_bucket_compute_seconds * 1e3 << " ms\n\n";
  nlohmann::json records = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows = {
      {"plan", "buckets", "predicted iter ms", "t_c^no ms", "comm ms", "model"}};
  std::vector<std::string> details;
  for (const std::string& name : plans) {
    const BucketPlan plan = make_bucket_plan(name, profile, cost);
    const PlanTimeline timeline = simulate_plan(profile, cost, plan);
    const double iteration = timeline.iteration + update_seconds;
    rows.push_back({name, concat(plan.buckets.size()), milliseconds(iteration),
                    milliseconds(timeline.non_overlapped), milliseconds(timeline.communication),
                    plan_equation(plan.name)});
    details.push_back(concat(name, ": ", describe_plan(plan)));
    records.push_back({{"plan", name},
                       {"buckets", plan.buckets.size()},
                       {"description", describe_plan(plan)},
                       {"predicted_iteration_s", iteration},
                       {"predicted_non_overlapped_s", timeline.non_overlapped},
                       {"communication_s", timeline.communication}});
  }
  print_table(std::cout, rows);
  std::cout << "\npredicted iter = the timeline's last allreduce finish (t_f + backward with the buckets' "
               "allreduces launched as their layers are ready, one at a time) + update; t_c^no = the part "
               "of the communication not hidden behind backward.\n";
  std::cout << "(dsync without --buckets runs one allreduce after backward: the single plan.)\n";
  const WfbpCase wfbp = classify_wfbp(profile, cost);
  std::cout << "WFBP is case " << wfbp.number << " of mg-wfbp.txt Sec. III-A: ";
  if (wfbp.number == 3) {
    std::cout << "communication-bound from layer " << wfbp.communication_bound_layer
              << " (paper numbering) down, Eq. 13: t_iter = r_C + sum_{j<=C} t_c(j) = ";
  } else {
    std::cout << "communication hidden except layer 1's, Eq. " << (wfbp.number == 1 ? 11 : 12)
              << ": t_iter = t_f + t_b + t_c(1) = ";
  }
  std::cout << std::setprecision(3) << wfbp.iteration * 1e3 << " ms (+ update)\n";
  for (const std::string& line : details) std::cout << line << "\n";
  if (!flags.out.empty()) {
    std::ofstream file(flags.out);
    if (!file) throw UsageError(concat("--out '", flags.out, "': cannot write"));
    nlohmann::json document = {{"model", t.model},
                               {"workers", t.workers},
                               {"network", network.name},
                               {"allreduce", algorithm},
                               {"a_s", cost.a},
                               {"b_s_per_byte", cost.b},
                               {"forward_s", profile.forward_seconds},
                               {"backward_s", backward},
                               {"update_s", update_seconds},
                               {"kappa_s", profile.per_bucket_compute_seconds},
                               {"plans", records}};
    file << document.dump(2) << "\n";
    std::cout << "wrote " << flags.out << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace pipesgd

int main(int argc, char** argv) {
  using namespace pipesgd;
  // LibTorch allocates and frees the same large temporaries (activations, per-parameter gradients)
  // every iteration. With glibc's defaults they are mmap'd and unmapped, or trimmed, each time, and
  // every iteration pays for fresh page faults (expensive in a VM). Keep freed memory in the heap.
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024);
  CLI::App app{
      "pipesgd: data-parallel training that hides gradient communication behind computation\n"
      "(D-Sync and Pipe-SGD over ring, recursive-doubling, halving-doubling, tree or direct allreduce\n"
      "with in-message compression; layer-wise bucketed allreduce (WFBP, MG-WFBP, optimal plans);\n"
      "parameter-server methods (PS-Sync, ASGD, DC-ASGD, OD-SGD); workers as threads or MPI ranks)."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");

  TrainFlags train_flags;
  std::string train_method = "dsync";
  CLI::App* train = app.add_subcommand("train", "Train one method and report the timing breakdown");
  train->add_option("--algo", train_method,
                    "Method: dsync | pipe (optionally +codec, e.g. pipe+int8) | wfbp | synceasgd | mgwfbp "
                    "| dsync+PLAN (layer-wise buckets: wfbp, single, mgwfbp, optimal, fixed:<MiB>) | "
                    "sapipe (partial staleness; optionally +dc, +wp1, +wp2, +wp3, +PLAN, +codec) | "
                    "pssync | asgd | dcasgd | odsgd (parameter server, see --servers)")
      ->capture_default_str();
  add_train_flags(*train, train_flags);

  TrainFlags compare_flags;
  std::string compare_methods = "dsync,pipe,pipe+int8";
  CLI::App* compare = app.add_subcommand("compare", "Train several methods one after another; one table");
  compare->add_option("--algos", compare_methods,
                      "Comma-separated methods, each name[+plan][+compensation][+codec] (dsync, pipe, wfbp, "
                      "synceasgd, mgwfbp, sapipe, pssync, asgd, dcasgd, odsgd; plans for dsync and sapipe, "
                      "compensations for sapipe), e.g. pssync,asgd,dcasgd,odsgd,dsync,pipe or "
                      "dsync,wfbp,mgwfbp,dsync+optimal or dsync,pipe,sapipe,sapipe+dc,sapipe+wp1,sapipe+wp3")
      ->capture_default_str();
  add_train_flags(*compare, compare_flags);

  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  BenchFlags bench_flags;
  CLI::App* bench_allreduce = bench->add_subcommand(
      "allreduce", "Allreduce time, algbw, busbw per algorithm, size and codec (interleaved runs)");
  add_bench_flags(*bench_allreduce, bench_flags, false);

  BenchFlags calibrate_flags;
  calibrate_flags.repeats = 7;
  CLI::App* calibrate = app.add_subcommand(
      "calibrate", "Measure allreduce times, fit the cost model (alpha, beta, gamma; a, b per algorithm)");
  add_bench_flags(*calibrate, calibrate_flags, true);

  PlanFlags plan_flags;
  CLI::App* plan = app.add_subcommand(
      "plan", "Bucket plans for layer-wise allreduce: buckets, predicted iteration and t_c^no per plan");
  add_plan_flags(*plan, plan_flags);

  if (argc > 1 && argv[1][0] != '-') {
    const std::string command = argv[1];
    if (command != "train" && command != "compare" && command != "bench" && command != "calibrate" &&
        command != "plan") {
      std::fprintf(stderr,
                   "pipesgd: error: unknown command '%s' (expected train, compare, bench, calibrate or "
                   "plan; see --help)\n",
                   command.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "pipesgd: error: %s (see --help)\n", error.what());
    return 2;
  }
  train_flags.workers_given = train->count("--workers") > 0;
  compare_flags.workers_given = compare->count("--workers") > 0;
  for (const std::string& flag : kMethodSpecificFlags) {
    if (train->count(flag) > 0) train_flags.given.insert(flag);
    if (compare->count(flag) > 0) compare_flags.given.insert(flag);
  }
  bench_flags.workers_given = bench_allreduce->count("--workers") > 0;
  calibrate_flags.workers_given = calibrate->count("--workers") > 0;

  // --transport mpi: MPI starts here, after the flags parsed (a typo never needs mpirun to report).
  std::unique_ptr<MpiSession> session;
  int exit_code = 0;
  try {
    const std::string& transport = train->parsed()     ? train_flags.transport
                                   : compare->parsed() ? compare_flags.transport
                                   : calibrate->parsed() ? calibrate_flags.transport
                                                         : bench_flags.transport;
    if (uses_mpi(transport)) {
      if (!MpiRuntime::launched_by_mpirun()) {
        throw UsageError("--transport mpi: start pipesgd with mpirun, e.g. mpirun -np 4 pipesgd train "
                         "--transport mpi (see README)");
      }
      session = std::make_unique<MpiSession>(&argc, &argv);
      active_mpi_session = session.get();
    }
    init_torch_runtime(1);
    if (train->parsed()) exit_code = run_train(train_flags, train_method);
    else if (compare->parsed()) exit_code = run_compare(compare_flags, compare_methods);
    else if (bench_allreduce->parsed()) exit_code = run_bench_allreduce(bench_flags);
    else if (calibrate->parsed()) exit_code = run_calibrate(calibrate_flags);
    else if (plan->parsed()) exit_code = run_plan(plan_flags);
  } catch (const std::exception& error) {
    const bool usage = dynamic_cast<const UsageError*>(&error) != nullptr;
    exit_code = usage ? 2 : 1;
    if (!session) {
      std::fprintf(stderr, "pipesgd: error: %s\n", error.what());
      return exit_code;
    }
    // Under MPI: tell the other ranks at once (they stop with PeerFailedError instead of waiting
    // for their timeouts), print one line (a usage error once, from rank 0: every rank has the same
    // flags), and leave without MPI_Finalize, which could wait forever on a dead peer.
    if (!usage || session->leader()) {
      std::fprintf(stderr, "pipesgd: error: %s%s\n",
                   usage ? "" : concat("rank ", session->runtime.rank(), ": ").c_str(), error.what());
      std::fflush(stderr);
    }
    session->transport.report_failure(error.what());
    if (usage && !session->leader()) {
      // mpirun aborts the job as soon as one rank exits non-zero: give rank 0, which has the same
      // usage error, time to print the line first.
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    MpiRuntime::exit_without_finalize(exit_code);
  }
  active_mpi_session = nullptr;
  return exit_code;
}
