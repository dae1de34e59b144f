#include "pipesgd/core/text_table.h"

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <sstream>

namespace pipesgd {

std::string format_number(const char* pattern, double value) {
  char text[64];
  std::snprintf(text, sizeof text, pattern, value);
  return text;
}

std::string milliseconds(double seconds) { return format_number("%.3f", seconds * 1e3); }

std::string percent(double fraction) { return format_number("%.1f%%", fraction * 100); }

void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (std::size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (std::size_t c = 0; c < rows[r].size(); ++c) {
      const std::string& cell = rows[r][c];
      const std::string pad(widths[c] - cell.size(), ' ');
      line += c == 0 ? cell + pad : "  " + pad + cell;
    }
    out << line << '\n';
    if (r == 0) {
      std::size_t total = 0;
      for (std::size_t w : widths) total += w + 2;
      out << std::string(total - 2, '-') << '\n';
    }
  }
}

std::vector<std::vector<std::string>> select_columns(const std::vector<std::vector<std::string>>& rows,
                                                     const std::vector<std::string>& headings) {
  std::vector<std::size_t> kept;
  if (!rows.empty()) {
    for (std::size_t c = 0; c < rows.front().size(); ++c) {
      if (std::find(headings.begin(), headings.end(), rows.front()[c]) != headings.end()) kept.push_back(c);
    }
  }
  std::vector<std::vector<std::string>> selected;
  for (const auto& row : rows) {
    std::vector<std::string> cells;
    for (std::size_t c : kept) cells.push_back(c < row.size() ? row[c] : std::string());
    selected.push_back(std::move(cells));
  }
  return selected;
}

std::vector<std::string> wrap_words(const std::string& text, std::size_t width) {
  width = std::max<std::size_t>(width, 1);
  std::vector<std::string> lines;
  std::istringstream paragraphs(text);
  std::string paragraph;
  while (std::getline(paragraphs, paragraph)) {
    std::istringstream words(paragraph);
    std::string word;
    std::string line;
    bool any = false;
    while (words >> word) {
      any = true;
      while (word.size() > width) {  // a word longer than a line: cut
        if (!line.empty()) lines.push_back(std::move(line));
        line.clear();
        lines.push_back(word.substr(0, width));
        word.erase(0, width);
      }
      if (word.empty()) continue;
      if (line.empty()) {
        line = word;
      } else if (line.size() + 1 + word.size() <= width) {
        line += ' ' + word;
      } else {
        lines.push_back(std::move(line));
        line = word;
      }
    }
    if (!line.empty() || !any) lines.push_back(line);
  }
  return lines;
}

std::string wrap_prose_lines(const std::string& text, std::size_t width, std::size_t indent) {
  std::istringstream input(text);
  std::ostringstream out;
  std::string line;
  while (std::getline(input, line)) {
    const std::size_t start = line.find_first_not_of(' ');
    // A table's row (columns apart by two or more spaces) or rule (dashes) is never wrapped.
    const bool table = start != std::string::npos && (line.find("  ", start) != std::string::npos ||
                                                      line.find_first_not_of('-', start) == std::string::npos);
    if (line.size() <= width || table || width <= indent + 10) {
      out << line << '\n';
      continue;
    }
    const std::vector<std::string> wrapped = wrap_words(line, width);
    // The first line at full width, the rest indented.
    out << wrapped.front() << '\n';
    const std::string tail = line.substr(line.find(wrapped.front()) + wrapped.front().size());
    if (tail.find_first_not_of(' ') == std::string::npos) continue;
    for (const std::string& continued : wrap_words(tail, width - indent)) {
      out << std::string(indent, ' ') << continued << '\n';
    }
  }
  return out.str();
}

}  // namespace pipesgd
