# Warnings and sanitizers live on INTERFACE targets linked by every dptrain target.
add_library(dptrain_warnings INTERFACE)
target_compile_options(dptrain_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wundef -Wshadow=local -Wnon-virtual-dtor>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wundef>)
if(DPTRAIN_WERROR)
  target_compile_options(dptrain_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror> $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Werror>)
endif()
target_compile_definitions(dptrain_warnings INTERFACE DPTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

if(DPTRAIN_SANITIZE)
  target_compile_options(dptrain_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${DPTRAIN_SANITIZE} -fno-omit-frame-pointer>)
  target_link_options(dptrain_warnings INTERFACE -fsanitize=${DPTRAIN_SANITIZE})
endif()
add_library(dptrain::warnings ALIAS dptrain_warnings)
