# Decides MOEKIT_WITH_NCCL (CUDA builds only): the NCCL communicator of expert
# parallelism (docs/expert_parallel.md). Found, in this order, under
# MOEKIT_NCCL_ROOT, the system (e.g. /usr/local, the CUDA toolkit) and the PyPI
# package nvidia-nccl-cu13 (pinned in python/requirements.txt) in
# MOEKIT_NCCL_VENV's site-packages (nvidia/nccl/{include,lib}).
set(MOEKIT_NCCL "AUTO" CACHE STRING "Build the NCCL communicator: AUTO (when CUDA and NCCL are found), ON, OFF")
set(MOEKIT_NCCL_ROOT "" CACHE PATH "Folder with include/nccl.h and lib/libnccl.so (optional)")
set(MOEKIT_NCCL_VENV "${CMAKE_CURRENT_SOURCE_DIR}/.venv" CACHE PATH
    "Python environment whose nvidia-nccl-cu13 package may provide NCCL")
set(MOEKIT_WITH_NCCL OFF)
if(SKBUILD AND MOEKIT_NCCL STREQUAL "AUTO")
  # TODO(ep): the wheel would need libnccl on its rpath (or a dlopen); until
  # then the Python module is built without the NCCL communicator.
  set(MOEKIT_NCCL "OFF")
endif()
if(MOEKIT_WITH_CUDA AND NOT MOEKIT_NCCL STREQUAL "OFF")
  file(GLOB _moekit_nccl_pip LIST_DIRECTORIES true "${MOEKIT_NCCL_VENV}/lib/python3*/site-packages/nvidia/nccl")
  set(_moekit_nccl_hints ${MOEKIT_NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} /usr/local /usr ${_moekit_nccl_pip})
  find_path(MOEKIT_NCCL_INCLUDE_DIR nccl.h HINTS ${_moekit_nccl_hints} PATH_SUFFIXES include)
  # The PyPI package ships only libnccl.so.2 (no unversioned link).
  find_library(MOEKIT_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_moekit_nccl_hints} PATH_SUFFIXES lib lib64)
  if(MOEKIT_NCCL_INCLUDE_DIR AND MOEKIT_NCCL_LIBRARY)
    file(STRINGS "${MOEKIT_NCCL_INCLUDE_DIR}/nccl.h" _moekit_nccl_ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
    string(REGEX REPLACE "#define NCCL_[A-Z]+ ([0-9]+);?" "\\1." _moekit_nccl_ver "${_moekit_nccl_ver}")
    set(MOEKIT_WITH_NCCL ON)
    add_library(moekit::nccl UNKNOWN IMPORTED)
    set_target_properties(moekit::nccl PROPERTIES IMPORTED_LOCATION "${MOEKIT_NCCL_LIBRARY}"
                                                  INTERFACE_INCLUDE_DIRECTORIES "${MOEKIT_NCCL_INCLUDE_DIR}")
    message(STATUS "moekit: NCCL communicator ON (${MOEKIT_NCCL_LIBRARY}, NCCL ${_moekit_nccl_ver})")
  elseif(MOEKIT_NCCL STREQUAL "ON")
    message(FATAL_ERROR "MOEKIT_NCCL=ON but nccl.h/libnccl were not found (set MOEKIT_NCCL_ROOT)")
  endif()
endif()
if(NOT MOEKIT_WITH_NCCL)
  message(STATUS "moekit: NCCL communicator OFF (needs CUDA and NCCL); expert parallelism runs on loopback ranks")
endif()
