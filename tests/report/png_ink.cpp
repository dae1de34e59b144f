// png_ink FILE.png: how much of a screenshot is drawn, for the browser test of `pipesgd report`
// (check_report_in_browser.sh). Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what headless
// Chromium writes) with zlib and prints one line:
//   <width> <height> <ink pixels> <colored pixels>
// ink: a pixel that is not near-white (some channel below 235); colored: one whose channels differ by
// more than 60 (the plots' lines and bars, not black or grey text). Exit 1 with a message on stderr
// for a file that is not such a PNG.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::uint32_t big_endian(const unsigned char* bytes) {
  return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) | (std::uint32_t{bytes[2]} << 8) | bytes[3];
}

int paeth(int a, int b, int c) {
  const int p = a + b - c;
  const int pa = std::abs(p - a);
  const int pb = std::abs(p - b);
  const int pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return a;
  return pb <= pc ? b : c;
}

struct Image {
  std::uint32_t width = 0;
  std::uint32_t height = 0;
  std::size_t channels = 0;
  std::vector<unsigned char> pixels;  // rows of width * channels bytes
};

Image decode(const std::vector<unsigned char>& file) {
  static const std::array<unsigned char, 8> kSignature = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (file.size() < 8 || !std::equal(kSignature.begin(), kSignature.end(), file.begin())) {
    throw std::runtime_error("not a PNG file");
  }
  Image image;
  std::vector<unsigned char> compressed;
  for (std::size_t at = 8; at + 12 <= file.size();) {
    const std::uint32_t length = big_endian(&file[at]);
    const std::string type(reinterpret_cast<const char*>(&file[at + 4]), 4);
    if (at + 12 + length > file.size()) throw std::runtime_error("truncated chunk " + type);
    const unsigned char* data = &file[at + 8];
    if (type == "IHDR") {
      image.width = big_endian(data);
      image.height = big_endian(data + 4);
      const int depth = data[8], color = data[9], interlace = data[12];
      if (depth != 8 || (color != 2 && color != 6) || interlace != 0) {
        throw std::runtime_error("only 8-bit RGB or RGBA non-interlaced PNGs are read");
      }
      image.channels = color == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      compressed.insert(compressed.end(), data, data + length);
    } else if (type == "IEND") {
      break;
    }
    at += 12 + length;
  }
  if (image.channels == 0) throw std::runtime_error("no IHDR chunk");
  const std::size_t stride = image.width * image.channels;
  std::vector<unsigned char> filtered((stride + 1) * image.height);
  uLongf size = filtered.size();
  if (uncompress(filtered.data(), &size, compressed.data(), compressed.size()) != Z_OK || size != filtered.size()) {
    throw std::runtime_error("the image data does not inflate to its size");
  }
  image.pixels.resize(stride * image.height);
  const std::size_t bpp = image.channels;
  for (std::size_t y = 0; y < image.height; ++y) {
    const unsigned char filter = filtered[y * (stride + 1)];
    const unsigned char* in = &filtered[y * (stride + 1) + 1];
    unsigned char* out = &image.pixels[y * stride];
    const unsigned char* up = y > 0 ? out - stride : nullptr;
    for (std::size_t x = 0; x < stride; ++x) {
      const int a = x >= bpp ? out[x - bpp] : 0;
      const int b = up != nullptr ? up[x] : 0;
      const int c = x >= bpp && up != nullptr ? up[x - bpp] : 0;
      int predicted = 0;
      switch (filter) {
        case 0: predicted = 0; break;
        case 1: predicted = a; break;
        case 2: predicted = b; break;
        case 3: predicted = (a + b) / 2; break;
        case 4: predicted = paeth(a, b, c); break;
        default: throw std::runtime_error("unknown filter type " + std::to_string(filter));
      }
      out[x] = static_cast<unsigned char>(in[x] + predicted);
    }
  }
  return image;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: png_ink FILE.png\n");
    return 2;
  }
  std::ifstream file(argv[1], std::ios::binary);
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  try {
    const Image image = decode(bytes);
    std::size_t ink = 0, colored = 0;
    for (std::size_t at = 0; at < image.pixels.size(); at += image.channels) {
      const int r = image.pixels[at], g = image.pixels[at + 1], b = image.pixels[at + 2];
      if (r < 235 || g < 235 || b < 235) ++ink;
      const int high = std::max({r, g, b}), low = std::min({r, g, b});
      if (high - low > 60) ++colored;
    }
    std::printf("%u %u %zu %zu\n", image.width, image.height, ink, colored);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "png_ink: %s: %s\n", argv[1], error.what());
    return 1;
  }
  return 0;
}
