# `cmake --install build --prefix DIR` writes a CMake package: the headers, the host model as
# tileweave::tileweave (no CUDA) and, where CUDA was built, the GPU ops as tileweave::cuda.
# A project then uses find_package(tileweave) (tests/consumer/ is one).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
set(TW_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/tileweave)

install(DIRECTORY include/tileweave DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set_target_properties(tileweave_core PROPERTIES EXPORT_NAME tileweave)
install(TARGETS tileweave_core EXPORT tileweaveTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT tileweaveTargets NAMESPACE tileweave:: DESTINATION ${TW_CMAKE_DIR})
# A separate file for the CUDA part, so the host model is usable where no CUDA toolkit is found.
if(TW_HAVE_CUDA)
  set_target_properties(tileweave_cuda PROPERTIES EXPORT_NAME cuda)
  install(TARGETS tileweave_cuda EXPORT tileweaveCudaTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT tileweaveCudaTargets NAMESPACE tileweave:: DESTINATION ${TW_CMAKE_DIR})
endif()
if(TARGET tileweave)
  install(TARGETS tileweave RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

configure_package_config_file(cmake/tileweaveConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/tileweaveConfig.cmake
                              INSTALL_DESTINATION ${TW_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/tileweaveConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)  # 0.x: minor versions may break the API
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/tileweaveConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/tileweaveConfigVersion.cmake
        DESTINATION ${TW_CMAKE_DIR})
