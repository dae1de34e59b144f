// The `pipesgd` command: parses the command line (CLI11), starts MPI when --transport mpi asks for
// it, runs the subcommand (one file each, cli/commands.h) and turns every failure into one line
// `pipesgd: error: ...` (exit 2 for usage errors, 1 otherwise).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pipesgd/cli/cli_common.h"
#include "pipesgd/cli/commands.h"
#include "pipesgd/cli/help_format.h"
#include "pipesgd/cli/train_options.h"
#include "pipesgd/comm/launch_environment.h"
#include "pipesgd/core/error.h"
#include "pipesgd/core/error_line.h"
#include "pipesgd/core/heap_retention.h"
#include "pipesgd/core/interrupt.h"
#include "pipesgd/torch/torch_models.h"
#include "pipesgd/train/early_stop.h"

namespace {

// A launch of several ranks without --transport mpi would run one whole job per rank, each printing
// its own results: stop them all, as a usage error. Rank 0 prints the line, or, when the launch does
// not tell its size (rank 0 of a PMIx launch cannot tell it is not alone, and runs), every rank
// that knows; the others wait a second first, since mpirun ends the job at the first rank that
// exits non-zero.
int refuse_independent_ranks(const pipesgd::LaunchEnvironment& launch, const std::string& command,
                             bool has_transport) {
  using pipesgd::concat;
  if (launch.rank <= 0 || launch.size == 0) {
    const std::string ranks = launch.size > 0 ? concat(launch.size, " ranks") : std::string("more than one rank");
    const std::string line =
        has_transport ? concat("started by ", launch.launcher, " with ", ranks,
                               " but --transport is local: pass --transport mpi (each rank is one worker)")
                      : concat("started by ", launch.launcher, " with ", ranks, ", but ", command,
                               " runs its workers as threads of one process: start it without ", launch.launcher);
    std::fprintf(stderr, "pipesgd: error: %s\n", line.c_str());
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return 2;
}

// A torchrun-style launch (RANK and WORLD_SIZE > 1, no MPI launcher) would run one whole job per
// process: its processes never join one MPI world. Stop them all, as a usage error, with one line
// that names the variables and the launch to use instead. Every process prints it (each knows its
// rank, and run alone with the variables it must say why it stops); the ones other than rank 0
// wait a second first, since torchrun stops the others when one exits non-zero.
int refuse_torchrun(const pipesgd::LaunchEnvironment& launch, const std::string& command, bool has_transport) {
  using pipesgd::concat;
  if (launch.torchrun_rank > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  const int n = launch.torchrun_size;
  const std::string started = concat("this process was started torchrun-style (", launch.torchrun_variables,
                                     ") without an MPI launcher; ");
  const std::string line =
      has_transport
          ? concat(started, "pipesgd's ranks join through MPI: launch with `pipesgdrun -np ", n, " ...` or `mpirun -np ",
                   n, " ...` and --transport mpi (the workers would otherwise ",
                   command == "train" || command == "compare" ? "train" : "run", " as independent jobs)")
          : concat(started, command, " runs its workers as threads of one process: start it once, without torchrun (the ",
                   n, " processes would otherwise each run it)");
  std::fprintf(stderr, "pipesgd: error: %s\n", line.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pipesgd;
  keep_freed_memory_in_heap();  // no fresh page faults for every iteration's temporaries
  const std::vector<std::string> command_line(argv, argv + argc);  // as typed (MPI_Init may edit argv)
  CLI::App app{
      "pipesgd: data-parallel training that hides gradient communication behind computation\n"
      "(D-Sync and Pipe-SGD over ring, recursive-doubling, halving-doubling, tree or direct allreduce "
      "with in-message compression; layer-wise bucketed allreduce (WFBP, MG-WFBP, optimal plans); "
      "parameter-server methods (PS-Sync, ASGD, DC-ASGD, OD-SGD); SAPipe's partial staleness; "
      "workers as threads or MPI ranks)."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  app.set_version_flag("--version", [] { return concat("pipesgd ", pipesgd_version()); }, "Print the version and exit");
  // Help wrapped to the terminal (80 columns when stdout is not one); subcommands inherit it.
  app.formatter(std::make_shared<WrappingFormatter>(terminal_width(80)));
  std::vector<Subcommand> commands = {add_train_command(app), add_compare_command(app)};
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  commands.push_back(add_bench_allreduce_command(*bench));
  commands.push_back(add_calibrate_command(app));
  commands.push_back(add_plan_command(app));
  commands.push_back(add_profile_command(app));
  commands.push_back(add_simulate_command(app));
  commands.push_back(add_advise_command(app));
  commands.push_back(add_report_command(app));
  commands.push_back(add_export_command(app));

  const auto known = [&](const std::string& name) {
    for (const CLI::App* command : app.get_subcommands({})) {
      if (command->get_name() == name) return true;
    }
    return false;
  };
  if (argc > 1 && argv[1][0] != '-' && !known(argv[1])) {
    std::vector<std::string> names;
    for (const CLI::App* command : app.get_subcommands({})) names.push_back(command->get_name());
    const std::string meant = closest_name(argv[1], names);
    const std::string last = names.back();
    names.pop_back();
    std::fprintf(stderr, "pipesgd: error: unknown command '%s'%s (expected %s or %s; see --help)\n", argv[1],
                 meant.empty() ? "" : concat("; did you mean ", meant, "?").c_str(), join(names).c_str(), last.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForVersion& version) {
    return app.exit(version);
  } catch (const CLI::ParseError& error) {
    const std::string unknown = unknown_argument_message(app, error);
    if (!unknown.empty()) {
      std::fprintf(stderr, "pipesgd: error: %s\n", unknown.c_str());
    } else {
      std::fprintf(stderr, "pipesgd: error: %s (see --help)\n", error.what());
    }
    return 2;
  }
  const Subcommand* chosen = nullptr;
  for (const Subcommand& command : commands) {
    if (command.command->parsed()) chosen = &command;
  }
  if (chosen == nullptr) return 2;  // CLI11 requires one

  if (chosen->command_line) chosen->command_line(command_line);
  // --transport mpi: MPI starts here, after the flags parsed (a typo never needs mpirun to report).
  std::unique_ptr<MpiSession> session;
  const LaunchEnvironment launch = launch_environment();
  try {
    const bool mpi = chosen->transport && uses_mpi(chosen->transport());
    // torchrun with WORLD_SIZE > 1: with --transport local or mpi, its processes would not be ranks
    // of one world. (A torchrun of one process runs as a plain process.)
    if (launch.torchrun_world()) {
      return refuse_torchrun(launch, chosen->command->get_name(), static_cast<bool>(chosen->transport));
    }
    // A launch of one rank (mpirun -np 1) without --transport mpi runs as a plain process.
    if (!mpi && launch.several_ranks()) {
      const bool has_transport = static_cast<bool>(chosen->transport);
      return refuse_independent_ranks(launch, chosen->command->get_name(), has_transport);
    }
    if (mpi) {
      if (!launch.launched()) {
        throw UsageError("--transport mpi: start pipesgd with mpirun, e.g. mpirun -np 4 pipesgd train "
                         "--transport mpi (see README)");
      }
      shared_memory_from_environment(true);  // a bad PIPESGD_MPI_SHARED_MEMORY: before MPI starts
      session = std::make_unique<MpiSession>(&argc, &argv);
    }
    init_torch_runtime(1);
    const int code = chosen->run(session.get());
    // A SIGINT / SIGTERM waits for an iteration boundary (core/interrupt.h); one that came after the
    // last one (during the final evaluation or the writing of the results) found the work done.
    // The command still exits as interrupted, so that the shell or script that sent it stops too.
    const int late = interrupt_signal().load();
    if (code != 0 || late == 0) return code;
    if (session == nullptr || session->leader()) {
      std::cout << std::flush;
      std::fprintf(stderr, "pipesgd: interrupted by %s after the last iteration: the results above are complete\n",
                   signal_name(late).c_str());
    }
    return 128 + late;
  } catch (const std::exception& error) {
    const bool usage = dynamic_cast<const UsageError*>(&error) != nullptr;
    const int exit_code = usage ? 2 : 1;
    if (!session) {
      // Every rank of a launch has the same usage error before MPI starts: rank 0 prints it and
      // exits, and mpirun ends the job at that first non-zero exit, these waits included. The others
      // wait for that, and print the error themselves only if rank 0 has not ended the job by then
      // (its environment differed, or it started very late): a 1 s wait lost rank 0's line to a
      // loaded machine (mpirun ended the job at rank 1's exit, before rank 0 printed).
      if (usage && launch.rank > 0) std::this_thread::sleep_for(std::chrono::seconds(15));
      std::fprintf(stderr, "pipesgd: error: %s\n", error.what());
      return exit_code;
    }
    // Under MPI: a rank other than 0 that stops because the run was interrupted (another rank told
    // it so, or it was signalled itself) exits quietly; rank 0 reports the run (interrupted_exit).
    if (!session->leader()) {
      const auto* peer_failed = dynamic_cast<const PeerFailedError*>(&error);
      const std::optional<int> told = peer_failed != nullptr ? peer_interruption(*peer_failed) : std::nullopt;
      const int signalled = interrupt_signal().load();
      if (told || (signalled != 0 && dynamic_cast<const CommError*>(&error) != nullptr)) {
        interrupted_exit(told.value_or(signalled), session.get());
      }
    }
    // Otherwise tell the other ranks at once (they stop with PeerFailedError instead of waiting
    // for their timeouts), print one line (a usage error once, from rank 0: every rank has the same
    // flags), and leave without MPI_Finalize, which could wait forever on a dead peer.
    if (!usage || session->leader()) {
      write_error_line(concat(usage ? "" : concat("rank ", session->runtime.rank(), ": "), error.what()));
    }
    session->transport.report_failure(error.what());
    if (usage && !session->leader()) {
      // mpirun aborts the job as soon as one rank exits non-zero: give rank 0, which has the same
      // usage error, time to print the line first.
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    MpiRuntime::exit_without_finalize(exit_code);
  }
}
