// `pipesgd export CHECKPOINT --out model.pt`: a checkpoint's model as TorchScript (the file
// torch.jit.load reads), the same bytes' worth as the checkpoint-<iteration>-model.pt train writes
// beside each set and the model.pt of its --out (train/checkpointing.h).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>

#include "pipesgd/cli/commands.h"
#include "pipesgd/core/atomic_file.h"
#include "pipesgd/core/checkpoint.h"
#include "pipesgd/core/error.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/torch/torchscript_model.h"
#include "pipesgd/train/checkpointing.h"

namespace pipesgd {
namespace {

namespace fs = std::filesystem;

struct ExportFlags {
  std::string checkpoint;
  std::string out;
  std::string model;
};

// The worker part to export: CHECKPOINT itself if it holds weights; for a set's shared part, the
// set's rank0 part; for a --checkpoint-dir, rank 0's part of its newest valid set.
CheckpointReader worker_part(const std::string& checkpoint) {
  std::error_code error;
  if (fs::is_directory(checkpoint, error)) {
    const auto set = find_newest_valid_checkpoint(checkpoint, {"rank0"}, [](const std::string& line) {
      std::cerr << "pipesgd: warning: " << line << "\n";
    });
    if (!set) throw DataError(concat("no valid checkpoint with a rank0 part in '", checkpoint, "'"));
    return CheckpointReader::read_file(set->parts.at("rank0"));
  }
  CheckpointReader part = CheckpointReader::read_file(checkpoint);
  if (part.has("model.parameters")) return part;
  const auto name = parse_checkpoint_name(fs::path(checkpoint).filename().string());
  if (part.has("run") && name && name->part == "shared") {
    return CheckpointReader::read_file(checkpoint_path(fs::path(checkpoint).parent_path(), name->iteration, "rank0"));
  }
  throw DataError(concat("checkpoint '", checkpoint,
                         "' holds no model weights (a parameter server's shard?); export a worker's part, "
                         "checkpoint-<iteration>-rank0.psgd"));
}

std::string layer_list(const Layout& layout) {
  std::string text;
  for (std::size_t s = 0; s < layout.segment_count() && s < 4; ++s) text += concat(s == 0 ? "" : ", ", layout.segment(s).name);
  return layout.segment_count() > 4 ? concat(text, ", ... (", layout.segment_count(), " layers)") : text;
}

int run_export(const ExportFlags& flags) {
  const CheckpointReader part = worker_part(flags.checkpoint);
  const CheckpointModel record = read_checkpoint_model(part);
  const std::string& origin = part.origin();
  const std::string name = flags.model.empty() ? record.name : flags.model;
  if (name.empty()) {
    throw UsageError(concat("checkpoint '", origin, "' does not record its model (written by an older pipesgd); pass --model"));
  }
  std::unique_ptr<Model> model;
  if (names_torchscript_file(name)) {
    if (record.layers.empty()) {
      throw UsageError(concat("checkpoint '", origin, "' does not record the layer order of its model (written by an ",
                              "older pipesgd), so a TorchScript model cannot be exported from it"));
    }
    // The run's relative path is relative to the directory it ran in; --model's to this one.
    fs::path path = name;
    if (flags.model.empty() && path.is_relative() && !record.directory.empty()) path = fs::path(record.directory) / path;
    model = torchscript_model_for_export(path.string(), record.layers);
  } else {
    model = torch_model_factory(name)(0);
  }

  // The model must be the checkpoint's: its layout (names, where recorded, and sizes) and buffers.
  const Layout& layout = model->layout();
  bool same = layout.total() == record.parameters.size();
  if (same && !record.layers.empty()) {
    same = record.layers.size() == layout.segment_count();
    for (std::size_t s = 0; same && s < layout.segment_count(); ++s) same = record.layers[s] == layout.segment(s).name;
  }
  const std::size_t buffer_bytes = model->buffers().size();
  if (same && record.has_buffers) same = record.buffers.size() == buffer_bytes;
  if (!same) {
    throw UsageError(concat("model '", name, "' (", layout.total(), " parameters: ", layer_list(layout),
                            ") is not the model of checkpoint '", origin, "' (", record.parameters.size(), " parameters",
                            record.name.empty() ? std::string() : concat(" of model '", record.name, "'"), ")"));
  }
  if (!record.has_buffers && buffer_bytes > 0) {
    throw DataError(concat("checkpoint '", origin, "' has no model buffers (written by an older pipesgd); model '", name,
                           "' has buffers (BatchNorm statistics) it cannot restore"));
  }
  std::copy(record.parameters.begin(), record.parameters.end(), model->parameters().begin());
  if (record.has_buffers) model->load_buffers(record.buffers);

  const std::string bytes = model->torchscript();
  PIPESGD_ASSERT(!bytes.empty());
  write_file_atomically(flags.out, std::string_view(bytes), "model");
  std::cout << "wrote " << flags.out << " (model '" << name << "', " << layout.total() << " parameters, after "
            << part.integer("next_iteration") << " iterations)\n";
  return 0;
}

}  // namespace

Subcommand add_export_command(CLI::App& app) {
  auto flags = std::make_shared<ExportFlags>();
  Subcommand command;
  command.command = app.add_subcommand(
      "export", "Write a checkpoint's model as TorchScript (a file torch.jit.load reads), with its BatchNorm statistics");
  command.command
      ->add_option("CHECKPOINT", flags->checkpoint,
                   "A worker's checkpoint file (checkpoint-<iteration>-rankR.psgd; a set's -shared.psgd means its "
                   "rank0 part), or a --checkpoint-dir (its newest valid set's rank 0)")
      ->required();
  command.command->add_option("--out", flags->out, "The TorchScript file to write, e.g. model.pt")->required();
  command.command->add_option("--model", flags->model,
                              "The model the checkpoint holds: a built-in name or a TorchScript PATH.pt (default: the "
                              "run's --model, which the checkpoint records; a relative path is taken from the "
                              "directory the run ran in)");
  command.run = [flags](MpiSession*) { return run_export(*flags); };
  return command;
}

}  // namespace pipesgd
