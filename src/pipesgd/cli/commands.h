#pragma once
// The subcommands of `pipesgd`, one file each: train_command.cpp, compare_command.cpp,
// bench_command.cpp (bench allreduce and calibrate), plan_command.cpp, profile_command.cpp,
// simulate_command.cpp, advise_command.cpp, report_command.cpp, export_command.cpp. Each
// registers its flags and says how to run; main.cpp parses, starts MPI when asked, runs and reports
// errors.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "pipesgd/cli/cli_common.h"

namespace pipesgd {

struct Subcommand {
  CLI::App* command = nullptr;
  std::function<std::string()> transport;      // its --transport (local or mpi); empty: threads only (plan)
  std::function<int(MpiSession* session)> run;  // session: nullptr unless --transport mpi
  // Given the command line as typed (argv) before run, by a subcommand that records it.
  std::function<void(const std::vector<std::string>& argv)> command_line;
};

Subcommand add_train_command(CLI::App& app);
Subcommand add_compare_command(CLI::App& app);
// `bench allreduce` under `bench`.
Subcommand add_bench_allreduce_command(CLI::App& bench);
Subcommand add_calibrate_command(CLI::App& app);
Subcommand add_plan_command(CLI::App& app);
Subcommand add_profile_command(CLI::App& app);
// simulate_command.cpp and advise_command.cpp (flags shared in simulation_flags.h).
Subcommand add_simulate_command(CLI::App& app);
Subcommand add_advise_command(CLI::App& app);
// `report DIR`: a train or compare --out directory as an HTML page.
Subcommand add_report_command(CLI::App& app);
// `export CHECKPOINT --out model.pt`: a checkpoint's model as TorchScript.
Subcommand add_export_command(CLI::App& app);

}  // namespace pipesgd
