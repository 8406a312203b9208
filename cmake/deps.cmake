# Third-party dependencies: the system's packages first (Debian: libopenblas-dev,
# libcli11-dev, nlohmann-json3-dev, libgtest-dev, libbenchmark-dev), then the
# vendored copies in MOEKIT_DEPS_DIR (made by scripts/vendor_deps.sh) for machines
# that cannot install packages. MOEKIT_USE_VENDORED_DEPS=ON skips the system
# packages (to build exactly as such a machine does).
option(MOEKIT_USE_VENDORED_DEPS "Use the vendored dependencies in MOEKIT_DEPS_DIR even when system packages exist" OFF)
find_package(Threads REQUIRED)

# OpenBLAS (CBLAS interface) for the CPU expert GEMMs.
set(_moekit_blas_root "${CMAKE_BINARY_DIR}/_deps/openblas")
set(_moekit_blas_libdir "${_moekit_blas_root}/usr/lib/x86_64-linux-gnu")
if(MOEKIT_USE_VENDORED_DEPS)
  unset(MOEKIT_CBLAS_INCLUDE CACHE)
  unset(MOEKIT_OPENBLAS_LIB CACHE)
else()
  find_path(MOEKIT_CBLAS_INCLUDE cblas.h
    PATHS /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/openblas /usr/include
    NO_DEFAULT_PATH)
  find_library(MOEKIT_OPENBLAS_LIB NAMES openblas
    PATHS /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/lib/x86_64-linux-gnu
    NO_DEFAULT_PATH)
endif()
# Vendored: Debian's OpenBLAS and its Fortran runtime, packed as
# MOEKIT_DEPS_DIR/openblas.tar.xz (the shared library is large; xz keeps the
# folder small enough to travel) and unpacked into the build tree.
set(MOEKIT_OPENBLAS_ARCHIVE "${MOEKIT_DEPS_DIR}/openblas.tar.xz")
if((NOT MOEKIT_CBLAS_INCLUDE OR NOT MOEKIT_OPENBLAS_LIB) AND EXISTS "${MOEKIT_OPENBLAS_ARCHIVE}")
  set(_moekit_blas_stamp "${_moekit_blas_root}/.unpacked")
  if(NOT EXISTS "${_moekit_blas_stamp}" OR "${MOEKIT_OPENBLAS_ARCHIVE}" IS_NEWER_THAN "${_moekit_blas_stamp}")
    file(REMOVE_RECURSE "${_moekit_blas_root}")
    file(ARCHIVE_EXTRACT INPUT "${MOEKIT_OPENBLAS_ARCHIVE}" DESTINATION "${_moekit_blas_root}")
    file(TOUCH "${_moekit_blas_stamp}")
  endif()
  unset(MOEKIT_CBLAS_INCLUDE CACHE)
  unset(MOEKIT_OPENBLAS_LIB CACHE)
  find_path(MOEKIT_CBLAS_INCLUDE cblas.h
    PATHS "${_moekit_blas_root}/usr/include/x86_64-linux-gnu/openblas-pthread" NO_DEFAULT_PATH)
  find_library(MOEKIT_OPENBLAS_LIB NAMES openblas PATHS "${_moekit_blas_libdir}/openblas-pthread" NO_DEFAULT_PATH)
endif()
if(NOT MOEKIT_CBLAS_INCLUDE OR NOT MOEKIT_OPENBLAS_LIB)
  message(FATAL_ERROR "OpenBLAS not found: apt-get install libopenblas-dev (or run scripts/vendor_deps.sh)")
endif()
add_library(moekit_blas INTERFACE)
target_include_directories(moekit_blas INTERFACE "${MOEKIT_CBLAS_INCLUDE}")
target_link_libraries(moekit_blas INTERFACE "${MOEKIT_OPENBLAS_LIB}")
string(FIND "${MOEKIT_OPENBLAS_LIB}" "${_moekit_blas_root}/" _moekit_blas_vendored)
set(MOEKIT_BLAS_VENDORED OFF)
if(_moekit_blas_vendored EQUAL 0)
  # What an installed Python module must carry with it (python/CMakeLists.txt).
  set(MOEKIT_BLAS_VENDORED ON)
  set(MOEKIT_BLAS_VENDORED_LIBS "${_moekit_blas_libdir}/openblas-pthread/libopenblas.so.0"
      "${_moekit_blas_libdir}/libgfortran.so.5" "${_moekit_blas_libdir}/libquadmath.so.0")
  # libopenblas needs libgfortran/libquadmath from the same folder tree. A
  # DT_RPATH (not RUNPATH) on every binary lets the loader find them too, as
  # dependencies of a dependency; no LD_LIBRARY_PATH needed.
  target_link_options(moekit_blas INTERFACE "LINKER:--disable-new-dtags"
                      "LINKER:-rpath,${_moekit_blas_libdir}/openblas-pthread"
                      "LINKER:-rpath,${_moekit_blas_libdir}")
endif()
add_library(moekit::blas ALIAS moekit_blas)
message(STATUS "moekit: OpenBLAS ${MOEKIT_OPENBLAS_LIB}")

# Header-only: CLI11 and nlohmann-json.
if(NOT MOEKIT_USE_VENDORED_DEPS)
  find_package(CLI11 CONFIG QUIET)
  find_package(nlohmann_json CONFIG QUIET)
endif()
if(NOT TARGET CLI11::CLI11)
  add_library(moekit_cli11 INTERFACE)
  target_include_directories(moekit_cli11 INTERFACE "${MOEKIT_DEPS_DIR}/include")
  add_library(CLI11::CLI11 ALIAS moekit_cli11)
endif()
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
  if(NOT MOEKIT_USE_VENDORED_DEPS)
    find_package(GTest CONFIG QUIET)
  endif()
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
