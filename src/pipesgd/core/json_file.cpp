#include "pipesgd/core/json_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

[[noreturn]] void fail(const std::string& source, const std::string& problem) {
  throw DataError(concat(source, ": ", problem));
}

std::string system_message(int error_number) { return std::system_category().message(error_number); }

}  // namespace

nlohmann::json read_json_file(const std::string& path, const std::string& source) {
  const int descriptor = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) fail(source, concat("cannot open (", system_message(errno), ")"));
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t count = ::read(descriptor, buffer, sizeof buffer);
    if (count < 0) {
      if (errno == EINTR) continue;
      const int error_number = errno;
      ::close(descriptor);
      fail(source, concat("cannot read (", system_message(error_number), ")"));
    }
    if (count == 0) break;
    text.append(buffer, static_cast<std::size_t>(count));
  }
  ::close(descriptor);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) fail(source, "is empty");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    fail(source, concat("not valid JSON (parse error at byte ", error.byte, ")"));
  } catch (const nlohmann::json::exception& error) {  // e.g. a number too large for a double
    std::string what = error.what();  // "[json.exception.out_of_range.406] number overflow ..."
    const std::size_t text_start = what.find("] ");
    if (text_start != std::string::npos) what.erase(0, text_start + 2);
    for (char& c : what) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    fail(source, concat("not valid JSON (", what, ")"));
  }
}

void write_json_file(const std::filesystem::path& path, const nlohmann::json& value, std::string_view what,
                     AtomicWrite durability) {
  write_file_atomically(path, value.dump(2) + "\n", what, durability);
}

}  // namespace pipesgd
