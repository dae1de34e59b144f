#pragma once
// Plain-text report formatting shared by every report (train's, compare's, the methods' own).
#include <iosfwd>
#include <string>
#include <vector>

namespace pipesgd {

// Prints rows of cells as an aligned table: the first row is the header, underlined; the first
// column left-aligned, the others right-aligned.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows);

// The columns of `rows` whose heading (first row) is in `headings`, in the table's order.
std::vector<std::vector<std::string>> select_columns(const std::vector<std::vector<std::string>>& rows,
                                                     const std::vector<std::string>& headings);

// `text` word-wrapped to lines of at most `width` characters (a word longer than a line is cut);
// its own newlines are kept. No trailing newline.
std::vector<std::string> wrap_words(const std::string& text, std::size_t width);

// Every line of `text` longer than `width` that is prose (no run of two spaces inside it, which
// tables have) word-wrapped, its continuation lines indented by `indent` spaces; tables and short
// lines as they are.
std::string wrap_prose_lines(const std::string& text, std::size_t width, std::size_t indent = 2);

// Seconds as milliseconds with 3 decimals, e.g. "12.345".
std::string milliseconds(double seconds);
// A fraction as a percentage with one decimal, e.g. "12.3%".
std::string percent(double fraction);
// `value` through a printf pattern of one double, e.g. format_number("%.2fx", 1.5) = "1.50x".
std::string format_number(const char* pattern, double value);

}  // namespace pipesgd
