#pragma once
// Plain-text report formatting shared by every report (train's, compare's, the methods' own).
#include <iosfwd>
#include <string>
#include <vector>

namespace pipesgd {

// Prints rows of cells as an aligned table: the first row is the header, underlined; the first
// column left-aligned, the others right-aligned.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows);

// Seconds as milliseconds with 3 decimals, e.g. "12.345".
std::string milliseconds(double seconds);
// A fraction as a percentage with one decimal, e.g. "12.3%".
std::string percent(double fraction);
// `value` through a printf pattern of one double, e.g. format_number("%.2fx", 1.5) = "1.50x".
std::string format_number(const char* pattern, double value);

}  // namespace pipesgd
