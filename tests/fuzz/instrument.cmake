# FLATMEM_FUZZ=ON (clang only): instruments every C/C++ target of the build for libFuzzer
# (coverage, -fsanitize=fuzzer-no-link) under ASan + UBSan, so that the fuzz targets in
# tests/fuzz/ see into the library. Included by the top-level CMakeLists.txt before src/.
#
# The library stays a shared library linked with --no-undefined: the sanitizer runtime is
# therefore the shared one (-shared-libsan) for the library and the fuzz targets alike,
# found at run time through an rpath to clang's runtime folder.
if(NOT CMAKE_C_COMPILER_ID STREQUAL "Clang" OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "FLATMEM_FUZZ=ON needs clang for C and C++ "
                      "(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++), not "
                      "${CMAKE_C_COMPILER_ID}/${CMAKE_CXX_COMPILER_ID}")
endif()
if(FLATMEM_SANITIZE)
  message(FATAL_ERROR "FLATMEM_FUZZ=ON brings its own sanitizers: leave FLATMEM_SANITIZE empty")
endif()
add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link,address,undefined;-fno-sanitize-recover=all;-fno-omit-frame-pointer;-g>")
add_link_options("$<$<LINK_LANGUAGE:C,CXX>:-fsanitize=address,undefined;-shared-libsan>")
execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libclang_rt.asan-x86_64.so
                OUTPUT_VARIABLE _flatmem_asan_so OUTPUT_STRIP_TRAILING_WHITESPACE)
get_filename_component(FLATMEM_FUZZ_RUNTIME_DIR "${_flatmem_asan_so}" DIRECTORY)
add_link_options("$<$<LINK_LANGUAGE:C,CXX>:LINKER:-rpath,${FLATMEM_FUZZ_RUNTIME_DIR}>")
message(STATUS "flatmem: libFuzzer build (ASan + UBSan, runtime in ${FLATMEM_FUZZ_RUNTIME_DIR})")
