#pragma once
// Reading a JSON file a user gave (calibration, profile): every failure is one DataError line
// "<source>: <problem>", e.g. "profile file 'x.json': not valid JSON (parse error at byte 17)".
#include <nlohmann/json.hpp>
#include <filesystem>
#include <string>

#include "pipesgd/core/atomic_file.h"

namespace pipesgd {

// The parsed contents of `path`. `source` names the file in messages ("calibration file 'c.json'").
// Throws DataError if it cannot be opened or read, is empty, or is not valid JSON.
nlohmann::json read_json_file(const std::string& path, const std::string& source);

// Writes `value` to `path` as indented JSON (2 spaces) and a newline, atomically
// (core/atomic_file.h); `what` names the file in errors.
void write_json_file(const std::filesystem::path& path, const nlohmann::json& value, std::string_view what,
                     AtomicWrite durability = AtomicWrite::kDurable);

}  // namespace pipesgd
