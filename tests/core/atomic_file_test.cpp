// Tests of the atomic file writer (core/atomic_file.h): content, replacement only on success,
// error classes and messages, and that no temporary file is left behind.
#include "pipesgd/core/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good());
}

// The message of the exception of type E that `action` throws ("" and a test failure if none).
template <typename E, typename Action>
std::string message_of(Action&& action) {
  try {
    action();
  } catch (const E& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "text: " << (text) << "\npart: " << (part)

TEST(AtomicFile, WritesBytesTextAndStreamedChunks) {
  TempDir dir;
  const std::vector<std::byte> bytes = {std::byte{0}, std::byte{0xff}, std::byte{'a'}, std::byte{0}};
  write_file_atomically(dir.file("bytes"), std::span<const std::byte>(bytes));
  EXPECT_EQ(read_text(dir.file("bytes")), std::string("\0\xff" "a\0", 4));

  write_file_atomically(dir.file("doc.json"), std::string("{\"a\": 1}\n"));
  EXPECT_EQ(read_text(dir.file("doc.json")), "{\"a\": 1}\n");

  write_file_atomically_streaming(dir.file("streamed"), [](const AtomicFileSink& sink) {
    for (const std::string part : {"one ", "", "two ", "three"}) {
      sink(std::as_bytes(std::span(part.data(), part.size())));
    }
  });
  EXPECT_EQ(read_text(dir.file("streamed")), "one two three");

  write_file_atomically(dir.file("empty"), std::string_view());
  EXPECT_TRUE(fs::exists(dir.file("empty")));
  EXPECT_EQ(fs::file_size(dir.file("empty")), 0u);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"bytes", "doc.json", "empty", "streamed"}));
}

TEST(AtomicFile, ReplacesAnExistingFile) {
  TempDir dir;
  const fs::path path = dir.file("f.txt");
  write_text(path, "old content, longer than the new one");
  write_file_atomically(path, std::string("new"));
  EXPECT_EQ(read_text(path), "new");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"f.txt"});
}

// Without the syncs (AtomicWrite::kProcessCrash) the file is replaced all the same, by a rename.
TEST(AtomicFile, ReplacesAnExistingFileWithoutSyncing) {
  TempDir dir;
  const fs::path path = dir.file("summary.json");
  write_text(path, "old content, longer than the new one");
  write_file_atomically(path, std::string("new"), "summary", AtomicWrite::kProcessCrash);
  EXPECT_EQ(read_text(path), "new");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"summary.json"});
  EXPECT_CONTAINS(message_of<UsageError>([&] {
                    write_file_atomically(dir.file("missing/x"), std::string("x"), "summary", AtomicWrite::kProcessCrash);
                  }),
                  "cannot write summary '");
}

TEST(AtomicFile, AFailingProducerKeepsTheOldFileAndRemovesTheTemporary) {
  TempDir dir;
  const fs::path path = dir.file("f.txt");
  write_text(path, "old");
  EXPECT_THROW(write_file_atomically_streaming(path,
                                               [](const AtomicFileSink& sink) {
                                                 sink(std::as_bytes(std::span("partial", 7)));
                                                 throw std::runtime_error("producer failed");
                                               }),
               std::runtime_error);
  EXPECT_EQ(read_text(path), "old");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"f.txt"});
}

TEST(AtomicFile, AFailedRenameKeepsTheOldStateAndRemovesTheTemporary) {
  TempDir dir;
  const fs::path target = dir.file("occupied");
  fs::create_directory(target);
  write_text(target / "keep", "x");
  const std::string message =
      message_of<DataError>([&] { write_file_atomically(target, std::string("new"), "report"); });
  EXPECT_CONTAINS(message, "cannot write report '" + target.string() + "': renaming '" +
                               (fs::path(dir.path()) / ".occupied.tmp.").string());
  EXPECT_CONTAINS(message, "' over it: ");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"occupied"});
  EXPECT_EQ(read_text(target / "keep"), "x");
}

TEST(AtomicFile, AMissingDirectoryIsAUsageError) {
  TempDir dir;
  const fs::path missing = fs::path(dir.path()) / "no_such_dir";
  const std::string message = message_of<UsageError>(
      [&] { write_file_atomically(missing / "f.json", std::string("{}"), "output file"); });
  EXPECT_EQ(message, "cannot write output file '" + (missing / "f.json").string() + "': directory '" +
                         missing.string() + "' does not exist");
  EXPECT_TRUE(dir.entries().empty());
}

TEST(AtomicFile, AParentThatIsARegularFileIsAUsageError) {
  TempDir dir;
  const fs::path file = dir.file("plain");
  write_text(file, "x");
  const std::string message =
      message_of<UsageError>([&] { write_file_atomically(file / "f.json", std::string("{}")); });
  EXPECT_EQ(message, "cannot write file '" + (file / "f.json").string() + "': '" + file.string() +
                         "' is not a directory");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"plain"});
  EXPECT_EQ(read_text(file), "x");
}

TEST(AtomicFile, APathWithoutAFileNameIsAUsageError) {
  TempDir dir;
  const fs::path path = fs::path(dir.path()) / "";
  EXPECT_EQ(message_of<UsageError>([&] { write_file_atomically(path, std::string("x")); }),
            "cannot write file '" + path.string() + "': the path has no file name");
  EXPECT_TRUE(dir.entries().empty());
}

// Root writes into any directory, so the write runs in a child process that drops to an
// unprivileged user first (nobody, 65534) when the test runs as root.
TEST(AtomicFile, AnUnwritableDirectoryIsADataErrorNamingTheTemporaryAndTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const fs::path locked = fs::path(dir.path()) / "locked";
  fs::create_directory(locked);
  write_text(locked / "f.txt", "old");
  const auto read_and_enter = fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                              fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec;
  fs::permissions(dir.path(), read_and_enter | fs::perms::owner_write);
  fs::permissions(locked, read_and_enter);
  const std::string expected = "cannot write file '" + (locked / "f.txt").string() + "': cannot create '" +
                               (locked / ".f.txt.tmp.").string();
  EXPECT_EXIT(
      {
        if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
          std::fprintf(stderr, "cannot drop root privileges\n");
          std::exit(2);
        }
        try {
          write_file_atomically(locked / "f.txt", std::string("new"));
        } catch (const DataError& error) {
          const std::string message = error.what();
          std::fprintf(stderr, "%s\n", message.c_str());
          std::exit(message.find(expected) != std::string::npos && message.find("Permission denied") != std::string::npos ? 0 : 1);
        }
        std::exit(3);  // written
      },
      ::testing::ExitedWithCode(0), "Permission denied");
  fs::permissions(locked, fs::perms::owner_all);
  EXPECT_EQ(read_text(locked / "f.txt"), "old");
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(locked)) ++entries;
  EXPECT_EQ(entries, 1u) << "a temporary was left behind";
}

TEST(AtomicFile, ARelativePathIsWrittenInTheWorkingDirectory) {
  TempDir dir;
  const fs::path previous = fs::current_path();
  fs::current_path(dir.path());
  write_file_atomically("relative.txt", std::string("here"));
  fs::current_path(previous);
  EXPECT_EQ(read_text(dir.file("relative.txt")), "here");
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"relative.txt"});
}

}  // namespace
}  // namespace pipesgd
