#pragma once
// Runs a body in a child process and returns what it produced.
//
// SimGrid keeps one simulation engine per process: once a platform is built and run, the process
// cannot build another. Every simulation therefore runs in a forked child (run_isolated), which
// also lets independent simulations run side by side and keeps a crash of one from taking the
// caller down. Only the calling thread is duplicated by fork(): the body must not rely on other
// threads of the parent (SimGrid's own contexts are created in the child).
#include <functional>
#include <string>
#include <string_view>

namespace pipesgd {

// Forks, runs `body` in the child and returns the string it returned. A checked error thrown by the
// body (UsageError, DataError, Error) is rethrown here with the same class and message; a child
// that dies (signal, abort, exit without a result) throws Error naming `what` and the cause.
std::string run_isolated(std::string_view what, const std::function<std::string()>& body);

}  // namespace pipesgd
