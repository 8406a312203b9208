# What `cmake --install` puts in a prefix, for C++ users of find_package(moekit):
#   lib/libmoekit.so           every layer's archive in one shared library, linked to
#                              OpenBLAS (and NCCL); cudart_static inside, not exported
#   include/moekit/            the public headers (include/moekit/ is the API)
#   lib/cmake/moekit/          moekitConfig.cmake: the imported target moekit::moekit
#   bin/moekit                 the command line
# The build tree keeps linking the static layers (tests, tools, the Python module).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(_moekit_layers moekit_core moekit_io moekit_routing moekit_dispatch moekit_eplb moekit_experts moekit_oracle
    moekit_layer moekit_capture)
add_library(moekit_shared SHARED)
target_sources(moekit_shared PRIVATE ${PROJECT_SOURCE_DIR}/cmake/empty.cpp)
set_target_properties(moekit_shared PROPERTIES OUTPUT_NAME moekit EXPORT_NAME moekit VERSION ${PROJECT_VERSION}
                      SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
# Every object of every layer (--whole-archive: a user may call any public
# function), then the layers again as usual for their own dependencies.
list(TRANSFORM _moekit_layers REPLACE "(.+)" "$<TARGET_FILE:\\1>" OUTPUT_VARIABLE _moekit_archives)
add_dependencies(moekit_shared ${_moekit_layers})
target_link_libraries(moekit_shared PRIVATE "-Wl,--whole-archive" ${_moekit_archives} "-Wl,--no-whole-archive"
                      moekit)
target_include_directories(moekit_shared INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                           $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(moekit_shared INTERFACE cxx_std_20)
if(MOEKIT_WITH_CUDA)
  # The static CUDA runtime stays inside: a program with a CUDA runtime of its own
  # does not bind to this one's symbols.
  target_link_options(moekit_shared PRIVATE "LINKER:--exclude-libs,libcudart_static.a")
endif()

# The installed binaries keep the link path (OpenBLAS's folder) as their run path.
set_target_properties(moekit_shared moekit_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS moekit_shared EXPORT moekitTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/moekit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS moekit_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT moekitTargets NAMESPACE moekit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moekit)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/moekitConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/moekitConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moekit)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/moekitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/moekitConfig.cmake ${PROJECT_BINARY_DIR}/moekitConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/moekit)
