# Install rules: the library (SONAME libflatmem.so.${FLATMEM_ABI_VERSION}), the public header,
# a CMake package (find_package(flatmem) -> flatmem::flatmem) and a pkg-config file.
# Both package descriptions are relocatable: `cmake --install build --prefix /elsewhere` gives
# files that point at /elsewhere, not at the prefix chosen when configuring.
install(TARGETS flatmem EXPORT flatmemTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# (The exported include directory comes from the target's INSTALL_INTERFACE in src/.)
install(DIRECTORY include/flatmem DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# CMake package. The exported target paths are computed from the location of the installed
# flatmemTargets.cmake (CMake does this itself), so they follow --prefix.
set(FLATMEM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flatmem)
install(EXPORT flatmemTargets NAMESPACE flatmem:: DESTINATION ${FLATMEM_CMAKE_DIR})
configure_package_config_file(cmake/flatmemConfig.cmake.in
  ${PROJECT_BINARY_DIR}/flatmemConfig.cmake INSTALL_DESTINATION ${FLATMEM_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flatmemConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flatmemConfig.cmake ${PROJECT_BINARY_DIR}/flatmemConfigVersion.cmake
        DESTINATION ${FLATMEM_CMAKE_DIR})

# pkg-config file. A .pc file holds absolute paths, so it is written when installing, with the
# prefix of that install (CMAKE_INSTALL_PREFIX inside the install script is the --prefix value).
# Relative LIBDIR/INCLUDEDIR are taken under ${prefix}; absolute ones are used as given.
foreach(_kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_kind}}")
    set(FLATMEM_PC_${_kind} "${CMAKE_INSTALL_${_kind}}")
  else()
    set(FLATMEM_PC_${_kind} "\${prefix}/${CMAKE_INSTALL_${_kind}}")
  endif()
endforeach()
set(_pc_dest "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
if(NOT IS_ABSOLUTE "${_pc_dest}")
  set(_pc_dest "\${CMAKE_INSTALL_PREFIX}/${_pc_dest}")
endif()
# A relative --prefix is taken from the directory `cmake --install` runs in, as the files are.
install(CODE "
  set(FLATMEM_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  if(NOT IS_ABSOLUTE \"\${FLATMEM_PC_PREFIX}\")
    get_filename_component(FLATMEM_PC_PREFIX \"\${FLATMEM_PC_PREFIX}\" ABSOLUTE BASE_DIR \"\$ENV{PWD}\")
  endif()
  set(PROJECT_DESCRIPTION [[${PROJECT_DESCRIPTION}]])
  set(PROJECT_VERSION [[${PROJECT_VERSION}]])
  set(FLATMEM_PC_LIBDIR [[${FLATMEM_PC_LIBDIR}]])
  set(FLATMEM_PC_INCLUDEDIR [[${FLATMEM_PC_INCLUDEDIR}]])
  configure_file([[${PROJECT_SOURCE_DIR}/pkgconfig/flatmem.pc.in]]
                 [[${PROJECT_BINARY_DIR}/pkgconfig-install/flatmem.pc]] @ONLY)
  file(INSTALL DESTINATION \"${_pc_dest}\" TYPE FILE
       FILES [[${PROJECT_BINARY_DIR}/pkgconfig-install/flatmem.pc]])
")
