// The layer rules of docs/ARCHITECTURE.md ("Who may include what") checked against the source tree:
// every `#include "pipesgd/..."` and library include of src/pipesgd/ and include/pipesgd/, read from
// the files, against the table read from the document; and no method named by a string literal
// outside algo/ (the code outside algo/ sees methods through the registry's traits and functions).
// The checkers also run over small planted trees, so a test that passes can also fail.
#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pipesgd/algo/registry.h"
#include "pipesgd/core/error.h"
#include "pipesgd/timing/bucket_plan.h"
#include "temp_dir.h"

namespace pipesgd {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTableHeading = "### Who may include what";

// A row of the folder table: files under `folder` may include what `may_include` matches.
struct FolderRule {
  std::string folder;  // "core/", "algo/*/", "include/pipesgd/"
  std::vector<std::string> may_include;
};

// A row of the library table: includes starting with one of `prefixes` only under `only_under`.
struct LibraryRule {
  std::string library;
  std::vector<std::string> prefixes;  // "<torch/", "<mpi.h>"
  std::vector<std::string> only_under;
};

struct LayerTable {
  std::vector<FolderRule> folders;
  std::vector<LibraryRule> libraries;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// `text` cut at every `mark`: n marks give n + 1 pieces.
std::vector<std::string> pieces_between(const std::string& text, char mark) {
  std::vector<std::string> pieces(1);
  for (char c : text) {
    if (c == mark) {
      pieces.emplace_back();
    } else {
      pieces.back() += c;
    }
  }
  return pieces;
}

// The spans in backquotes of a table cell: the rule's entries (the prose around them is for readers).
std::vector<std::string> quoted_spans(const std::string& cell) {
  std::vector<std::string> pieces = pieces_between(cell, '`');
  std::vector<std::string> spans;
  for (std::size_t i = 1; i + 1 < pieces.size(); i += 2) spans.push_back(pieces[i]);
  return spans;
}

// The cells of a table row "| a | b |": the pieces between its first and last '|'.
std::vector<std::string> table_cells(const std::string& line) {
  std::vector<std::string> pieces = pieces_between(line, '|');
  if (pieces.size() < 2) return {};
  return std::vector<std::string>(pieces.begin() + 1, pieces.end() - 1);
}

// The two tables under kTableHeading, up to the next heading. Empty folders (no heading): the
// caller's assertion says so.
LayerTable read_layer_table(const fs::path& markdown) {
  LayerTable table;
  const std::vector<std::string> lines = split_lines(read_text(markdown));
  auto line = std::find(lines.begin(), lines.end(), kTableHeading);
  if (line == lines.end()) return table;
  enum class Kind { kNone, kFolders, kLibraries } kind = Kind::kNone;
  for (++line; line != lines.end() && !line->starts_with("#"); ++line) {
    if (!line->starts_with("|")) {
      kind = Kind::kNone;
      continue;
    }
    const std::vector<std::string> cells = table_cells(*line);
    if (cells.size() < 3 || line->starts_with("|---")) continue;
    if (cells[0].find("folder") != std::string::npos && cells[0].find('`') == std::string::npos) {
      kind = Kind::kFolders;
    } else if (cells[0].find("library") != std::string::npos) {
      kind = Kind::kLibraries;
    } else if (kind == Kind::kFolders) {
      const std::vector<std::string> folder = quoted_spans(cells[0]);
      if (folder.size() == 1) table.folders.push_back({folder[0], quoted_spans(cells[1])});
    } else if (kind == Kind::kLibraries) {
      const std::string name = cells[0].substr(cells[0].find_first_not_of(' '));
      table.libraries.push_back({name.substr(0, name.find_last_not_of(' ') + 1), quoted_spans(cells[1]),
                                 quoted_spans(cells[2])});
    }
  }
  return table;
}

std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin < path.size()) {
    std::size_t slash = path.find('/', begin);
    if (slash == std::string::npos) slash = path.size();
    parts.push_back(path.substr(begin, slash - begin));
    begin = slash + 1;
  }
  return parts;
}

// Whether the folder pattern `folder` ("algo/", "algo/*/") is `path` or one of its ancestors.
bool folder_contains(const std::string& folder, const std::string& path) {
  const std::vector<std::string> pattern = segments(folder);
  const std::vector<std::string> parts = segments(path);
  if (parts.size() < pattern.size()) return false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (fnmatch(pattern[i].c_str(), parts[i].c_str(), 0) != 0) return false;
  }
  return true;
}

// Whether an entry of "may include" matches `included` (the path after "pipesgd/").
bool entry_matches(const std::string& entry, const std::string& included) {
  if (entry.ends_with("/")) return folder_contains(entry, included);
  return fnmatch(entry.c_str(), included.c_str(), FNM_PATHNAME) == 0;
}

// The row that applies to a file in `folder` (ending in '/'): the deepest, then the one with fewer
// wildcards; nullptr for none.
const FolderRule* rule_for(const LayerTable& table, const std::string& folder) {
  const FolderRule* best = nullptr;
  auto rank = [](const FolderRule& rule) {
    const auto wildcards = std::count(rule.folder.begin(), rule.folder.end(), '*');
    return std::make_pair(segments(rule.folder).size(), -wildcards);
  };
  for (const FolderRule& rule : table.folders) {
    if (!folder_contains(rule.folder, folder)) continue;
    if (best == nullptr || rank(rule) > rank(*best)) best = &rule;
  }
  return best;
}

// The folder a file in `folder` may include all of: the part of `folder` its row names ("comm/" for
// comm/shm/, "algo/sapipe/" for a file of the method folder algo/sapipe/ under the row algo/*/).
std::string own_folder(const FolderRule& rule, const std::string& folder) {
  const std::vector<std::string> parts = segments(folder);
  std::string own;
  for (std::size_t i = 0; i < segments(rule.folder).size(); ++i) own += parts[i] + "/";
  return own;
}

std::string joined(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

// One source file of the tree: its path from the root, and its folder as the table names it.
struct SourceFile {
  fs::path path;
  std::string shown;   // "src/pipesgd/core/layout.h"
  std::string folder;  // "core/", "algo/sapipe/", "include/pipesgd/"
};

// The .h/.cpp files of src/pipesgd and include/pipesgd under `root`, sorted.
std::vector<SourceFile> source_files(const fs::path& root) {
  std::vector<SourceFile> files;
  const fs::path sources = root / "src" / "pipesgd";
  const fs::path public_headers = root / "include" / "pipesgd";
  for (const fs::path& top : {sources, public_headers}) {
    if (!fs::is_directory(top)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(top)) {
      const std::string extension = entry.path().extension().string();
      if (!entry.is_regular_file() || (extension != ".h" && extension != ".cpp")) continue;
      SourceFile file{entry.path(), fs::relative(entry.path(), root).generic_string(), ""};
      file.folder = top == sources ? fs::relative(entry.path().parent_path(), sources).generic_string() + "/"
                                   : std::string("include/pipesgd/");
      files.push_back(file);
    }
  }
  std::sort(files.begin(), files.end(), [](const SourceFile& a, const SourceFile& b) { return a.shown < b.shown; });
  return files;
}

// What the include check found: the broken rules, one line each, and how much it read.
struct IncludeCheck {
  std::vector<std::string> violations;
  std::size_t files = 0;
  std::size_t pipesgd_includes = 0;
};

// Checks every include of the tree under `root` against `table`.
IncludeCheck check_includes(const fs::path& root, const LayerTable& table) {
  IncludeCheck check;
  const std::string where = std::string(" (docs/ARCHITECTURE.md, \"") + (kTableHeading + 4) + "\")";
  const std::vector<SourceFile> files = source_files(root);
  // The paths an include can name: every file of src/pipesgd, and the public headers by file name.
  std::vector<std::string> includable;
  std::set<std::string> folders;
  for (const SourceFile& file : files) {
    includable.push_back(file.folder == "include/pipesgd/" ? file.path.filename().string()
                                                           : file.shown.substr(std::string("src/pipesgd/").size()));
    if (file.folder != "include/pipesgd/") folders.insert(file.folder);
  }
  // The table against the tree: every folder has a row, every row and entry names something.
  std::set<std::string> reported_folders;
  for (const std::string& folder : folders) {
    const std::string top = folder.substr(0, folder.find('/') + 1);
    if (rule_for(table, folder) == nullptr && reported_folders.insert(top).second) {
      check.violations.push_back(concat("src/pipesgd/", top, ": no row in the include table", where));
    }
  }
  for (const FolderRule& rule : table.folders) {
    const bool names_folder = rule.folder == "include/pipesgd/" ||
                              std::any_of(folders.begin(), folders.end(), [&](const std::string& folder) {
                                return folder_contains(rule.folder, folder);
                              });
    if (!names_folder) check.violations.push_back(concat("row '", rule.folder, "' names no folder of src/pipesgd", where));
    for (const std::string& entry : rule.may_include) {
      const bool names_file = std::any_of(includable.begin(), includable.end(),
                                          [&](const std::string& path) { return entry_matches(entry, path); });
      if (!names_file) {
        check.violations.push_back(concat("row '", rule.folder, "': '", entry, "' names no file", where));
      }
    }
  }
  for (const SourceFile& file : files) {
    ++check.files;
    const FolderRule* rule = rule_for(table, file.folder);
    const std::vector<std::string> lines = split_lines(read_text(file.path));
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::string& line = lines[i];
      const std::size_t hash = line.find_first_not_of(" \t");
      if (hash == std::string::npos || line.compare(hash, 8, "#include") != 0) continue;
      const std::size_t open = line.find_first_of("\"<", hash + 8);
      if (open == std::string::npos) continue;
      const std::size_t close = line.find(line[open] == '"' ? '"' : '>', open + 1);
      const std::string target = line.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
      const std::string spelled = line.substr(open, close == std::string::npos ? std::string::npos : close - open + 1);
      const std::string at = concat(file.shown, ":", i + 1, ": #include ", spelled);
      if (target.starts_with("pipesgd/")) {
        ++check.pipesgd_includes;
        const std::string included = target.substr(std::string("pipesgd/").size());
        if (rule == nullptr) continue;  // reported above: the folder has no row
        const bool own = file.folder == "include/pipesgd/"
                             ? included.find('/') == std::string::npos
                             : folder_contains(own_folder(*rule, file.folder), included);
        const bool allowed = own || std::any_of(rule->may_include.begin(), rule->may_include.end(),
                                                   [&](const std::string& entry) { return entry_matches(entry, included); });
        if (!allowed) {
          check.violations.push_back(concat(at, " breaks the layer rule: ", rule->folder, " may include only its own folder",
                                            rule->may_include.empty() ? "" : " and ", joined(rule->may_include), where));
        }
        continue;
      }
      for (const LibraryRule& library : table.libraries) {
        const std::string angled = "<" + target + (line[open] == '<' ? ">" : "");
        const bool of_library = line[open] == '<' && std::any_of(library.prefixes.begin(), library.prefixes.end(),
                                                                 [&](const std::string& p) { return angled.starts_with(p); });
        if (!of_library) continue;
        const bool allowed = std::any_of(library.only_under.begin(), library.only_under.end(),
                                         [&](const std::string& folder) { return folder_contains(folder, file.folder); });
        if (!allowed) {
          check.violations.push_back(concat(at, " breaks the library rule: ", library.library, " only under ",
                                            joined(library.only_under), where));
        }
      }
    }
  }
  return check;
}

// The string literals of one line of C++, comments left out (a line's "//" outside a literal).
std::vector<std::string> string_literals(const std::string& line) {
  std::vector<std::string> literals;
  for (std::size_t i = 0; i < line.size(); ++i) {
    if (line.compare(i, 2, "//") == 0) break;
    if (line[i] == '\'') {  // a character literal: '"' is not a string
      const std::size_t close = line.find('\'', i + (line.compare(i, 2, "'\\") == 0 ? 3 : 2));
      if (close == std::string::npos) break;
      i = close;
      continue;
    }
    if (line[i] != '"') continue;
    std::string literal;
    std::size_t j = i + 1;
    for (; j < line.size() && line[j] != '"'; ++j) {
      if (line[j] == '\\' && j + 1 < line.size()) ++j;
      literal += line[j];
    }
    literals.push_back(literal);
    i = j;
  }
  return literals;
}

// Every string literal outside algo/ that is a method's name or a spec of it ("pipe", "pipe+int8",
// "auto:any"), other than a word that names something else too (`other_words`: a bucket plan's name,
// timing/bucket_plan.h: "wfbp" and "mgwfbp" name plans too; "auto", --allreduce's and
// --segment-bytes' automatic value).
// Prose that mentions a method ("use sapipe, ...") is not a special case and is left alone.
std::vector<std::string> method_names_outside_algo(const fs::path& root, const std::vector<std::string>& methods,
                                                   const std::vector<std::string>& other_words) {
  std::vector<std::string> found;
  for (const SourceFile& file : source_files(root)) {
    if (file.folder.starts_with("algo/")) continue;
    const std::vector<std::string> lines = split_lines(read_text(file.path));
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].find("#include") != std::string::npos) continue;
      for (const std::string& literal : string_literals(lines[i])) {
        if (std::find(other_words.begin(), other_words.end(), literal) != other_words.end()) continue;
        for (const std::string& method : methods) {
          // "auto:any" is a spec; "auto: message level, ..." is prose.
          const bool policy_spec = literal.starts_with(method + ":") && literal.size() > method.size() + 1 &&
                                   std::isalpha(static_cast<unsigned char>(literal[method.size() + 1]));
          if (literal == method || literal.starts_with(method + "+") || policy_spec) {
            found.push_back(concat(file.shown, ":", i + 1, ": \"", literal, "\" names method '", method,
                                   "' outside algo/: use its registry trait (MethodTraits) or a registry function"));
          }
        }
      }
    }
  }
  return found;
}

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string lines_of(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += item + "\n";
  return text;
}

const fs::path kSourceDir = PIPESGD_SOURCE_DIR;

TEST(LayerRulesTest, SourceTreeFollowsTheArchitectureTable) {
  const LayerTable table = read_layer_table(kSourceDir / "docs" / "ARCHITECTURE.md");
  ASSERT_GE(table.folders.size(), 15u) << "no folder table under '" << kTableHeading << "' in docs/ARCHITECTURE.md";
  ASSERT_EQ(table.libraries.size(), 3u) << "the library table (LibTorch, MPI, SimGrid)";
  const IncludeCheck check = check_includes(kSourceDir, table);
  EXPECT_GT(check.files, 200u);
  EXPECT_GT(check.pipesgd_includes, 500u);
  EXPECT_TRUE(check.violations.empty()) << lines_of(check.violations);
}

TEST(LayerRulesTest, NoMethodNamedOutsideAlgo) {
  std::vector<std::string> other_words = bucket_plan_names();
  other_words.push_back("auto");  // --allreduce auto, --segment-bytes auto
  const std::vector<std::string> found = method_names_outside_algo(kSourceDir, method_names(), other_words);
  EXPECT_TRUE(found.empty()) << lines_of(found);
}

// A tree with a table of three folders and planted violations of each kind.
class PlantedTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(root() / "docs" / "ARCHITECTURE.md",
               "# x\n\n### Who may include what\n\nprose\n\n"
               "| folder | may include | why |\n|---|---|---|\n"
               "| `core/` | nothing else | the bottom |\n"
               "| `comm/` | `core/` | |\n"
               "| `algo/` | `algo/`, `comm/`, `core/` | |\n"
               "| `algo/*/` | `algo/*.h`, `comm/`, `core/` | a method folder |\n"
               "| `include/pipesgd/` | `*.h`, `core/exceptions.h` | |\n\n"
               "| library | its includes | only under |\n|---|---|---|\n"
               "| LibTorch | `<torch/`, `<ATen/` | `algo/`, `include/pipesgd/` |\n"
               "| MPI | `<mpi.h>` | `comm/` |\n\n## Next\n| `cli/` | `core/` | not read |\n");
    write_file(root() / "src/pipesgd/core/exceptions.h", "#pragma once\n");
    write_file(root() / "src/pipesgd/core/layout.h", "#include \"pipesgd/core/exceptions.h\"\n");
    write_file(root() / "src/pipesgd/comm/transport.h", "#include <vector>\n#include \"pipesgd/core/layout.h\"\n");
    write_file(root() / "src/pipesgd/comm/shm/region.h",  // a subfolder belongs to its folder's row
               "#include \"pipesgd/comm/transport.h\"\n#include \"pipesgd/core/layout.h\"\n");
    write_file(root() / "src/pipesgd/algo/registry.h",
               "#include \"pipesgd/algo/pipe/pipe.h\"\n#include <torch/torch.h>\n// \"pipe\" in a comment\n");
    write_file(root() / "src/pipesgd/algo/pipe/pipe.h", "#include \"pipesgd/algo/registry.h\"\nauto n = \"pipe\";\n");
    write_file(root() / "include/pipesgd/world.h",
               "#include \"pipesgd/core/exceptions.h\"\n#include \"pipesgd/errors.h\"\n#include <torch/torch.h>\n");
    write_file(root() / "include/pipesgd/errors.h", "#pragma once\n");
  }
  fs::path root() const { return directory_.path(); }
  IncludeCheck check() const { return check_includes(root(), read_layer_table(root() / "docs" / "ARCHITECTURE.md")); }

 private:
  TempDir directory_;
};

TEST_F(PlantedTreeTest, CleanTreePasses) {
  const IncludeCheck clean = check();
  EXPECT_TRUE(clean.violations.empty()) << lines_of(clean.violations);
  EXPECT_EQ(clean.files, 8u);
  EXPECT_EQ(clean.pipesgd_includes, 8u);
}

TEST_F(PlantedTreeTest, EveryKindOfViolationIsNamed) {
  // Planted: an upward include, a method folder's include of another, a library outside its folders,
  // an internal header in a public one, a folder without a row.
  write_file(root() / "src/pipesgd/core/layout.h",
             "#include \"pipesgd/core/exceptions.h\"\n\n  #include \"pipesgd/comm/transport.h\"\n");
  write_file(root() / "src/pipesgd/algo/sapipe/sapipe.cpp",
             "#include \"pipesgd/algo/registry.h\"\n#include \"pipesgd/algo/pipe/pipe.h\"\n");
  write_file(root() / "src/pipesgd/comm/mpi_transport.cpp", "#include <mpi.h>\n#include <ATen/ATen.h>\n");
  write_file(root() / "include/pipesgd/session.h", "#include \"pipesgd/comm/transport.h\"\n");
  write_file(root() / "src/pipesgd/tools/bench.cpp", "#include \"pipesgd/core/layout.h\"\n");
  const std::string where = " (docs/ARCHITECTURE.md, \"Who may include what\")";
  const std::vector<std::string> expected = {
      "src/pipesgd/tools/: no row in the include table" + where,
      "include/pipesgd/session.h:1: #include \"pipesgd/comm/transport.h\" breaks the layer rule: include/pipesgd/ may "
      "include only its own folder and *.h, core/exceptions.h" + where,
      "src/pipesgd/algo/sapipe/sapipe.cpp:2: #include \"pipesgd/algo/pipe/pipe.h\" breaks the layer rule: algo/*/ may "
      "include only its own folder and algo/*.h, comm/, core/" + where,
      "src/pipesgd/comm/mpi_transport.cpp:2: #include <ATen/ATen.h> breaks the library rule: LibTorch only under "
      "algo/, include/pipesgd/" + where,
      "src/pipesgd/core/layout.h:3: #include \"pipesgd/comm/transport.h\" breaks the layer rule: core/ may include "
      "only its own folder" + where,
  };
  EXPECT_EQ(check().violations, expected);
}

TEST_F(PlantedTreeTest, TableEntriesThatNameNothingAreNamed) {
  write_file(root() / "docs" / "ARCHITECTURE.md",
             "### Who may include what\n\n| folder | may include | why |\n|---|---|---|\n"
             "| `core/` | | |\n| `comm/` | `core/`, `cmo/` | |\n| `algo/` | `algo/`, `core/` | |\n"
             "| `ps/` | `core/` | gone |\n| `include/pipesgd/` | `*.h`, `core/exceptions.h` | |\n");
  write_file(root() / "src/pipesgd/algo/registry.h", "#include \"pipesgd/core/layout.h\"\n");
  const std::string where = " (docs/ARCHITECTURE.md, \"Who may include what\")";
  const std::vector<std::string> expected = {
      "row 'comm/': 'cmo/' names no file" + where,
      "row 'ps/' names no folder of src/pipesgd" + where,
  };
  // algo/pipe/ falls under algo/ here (no algo/*/ row), whose rule allows it.
  EXPECT_EQ(check().violations, expected);
}

TEST_F(PlantedTreeTest, MethodNamesOutsideAlgoAreFound) {
  write_file(root() / "src/pipesgd/comm/warning.cpp",
             "if (method.name() != \"pipe\") return;  // not \"dsync\"\n"
             "auto plan = \"wfbp\";\nauto spec = \"dsync+optimal\";\nauto c = '\"'; auto prose = \"use sapipe or dsync\";\n"
             "#include \"pipesgd/algo/pipe/pipe.h\"\nauto escaped = \"say \\\"pipe\\\"\";\n"
             "auto segments = \"auto\";\nauto chosen = \"auto:any\";\n");
  const std::vector<std::string> methods = {"dsync", "pipe", "wfbp", "sapipe", "auto"};
  const std::vector<std::string> expected = {
      "src/pipesgd/comm/warning.cpp:1: \"pipe\" names method 'pipe' outside algo/: use its registry trait (MethodTraits) "
      "or a registry function",
      "src/pipesgd/comm/warning.cpp:3: \"dsync+optimal\" names method 'dsync' outside algo/: use its registry trait "
      "(MethodTraits) or a registry function",
      "src/pipesgd/comm/warning.cpp:8: \"auto:any\" names method 'auto' outside algo/: use its registry trait "
      "(MethodTraits) or a registry function",
  };
  EXPECT_EQ(method_names_outside_algo(root(), methods, {"wfbp", "single", "auto"}), expected);
}

}  // namespace
}  // namespace pipesgd
