#pragma once
// Scheduling of the worker threads. On a cluster every worker owns its CPU and its NIC moves bytes
// without waiting for the CPU scheduler. When workers share a machine's cores (threads of one
// process, or oversubscribed MPI ranks), a communication thread that wakes up to move the next
// segment must not queue behind a compute thread for a time slice, or communication stretches far
// beyond what the link needs. These calls give communication threads the precedence a NIC has.
#include <string>

namespace pipesgd {

// For the calling communication thread: SCHED_FIFO at the lowest real-time priority if permitted
// (root or CAP_SYS_NICE); otherwise a short EEVDF time slice (Linux >= 6.12, unprivileged), so a
// wake-up preempts compute quickly. Communication threads block, never spin. Returns what was
// applied ("fifo", "short-slice" or "default"). Never throws.
std::string raise_communication_thread_priority();

// True if this process may give threads SCHED_FIFO (tested on the calling thread, then undone).
bool realtime_priority_permitted();

// The calling thread's role in waiting for messages. A communication thread (CommWorker's) marks
// itself: its waits block at once, because the core it would poll on belongs to its compute thread.
// Any other thread (a compute thread running a collective itself, as D-Sync does) has nothing else
// to run meanwhile, so a transport may let it poll briefly before it blocks.
void mark_communication_thread();
bool is_communication_thread();

// Fallback when real-time priority is not permitted, for the calling compute thread: nice +10
// (unprivileged; it also makes the run yield to every other process on the machine). Threads created afterwards inherit it,
// so call this after the thread has spawned its communication thread. Never throws.
void lower_compute_thread_priority();

}  // namespace pipesgd
