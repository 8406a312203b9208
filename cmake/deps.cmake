# Third-party dependencies: the system's packages first (Debian: libopenblas-dev,
# libcli11-dev, nlohmann-json3-dev, libgtest-dev, libbenchmark-dev), then the
# vendored copies in MOEKIT_DEPS_DIR (made by scripts/vendor_deps.sh) for machines
# that cannot install packages.
find_package(Threads REQUIRED)
list(APPEND CMAKE_PREFIX_PATH "${MOEKIT_DEPS_DIR}/openblas/usr")

# OpenBLAS (CBLAS interface) for the CPU expert GEMMs.
find_path(MOEKIT_CBLAS_INCLUDE cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-pthread
        "${MOEKIT_DEPS_DIR}/openblas/usr/include/x86_64-linux-gnu/openblas-pthread"
        /usr/include/openblas /usr/include
  NO_DEFAULT_PATH)
find_library(MOEKIT_OPENBLAS_LIB NAMES openblas
  PATHS /usr/lib/x86_64-linux-gnu/openblas-pthread
        "${MOEKIT_DEPS_DIR}/openblas/usr/lib/x86_64-linux-gnu/openblas-pthread"
        /usr/lib/x86_64-linux-gnu
  NO_DEFAULT_PATH)
if(NOT MOEKIT_CBLAS_INCLUDE OR NOT MOEKIT_OPENBLAS_LIB)
  message(FATAL_ERROR "OpenBLAS not found: apt-get install libopenblas-dev (or run scripts/vendor_deps.sh)")
endif()
add_library(moekit_blas INTERFACE)
target_include_directories(moekit_blas INTERFACE "${MOEKIT_CBLAS_INCLUDE}")
target_link_libraries(moekit_blas INTERFACE "${MOEKIT_OPENBLAS_LIB}")
add_library(moekit::blas ALIAS moekit_blas)
message(STATUS "moekit: OpenBLAS ${MOEKIT_OPENBLAS_LIB}")

# Header-only: CLI11 and nlohmann-json.
find_package(CLI11 CONFIG QUIET)
if(NOT TARGET CLI11::CLI11)
  add_library(moekit_cli11 INTERFACE)
  target_include_directories(moekit_cli11 INTERFACE "${MOEKIT_DEPS_DIR}/include")
  add_library(CLI11::CLI11 ALIAS moekit_cli11)
endif()
find_package(nlohmann_json CONFIG QUIET)
if(NOT TARGET nlohmann_json::nlohmann_json)
  add_library(moekit_json INTERFACE)
  target_include_directories(moekit_json INTERFACE "${MOEKIT_DEPS_DIR}/include")
  add_library(nlohmann_json::nlohmann_json ALIAS moekit_json)
endif()

# CUTLASS/CuTe headers (PyPI nvidia-cutlass, pinned in scripts/vendor_deps.sh).
if(MOEKIT_WITH_CUDA)
  find_path(MOEKIT_CUTLASS_INCLUDE cutlass/cutlass.h PATHS "${MOEKIT_DEPS_DIR}/cutlass/include" NO_DEFAULT_PATH)
  if(MOEKIT_CUTLASS_INCLUDE)
    message(STATUS "moekit: CUTLASS ${MOEKIT_CUTLASS_INCLUDE}")
  else()
    message(STATUS "moekit: CUTLASS headers not found (run scripts/vendor_deps.sh); CUTLASS kernels off")
  endif()
endif()

# GoogleTest: system package or vendored sources.
if(BUILD_TESTING OR NOT DEFINED BUILD_TESTING)
  find_package(GTest CONFIG QUIET)
  if(NOT TARGET GTest::gtest_main)
    if(EXISTS "${MOEKIT_DEPS_DIR}/googletest/CMakeLists.txt")
      set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
      add_subdirectory("${MOEKIT_DEPS_DIR}/googletest" "${CMAKE_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
    elseif(EXISTS /usr/src/googletest/CMakeLists.txt)
      set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
      add_subdirectory(/usr/src/googletest "${CMAKE_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
    else()
      message(FATAL_ERROR "GoogleTest not found: apt-get install libgtest-dev (or run scripts/vendor_deps.sh)")
    endif()
  endif()
endif()

# Google Benchmark is optional: the CPU benchmark is skipped without it.
find_package(benchmark CONFIG QUIET)
