# Fails naming every doctest TEST_CASE (or TEST_CASE_TEMPLATE ...) under
# SOURCE_DIR whose name contains ';'. doctest_discover_tests hands the names
# to CTest as a CMake list, so a ';' splits one test case into two CTest
# entries that each match no test case and "pass" without running anything
# (ctest -N shows them with a leading space). Use ',' or ' -- ' instead.
#   cmake -DSOURCE_DIR=<tests> -P check_test_names.cmake
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_test_names.cmake: pass -DSOURCE_DIR=<the tests directory>")
endif()
file(GLOB_RECURSE sources LIST_DIRECTORIES false
     "${SOURCE_DIR}/*.cpp" "${SOURCE_DIR}/*.cu" "${SOURCE_DIR}/*.hpp" "${SOURCE_DIR}/*.h")
set(bad "")
set(checked 0)
foreach(source IN LISTS sources)
  # Read line by line; a ';' inside a line would itself split CMake's list of
  # lines, and an unbalanced '[' or ']' would join list elements: markers first.
  file(READ "${source}" text)
  string(REPLACE ";" "<SEMICOLON>" text "${text}")
  string(REPLACE "[" "<OPEN>" text "${text}")
  string(REPLACE "]" "<CLOSE>" text "${text}")
  string(REPLACE "\n" ";" lines "${text}")
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    # The name: the first string literal after TEST_CASE..( on the line (a
    # name that starts on the next line is caught by the count check below).
    if(line MATCHES "^[ \t]*(TEST_CASE|TEST_CASE_TEMPLATE|TEST_CASE_FIXTURE|SCENARIO)[ \t]*\\(")
      math(EXPR checked "${checked} + 1")
      if(line MATCHES "^[^\"]*\"(([^\"\\\\]|\\\\.)*)\"")
        set(name "${CMAKE_MATCH_1}")
        if(name MATCHES "<SEMICOLON>")
          string(REPLACE "<SEMICOLON>" ";" shown "${name}")
          string(REPLACE "<OPEN>" "[" shown "${shown}")
          string(REPLACE "<CLOSE>" "]" shown "${shown}")
          file(RELATIVE_PATH where "${SOURCE_DIR}" "${source}")
          string(APPEND bad "  ${where}:${number}: \"${shown}\"\n")
        endif()
      endif()
    endif()
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "check_test_names.cmake: no TEST_CASE found under ${SOURCE_DIR} (wrong directory?)")
endif()
if(NOT bad STREQUAL "")
  message(FATAL_ERROR "test case names with ';' (doctest_discover_tests splits them into CTest "
                      "entries that run nothing; use ',' or ' -- '):\n${bad}")
endif()
message(STATUS "${checked} test cases checked: no ';' in their names")
