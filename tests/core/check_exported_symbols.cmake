# cmake -DNM=<nm> -DLIBRARY=<libflatmem.so> -P check_exported_symbols.cmake
#
# Fails unless every symbol the shared library defines in its dynamic symbol
# table as code or data (nm types T D B R W V i, upper or lower case: the
# weak/unique/indirect kinds included) is named flatmem_*. Version-node
# symbols (type A, e.g. FLATMEM_0) are not code or data and are skipped.
if(NOT NM OR NOT LIBRARY)
  message(FATAL_ERROR "usage: cmake -DNM=nm -DLIBRARY=libflatmem.so -P check_exported_symbols.cmake")
endif()
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY}
                OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${LIBRARY}: ${errors}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
set(exported 0)
set(offenders "")
foreach(line IN LISTS lines)
  # "<address> <type> <name>[@@VERSION]"
  if(line MATCHES "^[0-9a-fA-F]*[ \t]+([A-Za-z])[ \t]+([^@ \t]+)")
    set(type "${CMAKE_MATCH_1}")
    set(name "${CMAKE_MATCH_2}")
    if(type MATCHES "^[TDBRWVitdbrwv]$")
      math(EXPR exported "${exported} + 1")
      if(NOT name MATCHES "^flatmem_")
        list(APPEND offenders "${type} ${name}")
      endif()
    endif()
  endif()
endforeach()
if(exported EQUAL 0)
  message(FATAL_ERROR "no defined code/data symbols found in ${LIBRARY}: is it the right file?\n${listing}")
endif()
if(offenders)
  list(JOIN offenders "\n  " text)
  message(FATAL_ERROR "${LIBRARY} exports symbols outside the flatmem_ namespace:\n  ${text}")
endif()
message(STATUS "${exported} exported symbols, all flatmem_*")
