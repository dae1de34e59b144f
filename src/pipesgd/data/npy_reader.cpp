#include "pipesgd/data/npy_reader.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <streambuf>

#include <xtensor/xnpy.hpp>

#include "pipesgd/core/error.h"

namespace pipesgd {
namespace {

// magic "\x93NUMPY", major and minor version, then the header length: 2 bytes (1.0) or 4 (2.0).
constexpr std::size_t kMagicAndVersionBytes = 8;
// NumPy itself refuses longer headers (numpy.lib.format, max_header_size); the limit also bounds
// the work of xtensor's regex on the header's values.
constexpr std::size_t kMaxHeaderBytes = 10000;
// The largest item size of a NumPy numeric dtype (complex128 / 16-byte floats).
constexpr std::size_t kMaxItemBytes = 16;

[[noreturn]] void fail(const std::string& source_name, const std::string& problem) {
  throw DataError(concat("data file ", source_name, ": ", problem));
}

// A read-only std::streambuf over bytes in memory, for xtensor's stream-based functions.
class SpanStreamBuffer final : public std::streambuf {
 public:
  explicit SpanStreamBuffer(std::span<const std::uint8_t> bytes) {
    char* begin = const_cast<char*>(reinterpret_cast<const char*>(bytes.data()));
    setg(begin, begin, begin + bytes.size());
  }
};

// The header of a .npy file and where its data begins.
struct NpyHeader {
  std::string dtype;
  bool fortran_order = false;
  std::vector<std::size_t> shape;
  std::size_t data_offset = 0;
};

std::size_t read_little_endian(std::span<const std::uint8_t> bytes) {
  std::size_t value = 0;
  for (std::size_t k = bytes.size(); k-- > 0;) value = (value << 8) | bytes[k];
  return value;
}

// xtensor's parse_header calls back() on the value of 'shape' without checking that it is not
// empty (undefined behaviour); this finds that case first, looking where xtensor looks.
bool shape_value_is_empty(const std::string& header) {
  std::string compact = header;
  if (!compact.empty() && compact.back() == '\n') compact.pop_back();
  compact.erase(std::remove(compact.begin(), compact.end(), ' '), compact.end());
  if (compact.size() < 2 || compact.front() != '{' || compact.back() != '}') return false;  // xtensor refuses it
  const std::string inner = compact.substr(1, compact.size() - 2);
  const std::size_t key = inner.find("'shape'");
  if (key == std::string::npos) return false;  // xtensor refuses it
  std::string key_value = inner.substr(key);
  if (key_value.back() == ',') key_value.pop_back();
  const std::size_t separator = key_value.find(':');
  return separator == std::string::npos || separator + 1 == key_value.size();
}

NpyHeader parse_header(std::span<const std::uint8_t> bytes, const std::string& source_name) {
  if (bytes.size() < kMagicAndVersionBytes) {
    fail(source_name, concat("truncated: ", bytes.size(), " bytes, shorter than a .npy header"));
  }
  SpanStreamBuffer buffer(bytes);
  std::istream stream(&buffer);
  unsigned char major = 0, minor = 0;
  try {
    xt::detail::read_magic(stream, &major, &minor);
  } catch (const std::runtime_error&) {
    fail(source_name, "not a .npy file (it does not start with \\x93NUMPY)");
  }
  if ((major != 1 && major != 2) || minor != 0) {
    fail(source_name, concat(".npy format version ", static_cast<unsigned>(major), ".", static_cast<unsigned>(minor),
                             " is not supported (expected 1.0 or 2.0)"));
  }
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < kMagicAndVersionBytes + length_bytes) {
    fail(source_name, concat("truncated: ", bytes.size(), " bytes, shorter than a .npy header"));
  }
  const std::size_t header_length = read_little_endian(bytes.subspan(kMagicAndVersionBytes, length_bytes));
  const std::size_t header_begin = kMagicAndVersionBytes + length_bytes;
  if (header_length > kMaxHeaderBytes) {
    fail(source_name, concat("broken .npy header: it claims ", header_length, " bytes, more than NumPy's limit of ",
                             kMaxHeaderBytes));
  }
  if (bytes.size() - header_begin < header_length) {
    fail(source_name, concat("truncated: the header needs ", header_length, " bytes, the file has ",
                             bytes.size() - header_begin, " after the preamble"));
  }
  const std::string text(reinterpret_cast<const char*>(bytes.data()) + header_begin, header_length);
  if (text.empty() || text.back() != '\n' || text.find_first_not_of(" \n") == std::string::npos ||
      shape_value_is_empty(text)) {
    fail(source_name, "broken .npy header (not a dictionary ending in a newline with descr, fortran_order, shape)");
  }
  NpyHeader header;
  try {
    xt::detail::parse_header(text, header.dtype, &header.fortran_order, header.shape);
  } catch (const std::exception& error) {
    fail(source_name, concat("broken .npy header (", error.what(), ")"));
  }
  header.data_offset = header_begin + header_length;
  return header;
}

// The item size of a type string xtensor accepted ("<f4": 4); 0 if it is not a numeric size.
std::size_t item_bytes(const std::string& dtype) {
  std::size_t size = 0;
  for (std::size_t k = 2; k < dtype.size(); ++k) {
    size = size * 10 + static_cast<std::size_t>(dtype[k] - '0');
    if (size > kMaxItemBytes) return 0;
  }
  return size;
}

// "float16", "int64 (big-endian)", ... for messages; xtensor's type strings are [<>|][ifucb]\d+.
std::string dtype_name(const std::string& dtype) {
  const std::size_t bytes = item_bytes(dtype);
  std::string kind;
  switch (dtype.size() > 1 ? dtype[1] : '?') {
    case 'f': kind = "float"; break;
    case 'i': kind = "int"; break;
    case 'u': kind = "uint"; break;
    case 'c': kind = "complex"; break;
    case 'b': return concat("bool (", dtype, ")");
    default: kind = "unknown"; break;
  }
  const std::string name = bytes == 0 ? concat(kind, " of unknown size") : concat(kind, bytes * 8);
  const bool big_endian = dtype[0] == '>' && bytes > 1;
  return concat(name, big_endian ? " big-endian" : "", " (", dtype, ")");
}

void check_header(const NpyHeader& header, std::size_t data_bytes, const std::string& source_name) {
  const std::size_t item = item_bytes(header.dtype);
  if (item == 0) fail(source_name, concat("broken .npy header: dtype ", header.dtype, " has no valid item size"));
  std::size_t expected = item;
  for (std::size_t dimension : header.shape) {
    if (dimension != 0 && expected > std::numeric_limits<std::size_t>::max() / dimension) {
      fail(source_name, concat("broken .npy header: shape ", npy_shape_text(header.shape), " has more elements than fit in memory"));
    }
    expected *= dimension;
  }
  if (data_bytes < expected) {
    fail(source_name, concat("truncated: shape ", npy_shape_text(header.shape), " of ", dtype_name(header.dtype), " needs ",
                             expected, " data bytes, the file has ", data_bytes));
  }
  if (data_bytes > expected) {
    fail(source_name, concat(data_bytes - expected, " bytes after the data of shape ", npy_shape_text(header.shape), " of ",
                             dtype_name(header.dtype), " (", expected, " bytes)"));
  }
  if (header.fortran_order && header.shape.size() > 1) {
    fail(source_name, "the array is stored in Fortran order; save a C-ordered array (numpy.ascontiguousarray)");
  }
}

NpyArray to_array(NpyHeader header) {
  NpyArray array;
  array.dtype = std::move(header.dtype);
  array.shape = std::move(header.shape);
  return array;
}

std::size_t element_count(const std::vector<std::size_t>& shape) {
  std::size_t count = 1;
  for (std::size_t dimension : shape) count *= dimension;  // checked against the data bytes
  return count;
}

bool is_dtype(const std::string& dtype, char kind, std::size_t bytes) {
  if (dtype.size() < 3 || dtype[1] != kind || item_bytes(dtype) != bytes) return false;
  // Multi-byte values must be little-endian (every platform pipesgd runs on); '|' is for single bytes.
  return bytes == 1 ? true : dtype[0] == '<';
}

template <typename T>
T load_element(const std::uint8_t* data, std::size_t index) {
  T value;
  std::memcpy(&value, data + index * sizeof(T), sizeof(T));
  return value;
}

// A float64 value rounded to float32; beyond float's range the conversion is undefined: such
// values become +-infinity.
float to_float(double value) {
  constexpr double kLargest = std::numeric_limits<float>::max();
  return value > kLargest    ? std::numeric_limits<float>::infinity()
         : value < -kLargest ? -std::numeric_limits<float>::infinity()
                             : static_cast<float>(value);
}

}  // namespace

std::string npy_shape_text(const std::vector<std::size_t>& shape) {
  std::string text = "[";
  for (std::size_t k = 0; k < shape.size(); ++k) text += concat(k == 0 ? "" : ", ", shape[k]);
  return text + "]";
}

NpyArray parse_npy(std::span<const std::uint8_t> bytes, const std::string& source_name) {
  NpyHeader header = parse_header(bytes, source_name);
  check_header(header, bytes.size() - header.data_offset, source_name);
  const std::size_t offset = header.data_offset;
  NpyArray array = to_array(std::move(header));
  array.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(offset), bytes.end());
  return array;
}

NpyArray read_npy(const std::string& path) {
  std::error_code status_error;
  if (!std::filesystem::exists(path, status_error)) fail(path, "does not exist");
  if (std::filesystem::is_directory(path, status_error)) fail(path, "is a directory, not a .npy file");
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) fail(path, concat("cannot open: ", std::strerror(errno)));
  const std::streamoff size = file.tellg();
  if (size < 0) fail(path, "cannot tell its size");
  file.seekg(0);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  if (!file.read(reinterpret_cast<char*>(bytes.data()), size)) fail(path, "read error");
  NpyHeader header = parse_header(bytes, path);
  check_header(header, bytes.size() - header.data_offset, path);
  const std::size_t offset = header.data_offset;
  NpyArray array = to_array(std::move(header));
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(offset));  // no reallocation
  array.data = std::move(bytes);
  return array;
}

NpyInputs decode_npy_inputs(const NpyArray& array, const std::string& source_name) {
  const bool float32 = is_dtype(array.dtype, 'f', 4);
  const bool float64 = is_dtype(array.dtype, 'f', 8);
  const bool uint8 = is_dtype(array.dtype, 'u', 1);
  if (!float32 && !float64 && !uint8) {
    fail(source_name, concat("inputs of dtype ", dtype_name(array.dtype),
                             " are not accepted; expected float32 (<f4) or uint8 (|u1, scaled by 1/255), or float64 "
                             "(<f8, converted to float32)"));
  }
  if (array.shape.size() < 2) {
    fail(source_name, concat("inputs of shape ", npy_shape_text(array.shape),
                             ": expected [count, d1, ...] with at least 2 dimensions"));
  }
  NpyInputs inputs;
  inputs.count = array.shape[0];
  if (inputs.count == 0) fail(source_name, concat("zero examples (inputs of shape ", npy_shape_text(array.shape), ")"));
  inputs.features = 1;
  for (std::size_t k = 1; k < array.shape.size(); ++k) {
    if (array.shape[k] == 0 || array.shape[k] > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(source_name, concat("inputs of shape ", npy_shape_text(array.shape), ": every example dimension must be >= 1"));
    }
    inputs.example_shape.push_back(static_cast<std::int64_t>(array.shape[k]));
    inputs.features *= array.shape[k];  // the product of all dims matched the data bytes
  }
  const std::size_t count = element_count(array.shape);
  inputs.values.resize(count);
  if (float32) {
    std::memcpy(inputs.values.data(), array.data.data(), count * sizeof(float));
  } else if (float64) {
    inputs.converted_from_float64 = true;
    for (std::size_t index = 0; index < count; ++index) {
      inputs.values[index] = to_float(load_element<double>(array.data.data(), index));
    }
  } else {
    std::array<float, 256> byte_to_float{};
    for (std::size_t value = 0; value < byte_to_float.size(); ++value) {
      byte_to_float[value] = static_cast<float>(value) / 255.0f;
    }
    std::transform(array.data.begin(), array.data.end(), inputs.values.begin(),
                   [&](std::uint8_t value) { return byte_to_float[value]; });
  }
  return inputs;
}

NpyTargets decode_npy_targets(const NpyArray& array, const std::string& source_name) {
  const bool int64 = is_dtype(array.dtype, 'i', 8);
  const bool int32 = is_dtype(array.dtype, 'i', 4);
  const bool float32 = is_dtype(array.dtype, 'f', 4);
  const bool float64 = is_dtype(array.dtype, 'f', 8);
  if (!int64 && !int32 && !float32 && !float64) {
    fail(source_name, concat("labels/targets of dtype ", dtype_name(array.dtype),
                             " are not accepted; expected int64 (<i8) or int32 (<i4) labels, or float32 (<f4) or "
                             "float64 (<f8) regression targets"));
  }
  const bool labels = int64 || int32;
  if (array.shape.empty() || array.shape.size() > (labels ? 1u : 2u)) {
    fail(source_name, concat(labels ? "labels" : "regression targets", " of shape ", npy_shape_text(array.shape),
                             labels ? ": expected [count]" : ": expected [count] or [count, k]"));
  }
  NpyTargets result;
  result.count = array.shape[0];
  if (result.count == 0) fail(source_name, concat("zero examples (", labels ? "labels" : "targets", " of shape ",
                                                  npy_shape_text(array.shape), ")"));
  if (labels) {
    result.labels.resize(result.count);
    for (std::size_t index = 0; index < result.count; ++index) {
      const std::int64_t label = int64 ? load_element<std::int64_t>(array.data.data(), index)
                                       : load_element<std::int32_t>(array.data.data(), index);
      if (label < 0 || label > std::numeric_limits<std::int32_t>::max()) {
        fail(source_name, concat("label at index ", index, " is ", label, ", expected 0 to ",
                                 std::numeric_limits<std::int32_t>::max()));
      }
      result.labels[index] = static_cast<std::int32_t>(label);
    }
    return result;
  }
  result.target_features = array.shape.size() == 2 ? array.shape[1] : 1;
  if (result.target_features == 0) {
    fail(source_name, concat("regression targets of shape ", npy_shape_text(array.shape), ": k must be >= 1"));
  }
  const std::size_t count = element_count(array.shape);
  result.targets.resize(count);
  if (float32) {
    std::memcpy(result.targets.data(), array.data.data(), count * sizeof(float));
  } else {
    for (std::size_t index = 0; index < count; ++index) {
      result.targets[index] = to_float(load_element<double>(array.data.data(), index));
    }
  }
  return result;
}

}  // namespace pipesgd
