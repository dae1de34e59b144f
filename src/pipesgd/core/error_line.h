#pragma once
// A process's one error line, "pipesgd: error: <text>", on stderr: written once, by whichever thread
// gets there first. The CLI's main thread writes it when a run fails; mpi/'s LauncherWatch writes it
// instead when the launcher is ending the job and the thread that would have written it is stuck in
// MPI. Async-safe enough for that: one atomic exchange, one write(2).
#include <string>

namespace pipesgd {

// Writes "pipesgd: error: <text>\n" to stderr unless this process wrote its error line already;
// true if it wrote it now. Any thread.
bool write_error_line(const std::string& text);

}  // namespace pipesgd
