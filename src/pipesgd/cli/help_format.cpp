#include "pipesgd/cli/help_format.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "pipesgd/core/error.h"
#include "pipesgd/core/text_table.h"

namespace pipesgd {
namespace {

constexpr std::size_t kMinimumWidth = 40;

// Every line of `text` word-wrapped to `width`, each line ending in a newline.
std::string wrapped(const std::string& text, std::size_t width, const std::string& indent = "") {
  std::string out;
  for (const std::string& line : wrap_words(text, width > indent.size() ? width - indent.size() : 1)) {
    out += indent + line + "\n";
  }
  return out;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// Optimal string alignment distance (Damerau-Levenshtein without repeated edits of a substring).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The subcommand CLI11 parsed last (the deepest one given), or `app` itself.
const CLI::App* deepest_parsed(const CLI::App& app) {
  const CLI::App* current = &app;
  for (bool descended = true; descended;) {
    descended = false;
    for (const CLI::App* command : current->get_subcommands({})) {
      if (command->parsed()) {
        current = command;
        descended = true;
        break;
      }
    }
  }
  return current;
}

// "pipesgd train", "pipesgd bench allreduce": how a command is typed.
std::string command_path(const CLI::App* command) {
  std::vector<std::string> names;
  for (const CLI::App* at = command; at != nullptr; at = at->get_parent()) {
    names.push_back(at->get_parent() == nullptr ? std::string("pipesgd") : at->get_name());
  }
  std::reverse(names.begin(), names.end());
  std::string path;
  for (const std::string& name : names) path += (path.empty() ? "" : " ") + name;
  return path;
}

std::vector<std::string> subcommand_names(const CLI::App* command) {
  std::vector<std::string> names;
  for (const CLI::App* sub : command->get_subcommands({})) names.push_back(sub->get_name());
  return names;
}

std::string did_you_mean(const std::string& typed, const std::vector<std::string>& candidates) {
  const std::string meant = closest_name(typed, candidates);
  return meant.empty() ? std::string() : concat("; did you mean ", meant, "?");
}

}  // namespace

std::size_t terminal_width(std::size_t fallback) {
  if (const char* columns = std::getenv("COLUMNS")) {
    char* end = nullptr;
    const long value = std::strtol(columns, &end, 10);
    if (end != columns && *end == '\0' && value >= 20 && value <= 10000) return static_cast<std::size_t>(value);
  }
  winsize size{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col >= 20) return size.ws_col;
  return fallback;
}

WrappingFormatter::WrappingFormatter(std::size_t width) : width_(std::max(width, kMinimumWidth)) {
  column_width(std::min<std::size_t>(30, width_ / 3));
}

std::string WrappingFormatter::name_and_description(const std::string& name, const std::string& description) const {
  const std::string label = "  " + name;
  const std::string column(column_width_, ' ');
  std::string out;
  std::vector<std::string> lines = wrap_words(description, width_ - column_width_);
  if (description.empty()) lines.clear();
  std::size_t first = 0;
  if (label.size() < column_width_ && !lines.empty()) {
    out = label + std::string(column_width_ - label.size(), ' ') + lines[0] + "\n";
    first = 1;
  } else {
    out = wrapped(name, width_, "  ");
  }
  for (std::size_t k = first; k < lines.size(); ++k) out += column + lines[k] + "\n";
  return out;
}

std::string WrappingFormatter::make_option(const CLI::Option* option, bool is_positional) const {
  return name_and_description(make_option_name(option, is_positional) + make_option_opts(option),
                              make_option_desc(option));
}

std::string WrappingFormatter::make_subcommand(const CLI::App* command) const {
  return name_and_description(command->get_display_name(true), command->get_description());
}

std::string WrappingFormatter::make_expanded(const CLI::App* command) const {
  constexpr std::size_t kIndent = 2;  // CLI::Formatter::make_expanded indents all but the name line
  WrappingFormatter inner(*this);
  if (width_ > 20 + kIndent) inner.width_ = width_ - kIndent;
  return inner.CLI::Formatter::make_expanded(command);
}

std::string WrappingFormatter::make_description(const CLI::App* app) const {
  const std::string description = CLI::Formatter::make_description(app);
  return description.empty() ? description : wrapped(description, width_);
}

std::string WrappingFormatter::make_usage(const CLI::App* app, std::string name) const {
  return wrapped(CLI::Formatter::make_usage(app, std::move(name)), width_);
}

std::string WrappingFormatter::make_footer(const CLI::App* app) const {
  const std::string footer = CLI::Formatter::make_footer(app);
  return footer.empty() ? footer : wrapped(footer, width_);
}

std::string closest_name(const std::string& typed, const std::vector<std::string>& candidates) {
  const auto bare = [](const std::string& name) { return lower(name.substr(name.find_first_not_of('-') == std::string::npos ? 0 : name.find_first_not_of('-'))); };
  const std::string word = bare(typed);
  if (word.size() < 2) return "";  // one letter (-x): anything is one edit away
  std::string best;
  std::size_t best_distance = std::string::npos;
  std::vector<std::string> extended;  // candidates that `typed` begins
  for (const std::string& candidate : candidates) {
    const std::string name = bare(candidate);
    if (name.empty()) continue;
    if (name.size() > word.size() && name.starts_with(word)) extended.push_back(candidate);
    const std::size_t distance = edit_distance(word, name);
    if (distance < best_distance) {
      best_distance = distance;
      best = candidate;
    }
  }
  // A typo: about one edit in three letters at most (1 for short names, up to 3).
  const std::size_t allowed = std::clamp<std::size_t>(word.size() / 3, 1, 3);
  if (best_distance <= allowed) return best;
  if (extended.size() == 1 && word.size() >= 3) return extended.front();
  return "";
}

std::string unknown_argument_message(const CLI::App& app, const CLI::ParseError& error) {
  const CLI::App* command = deepest_parsed(app);
  const std::vector<std::string> extras = app.remaining(true);
  const std::string see = concat(" (see ", command_path(command), " --help)");
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    for (const std::string& extra : extras) {
      if (extra.size() < 2 || extra[0] != '-' || std::isdigit(static_cast<unsigned char>(extra[1])) || extra[1] == '.') {
        continue;  // a value (negative numbers too), not an option
      }
      const std::string typed = extra.substr(0, extra.find('='));
      std::vector<std::string> options;
      for (const CLI::Option* option : command->get_options()) {
        for (const std::string& name : option->get_lnames()) options.push_back("--" + name);
        for (const std::string& name : option->get_snames()) options.push_back("-" + name);
      }
      return concat("unknown option ", typed, did_you_mean(typed, options), see);
    }
    return "";
  }
  // A command that needs a subcommand was given a word that names none (bench allredce).
  if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr && command->get_require_subcommand_min() > 0) {
    for (const std::string& extra : extras) {
      if (extra.empty() || extra[0] == '-') continue;
      return concat("unknown command '", extra, "' for ", command_path(command),
                    did_you_mean(extra, subcommand_names(command)), see);
    }
  }
  return "";
}

}  // namespace pipesgd
