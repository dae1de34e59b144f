# Writes OUT, a header defining PIPESGD_VERSION as `git describe --always --dirty` of SOURCE_DIR
# ("unknown" without git), only when it changed (so an unchanged version rebuilds nothing).
execute_process(COMMAND git describe --always --dirty --abbrev=12
                WORKING_DIRECTORY "${SOURCE_DIR}"
                OUTPUT_VARIABLE describe OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE failed)
if(failed OR NOT describe)
  set(describe "unknown")
endif()
set(content "#pragma once\n#define PIPESGD_VERSION \"git ${describe}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL content)
  file(WRITE "${OUT}" "${content}")
endif()
