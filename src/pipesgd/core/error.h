#pragma once
// Two error tiers.
//  * Checked errors (the classes of core/exceptions.h, included here): anything a user, a data file
//    or a peer can cause. They carry a one-line message that names the problem; the CLI prints it
//    and exits non-zero.
//  * PIPESGD_ASSERT: our own invariants. A failure is a bug in pipesgd; it prints file:line and aborts.
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pipesgd/core/exceptions.h"

namespace pipesgd {

// Builds a message from any streamable parts: concat("rank ", 3, " timed out"). Constrained to
// streamable parts, so that argument-dependent lookup from other libraries' own concat (pybind11's,
// over types of this namespace) does not pick it.
// (SFINAE rather than a requires-clause: the fuzz build compiles some sources as C++17.)
template <typename... Parts,
          typename = std::void_t<decltype((std::declval<std::ostream&>() << ... << std::declval<Parts>()))>>
std::string concat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

// "a, b and c": a list in a sentence, for messages.
inline std::string join_and(const std::vector<std::string>& items) {
  std::string text;
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (k > 0) text += k + 1 == items.size() ? " and " : ", ";
    text += items[k];
  }
  return text;
}

// "a, b, c": the names of a list, for messages.
inline std::string join(const std::vector<std::string>& items, const std::string& separator = ", ") {
  std::string text;
  for (const std::string& item : items) {
    if (!text.empty()) text += separator;
    text += item;
  }
  return text;
}

[[noreturn]] void assertion_failed(const char* expression, const char* file, int line);

}  // namespace pipesgd

#define PIPESGD_ASSERT(condition) \
  ((condition) ? static_cast<void>(0) : ::pipesgd::assertion_failed(#condition, __FILE__, __LINE__))
