#include "pipesgd/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace pipesgd {

void assertion_failed(const char* expression, const char* file, int line) {
  std::fprintf(stderr, "pipesgd internal error: assertion '%s' failed at %s:%d\n", expression, file,
               line);
  std::abort();
}

}  // namespace pipesgd
