#pragma once
// Reading a JSON file a user gave (calibration, profile): every failure is one DataError line
// "<source>: <problem>", e.g. "profile file 'x.json': not valid JSON (parse error at byte 17)".
#include <nlohmann/json.hpp>
#include <string>

namespace pipesgd {

// The parsed contents of `path`. `source` names the file in messages ("calibration file 'c.json'").
// Throws DataError if it cannot be opened or read, is empty, or is not valid JSON.
nlohmann::json read_json_file(const std::string& path, const std::string& source);

}  // namespace pipesgd
