#pragma once
// The command line's text for people: --help wrapped to the terminal's width (CLI11 leaves every
// description on one line), and a suggestion for a mistyped option or command ("did you mean
// --iters?").
#include <CLI/CLI.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace pipesgd {

// The terminal's width in columns: COLUMNS if it is a number >= 20, else stdout's terminal's
// (TIOCGWINSZ), else `fallback` (stdout is a file or a pipe).
std::size_t terminal_width(std::size_t fallback = 80);

// CLI11's help layout (options in a column, descriptions beside them) with every line at most
// `width` characters: descriptions, usage and footers word-wrapped, a name too long for its column
// on a line of its own.
class WrappingFormatter : public CLI::Formatter {
 public:
  explicit WrappingFormatter(std::size_t width);
  std::string make_option(const CLI::Option* option, bool is_positional) const override;
  std::string make_subcommand(const CLI::App* command) const override;
  std::string make_description(const CLI::App* app) const override;
  std::string make_usage(const CLI::App* app, std::string name) const override;
  std::string make_footer(const CLI::App* app) const override;
  // --help-all: a subcommand's help indented by 2 under its name, so laid out 2 narrower.
  std::string make_expanded(const CLI::App* command) const override;

 private:
  // "  name   description..." wrapped: the description in the column after column_width_.
  std::string name_and_description(const std::string& name, const std::string& description) const;
  std::size_t width_;
};

// The candidate closest to `typed` by edit distance (insertions, deletions, substitutions and
// swaps of neighbours), if it is close enough to be a typo of it (or `typed` is a prefix of exactly
// one candidate); "" otherwise.
std::string closest_name(const std::string& typed, const std::vector<std::string>& candidates);

// After CLI11 refused the command line with `error`: a one-line message that names the unknown
// option or command and, for a near miss, the one meant ("unknown option --iter; did you mean
// --iters?"); "" when the error is of another kind (the caller prints CLI11's own).
std::string unknown_argument_message(const CLI::App& app, const CLI::ParseError& error);

}  // namespace pipesgd
