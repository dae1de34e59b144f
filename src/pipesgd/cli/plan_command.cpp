// `pipesgd plan`: each bucket plan's buckets and predicted iteration for a model, world size,
// network and calibration, from a profile of the model measured here exactly as a layer-wise run
// measures it (the replicas run at once, as the trainer's workers do), before any training.
#include <algorithm>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "pipesgd/algo/planning.h"
#include "pipesgd/algo/registry.h"
#include "pipesgd/cli/commands.h"
#include "pipesgd/comm/network_spec.h"
#include "pipesgd/core/json_file.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"
#include "pipesgd/tools/plan_prediction.h"
#include "pipesgd/torch/torch_models.h"

namespace pipesgd {
namespace {

struct PlanFlags {
  std::string model = "mlp";
  std::string loss = "cross-entropy";
  int workers = 4;
  std::string network = "none";
  std::string calibration_file;
  std::string allreduce = "ring";
  std::string codec = "none";
  std::int64_t batch = 25;
  std::string data = "fashion-mnist";
  std::string data_dir;
  std::int64_t seed = 1;
  std::string plans = "wfbp,single,mgwfbp,optimal,fixed:25";
  std::int64_t profile_iterations = 10;
  std::string out;
  bool quiet = false;
};

void add_plan_flags(CLI::App& command, PlanFlags& flags) {
  command.add_option("--model", flags.model, kModelFlagHelp)->capture_default_str();
  command.add_option("--loss", flags.loss, kLossFlagHelp)->capture_default_str();
  command.add_option("--workers", flags.workers, "World size the plans are for (the profile runs this many replicas at once)")
      ->capture_default_str();
  command.add_option("--net", flags.network, "Network: none, 1gbe, 10gbe, 25gbe, 100gbe or bw=1Gbit,lat=200us")
      ->capture_default_str();
  command.add_option("--calibration", flags.calibration_file,
                     "Calibration JSON of `pipesgd calibrate` (its measured a + b*M is the cost model)");
  command.add_option("--allreduce", flags.allreduce, "Allreduce algorithm whose cost the plans use (or auto)")
      ->capture_default_str();
  command.add_option("--codec", flags.codec, "Gradient codec (sets the bytes per element on the wire)")
      ->capture_default_str();
  command.add_option("--batch", flags.batch, "Per-worker batch of the profile")->capture_default_str();
  command.add_option("--data", flags.data, "Data set of the profile: fashion-mnist, synthetic or npy:DIR (as train's --data)")->capture_default_str();
  command.add_option("--data-dir", flags.data_dir, "Directory of MNIST-format IDX files");
  command.add_option("--seed", flags.seed, "Seed of the model initialisation and data order")->capture_default_str();
  command.add_option("--plans", flags.plans, concat("Comma-separated plans: ", join(bucket_plan_names())))
      ->capture_default_str();
  command.add_option("--profile-iters", flags.profile_iterations, "Iterations profiled per replica")->capture_default_str();
  command.add_option("--out", flags.out, "Directory to write plan.json (the plans and predictions) to");
  command.add_flag("--quiet", flags.quiet, "No progress output");
}

std::string plan_equation(const std::string& name) {
  if (name == "wfbp") return "Eq. 6-8";
  if (name == "single") return "t_f + t_b + T(all)";
  return "Eq. 19-21";
}

// Runs on threads of this process (plan has no --transport). The computation is tools/plan_prediction.h's.
int run_plan(const PlanFlags& flags) {
  const std::vector<std::string> plans = split_list(flags.plans);
  for (const std::string& plan : plans) check_bucket_plan_name(plan);
  // The profile is measured exactly as a layer-wise run measures it: a run of the registry's
  // profiling method on --workers threads over the emulated network, to the end of its planning step
  // (cost model, kappa), whose inputs every plan below is computed from. Checked before any data loads.
  OptionValues options{{"--codec", flags.codec}, {"--allreduce", flags.allreduce}};
  if (!flags.calibration_file.empty()) options.set("--calibration", flags.calibration_file);
  const TrainConfig config =
      layer_wise_profiling_config(options, flags.profile_iterations, flags.workers, flags.model, flags.batch, flags.seed,
                                  parse_network_spec(flags.network, "--net"));
  prepare_output_directory(flags.out);
  const NetworkSpec& network = config.network;
  check_model_flags(flags.model, flags.loss);
  const DataSplits data = load_data_set(flags.data, flags.data_dir, flags.seed);
  check_data_fits_builtin_model(flags.model, data, flags.data);
  const ModelFactory factory = make_model_factory(flags.model, flags.loss, data.train);
  if (!flags.quiet) {
    std::cerr << "profiling " << flags.model << ": " << flags.workers << " workers (threads), " << kProfileWarmupIterations
              << " + " << flags.profile_iterations << " iterations of batch " << flags.batch << " over network "
              << describe(network) << std::endl;
  }
  const PlanPredictions predicted = predict_plans(measure_planning_inputs(config, factory, data), plans,
                                                  config.method.common, network, flags.workers);
  const LayerProfile& profile = predicted.inputs.profile;
  const double update_seconds = predicted.inputs.update_seconds;
  const LinearCost& cost = predicted.inputs.cost;
  const double gradient_bytes = predicted.gradient_bytes;
  const double backward = predicted.backward_seconds;

  std::cout << "pipesgd plan: " << flags.model << " (" << profile.bytes.size() << " layers, " << std::fixed
            << std::setprecision(0) << gradient_bytes << " gradient bytes with codec " << flags.codec << "), "
            << flags.workers << " workers, network " << describe(network) << "\n";
  std::cout << std::setprecision(3) << "allreduce " << predicted.algorithm << ": T(M) = a + b*M, a = " << cost.a * 1e3
            << " ms, b = " << cost.b * 1e9 << " ns/byte (from " << predicted.cost_source << ")\n";
  std::cout << "profile: t_f (data + forward) = " << profile.forward_seconds * 1e3 << " ms, t_b (backward) = "
            << backward * 1e3 << " ms, update = " << update_seconds * 1e3
            << " ms per iteration; each allreduce launched during backward slows it by kappa = "
            << profile.per_bucket_compute_seconds * 1e3 << " ms\n\n";
  nlohmann::json records = nlohmann::json::array();
  std::vector<std::vector<std::string>> rows = {{"plan", "buckets", "predicted iter ms", "t_c^no ms", "comm ms", "model"}};
  std::vector<std::string> details;
  for (const PlanPrediction& prediction : predicted.plans) {
    const BucketPlan& plan = prediction.plan;
    const PlanTimeline& timeline = prediction.timeline;
    rows.push_back({prediction.name, concat(plan.buckets.size()), milliseconds(prediction.iteration),
                    milliseconds(timeline.non_overlapped), milliseconds(timeline.communication),
                    plan_equation(plan.name)});
    details.push_back(concat(prediction.name, ": ", describe_plan(plan)));
    records.push_back({{"plan", prediction.name},
                       {"buckets", plan.buckets.size()},
                       {"description", describe_plan(plan)},
                       {"predicted_iteration_s", prediction.iteration},
                       {"predicted_non_overlapped_s", timeline.non_overlapped},
                       {"communication_s", timeline.communication}});
  }
  print_table(std::cout, rows);
  std::cout << "\npredicted iter = the timeline's last allreduce finish (t_f + backward with the buckets' "
               "allreduces launched as their layers are ready, one at a time) + update; t_c^no = the part "
               "of the communication not hidden behind backward.\n";
  std::cout << "(one allreduce after backward, without buckets, is the single plan.)\n";
  const WfbpCase& wfbp = predicted.wfbp;
  std::cout << "WFBP is case " << wfbp.number << " of MG-WFBP paper Sec. III-A: ";
  if (wfbp.number == 3) {
    std::cout << "communication-bound from layer " << wfbp.communication_bound_layer
              << " (paper numbering) down, Eq. 13: t_iter = r_C + sum_{j<=C} t_c(j) = ";
  } else {
    std::cout << "communication hidden except layer 1's, Eq. " << (wfbp.number == 1 ? 11 : 12)
              << ": t_iter = t_f + t_b + t_c(1) = ";
  }
  std::cout << std::setprecision(3) << wfbp.iteration * 1e3 << " ms (+ update)\n";
  for (const std::string& line : details) std::cout << line << "\n";

  // Pipe-SGD (K >= 2) over the same profile: Eq. 5 sends the whole gradient after backward, Eq. 6
  // sends each plan's buckets as L segments as they are ready; Eq. 7 is the scaling efficiency.
  const LinkParameters& link = predicted.link;
  const double compute = predicted.compute;
  std::cout << "\nPipe-SGD (the paper's Eq. 5-7, K >= 2, ring allreduce, S = 0) from " << predicted.link_source
            << ": alpha = " << link.alpha * 1e6 << " us, beta = " << link.beta * 1e9 << " ns/byte, gamma = "
            << link.gamma * 1e9 << " ns/byte; up + comp = t_f + t_b + update = " << compute * 1e3 << " ms\n";
  std::vector<std::vector<std::string>> pipe_rows = {
      {"communication", "segments L", "l_b ms", "comm ms", "predicted iter ms", "model"},
      {"sequential", "1", milliseconds(backward), milliseconds(predicted.sequential_comm),
       milliseconds(predicted.sequential_iteration), "Eq. 5"}};
  nlohmann::json pipelined_records = nlohmann::json::array();
  for (const PipelinedPrediction& pipelined : predicted.pipelined) {
    pipe_rows.push_back({concat("pipelined, plan ", pipelined.plan), concat(pipelined.segments),
                         milliseconds(pipelined.first_segment_backward), milliseconds(pipelined.comm),
                         milliseconds(pipelined.iteration), "Eq. 6*"});
    pipelined_records.push_back({{"plan", pipelined.plan},
                                 {"segments", pipelined.segments},
                                 {"first_segment_backward_s", pipelined.first_segment_backward},
                                 {"comm_s", pipelined.comm},
                                 {"predicted_iteration_s", pipelined.iteration}});
  }
  print_table(std::cout, pipe_rows);
  std::cout << "* Eq. 6 with the whole compute: max(up + comp, comm_L). The paper's compute term up + t_f + l_b "
               "leaves out all of backward but the first segment's, yet one compute thread runs all of it every "
               "iteration: no iteration is shorter than up + comp.\n";
  std::cout << std::setprecision(3) << "Eq. 7 scaling efficiency with sequential communication: SE = (up + comp) / "
            << "max(up + comp, comm) = " << predicted.scaling_efficiency << "\n";
  if (!flags.out.empty()) {
    const nlohmann::json document = {{"model", flags.model},
                                     {"workers", flags.workers},
                                     {"network", network.name},
                                     {"allreduce", predicted.algorithm},
                                     {"a_s", cost.a},
                                     {"b_s_per_byte", cost.b},
                                     {"forward_s", profile.forward_seconds},
                                     {"backward_s", backward},
                                     {"update_s", update_seconds},
                                     {"kappa_s", profile.per_bucket_compute_seconds},
                                     {"plans", records},
                                     {"pipe_sgd",
                                      {{"gradient_bytes", gradient_bytes},
                                       {"alpha_s", link.alpha},
                                       {"beta_s_per_byte", link.beta},
                                       {"gamma_s_per_byte", link.gamma},
                                       {"compute_s", compute},
                                       {"sequential_comm_eq5_s", predicted.sequential_comm},
                                       {"sequential_iteration_eq5_s", predicted.sequential_iteration},
                                       {"scaling_efficiency_eq7", predicted.scaling_efficiency},
                                       {"pipelined_eq6", pipelined_records}}}};
    write_json_file(std::filesystem::path(flags.out) / "plan.json", document, "plan");
    std::cout << "wrote " << flags.out << "/plan.json\n";
  }
  return 0;
}

}  // namespace

Subcommand add_plan_command(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  Subcommand plan;
  plan.command = app.add_subcommand(
      "plan", "Bucket plans for layer-wise allreduce: buckets, predicted iteration and t_c^no per plan");
  add_plan_flags(*plan.command, *flags);
  plan.run = [flags](MpiSession*) { return run_plan(*flags); };
  return plan;
}

}  // namespace pipesgd
