# Decides MOEKIT_WITH_CUDA. Architectures are passed as explicit -gencode flags
# (arch-specific targets like sm_90a need the compute_90a PTX form).
set(MOEKIT_WITH_CUDA OFF)
if(NOT MOEKIT_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  # Keep CMake's compiler probe from picking an architecture the toolkit has dropped.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(MOEKIT_WITH_CUDA ON)
  elseif(MOEKIT_CUDA STREQUAL "ON")
    message(FATAL_ERROR "MOEKIT_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

if(MOEKIT_WITH_CUDA)
  # CMake 3.25 knows nvcc's flags only up to C++17; nvcc 12+ takes -std=c++20.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(MOEKIT_CUDA_GENCODE "")
  foreach(arch IN LISTS MOEKIT_CUDA_ARCHS)
    list(APPEND MOEKIT_CUDA_GENCODE "-gencode=arch=compute_${arch},code=sm_${arch}")
  endforeach()
  string(JOIN " " MOEKIT_CUDA_GENCODE_STR ${MOEKIT_CUDA_GENCODE})
  set(CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS} ${MOEKIT_CUDA_GENCODE_STR} --expt-relaxed-constexpr -lineinfo")
  # The portable backend (cuda_sm80): the sources whose kernels use only what every
  # GPU since sm_80 has (mma.sync, ldmatrix, cp.async) are compiled once more per
  # MOEKIT_CUDA_PORTABLE_ARCHS (SASS) and once as MOEKIT_CUDA_PORTABLE_PTX (PTX that
  # the driver compiles for newer GPUs on first use). The sm_90a-only sources
  # (CUTLASS/wgmma) keep MOEKIT_CUDA_ARCHS alone.
  set(MOEKIT_CUDA_PORTABLE_GENCODE "")
  foreach(arch IN LISTS MOEKIT_CUDA_PORTABLE_ARCHS)
    list(APPEND MOEKIT_CUDA_PORTABLE_GENCODE "-gencode=arch=compute_${arch},code=sm_${arch}")
  endforeach()
  if(MOEKIT_CUDA_PORTABLE_PTX)
    list(APPEND MOEKIT_CUDA_PORTABLE_GENCODE
         "-gencode=arch=compute_${MOEKIT_CUDA_PORTABLE_PTX},code=compute_${MOEKIT_CUDA_PORTABLE_PTX}")
  endif()
  if("90a" IN_LIST MOEKIT_CUDA_ARCHS)
    set(MOEKIT_CUDA_SM90A_BUILT ON)
  else()
    set(MOEKIT_CUDA_SM90A_BUILT OFF)
  endif()
  if(MOEKIT_CUDA_PORTABLE_GENCODE)
    set(MOEKIT_CUDA_PORTABLE_BUILT ON)
  else()
    set(MOEKIT_CUDA_PORTABLE_BUILT OFF)
  endif()
  message(STATUS "moekit: CUDA backend ON (${CMAKE_CUDA_COMPILER_VERSION}), archs ${MOEKIT_CUDA_ARCHS}; "
                 "portable kernels: ${MOEKIT_CUDA_PORTABLE_ARCHS} + PTX ${MOEKIT_CUDA_PORTABLE_PTX}")
else()
  message(STATUS "moekit: CUDA backend OFF (no nvcc); CPU backend only")
endif()

# Marks CUDA sources (of the calling directory) as portable: their kernels are
# also built for the portable architectures above.
function(moekit_portable_cuda_sources)
  if(MOEKIT_WITH_CUDA AND MOEKIT_CUDA_PORTABLE_GENCODE)
    set_property(SOURCE ${ARGN} APPEND PROPERTY COMPILE_OPTIONS ${MOEKIT_CUDA_PORTABLE_GENCODE})
  endif()
endfunction()
