# FLATMEM_SANITIZE: a list of GCC/Clang sanitizers for every C/C++ target of this build,
# e.g. -DFLATMEM_SANITIZE=address,undefined (scripts/test.sh builds build-asan/ this way).
# Empty (the default) builds without. Errors abort (-fno-sanitize-recover=all), so a test
# that trips UBSan fails instead of printing and passing.
#
# The library is sanitized too, so whatever loads it must carry the sanitizer runtime
# first: a sanitized executable does; an unsanitized process (python3, ...) needs
# LD_PRELOAD=${FLATMEM_SANITIZER_PRELOAD}. Tests that load the library from such a process
# can add ${FLATMEM_SANITIZER_TEST_ENV} to their ENVIRONMENT property (empty when not sanitizing).
set(FLATMEM_SANITIZE "" CACHE STRING "Sanitizers for all C/C++ targets, e.g. address,undefined (empty: none)")
set(FLATMEM_SANITIZER_PRELOAD "")
set(FLATMEM_SANITIZER_TEST_ENV "")
if(FLATMEM_SANITIZE)
  string(REPLACE ";" "," _flatmem_san "${FLATMEM_SANITIZE}")
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${_flatmem_san};-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=${_flatmem_san}>")
  if(_flatmem_san MATCHES "(^|,)address(,|$)")
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libasan.so
                    OUTPUT_VARIABLE FLATMEM_SANITIZER_PRELOAD OUTPUT_STRIP_TRAILING_WHITESPACE)
    # An unsanitized interpreter leaks by design at exit: leak checking there reports it, not us.
    set(FLATMEM_SANITIZER_TEST_ENV "LD_PRELOAD=${FLATMEM_SANITIZER_PRELOAD}" "ASAN_OPTIONS=detect_leaks=0")
  endif()
  message(STATUS "flatmem: sanitizers ${_flatmem_san}")
endif()
