# shellcheck shell=bash
# mpirun without --transport mpi: a launch of several ranks would run one whole job per rank, so
# every rank stops with one usage error (rank 0 prints it, exit 2), for every command that trains or
# measures; plan, which has no MPI transport, says to start it without mpirun. One rank (mpirun -np
# 1) runs as a plain process.
# Sourced by run_mpi_cli_tests.sh (uses mpi_run, mpi_usage_error, S, R, expect_success, count_lines).

LOCAL_UNDER_MPIRUN="but --transport is local: pass --transport mpi (each rank is one worker)"
mpi_usage_error local-transport-train 2 "started by mpirun with 2 ranks $LOCAL_UNDER_MPIRUN" train "${S[@]}"
mpi_usage_error local-transport-train-3-ranks 3 "started by mpirun with 3 ranks $LOCAL_UNDER_MPIRUN" train "${S[@]}"
mpi_usage_error local-transport-compare 2 "started by mpirun with 2 ranks $LOCAL_UNDER_MPIRUN" \
  compare --algos dsync,pipe "${S[@]}"
mpi_usage_error local-transport-bench 2 "started by mpirun with 2 ranks $LOCAL_UNDER_MPIRUN" \
  bench allreduce --sizes 4K --quiet
mpi_usage_error local-transport-calibrate 2 "started by mpirun with 2 ranks $LOCAL_UNDER_MPIRUN" \
  calibrate --sizes 4K,8K --quiet
mpi_usage_error plan-under-mpirun 2 \
  "started by mpirun with 2 ranks, but plan runs its workers as threads of one process: start it without mpirun" \
  plan --data synthetic --quiet

# mpirun -np 1 without --transport mpi: the usual run of 4 worker threads, one table.
mpi_run 1 -- train "${S[@]}" >"$R/np1-local.out" 2>"$R/np1-local.err"
expect_success "launch/np1-local-exit-0" $? "$R/np1-local.out" "$R/np1-local.err"
n=$(count_lines "$R/np1-local.out" '^pipesgd train: dsync on mlp .*, 4 workers \(threads\)')
if [ "$n" -eq 1 ]; then
  pass "launch/np1-local-one-run-of-4-threads"
else
  fail "launch/np1-local-one-run-of-4-threads" "$n headers [stdout: $(excerpt "$R/np1-local.out" 400)]"
fi
