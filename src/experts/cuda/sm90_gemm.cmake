# The grouped GEMM paths behind grouped_gemm.h (grouped_gemm_sm90.h): the
# weight-streaming kernels and the fp8 mma.sync GEMM always, the CUTLASS
# kernels (bf16, the fp8 blockwise one of moe_pipeline_fp8, the int4
# mixed-input one of moe_pipeline_weight4) when the CUTLASS headers were found
# (cmake/deps.cmake) and MOEKIT_CUTLASS_KERNELS is on.
if(MOEKIT_WITH_CUDA)
  target_sources(moekit_experts PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_sm90.cu
    ${CMAKE_CURRENT_LIST_DIR}/streaming_gemm.cu
    ${CMAKE_CURRENT_LIST_DIR}/fp8_streaming_gemm.cu
    ${CMAKE_CURRENT_LIST_DIR}/fp8_mma_gemm.cu
    ${CMAKE_CURRENT_LIST_DIR}/weight4_streaming_gemm.cu
  )
  # The streaming kernels use mma.sync, ldmatrix and cp.async only: cuda_sm80 runs them
  # too, and the tile table (host code) serves both backends. Of the CUTLASS sources
  # below, the adapter and the CUTLASS 2.x (sm80) tiles are portable too, the sm90 ones
  # sm_90a alone (tests/layering/check_portable_cuda.py checks the split).
  moekit_portable_cuda_sources(${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_sm90.cu ${CMAKE_CURRENT_LIST_DIR}/streaming_gemm.cu
                               ${CMAKE_CURRENT_LIST_DIR}/fp8_streaming_gemm.cu
                               ${CMAKE_CURRENT_LIST_DIR}/fp8_mma_gemm.cu
                               ${CMAKE_CURRENT_LIST_DIR}/weight4_streaming_gemm.cu)
  option(MOEKIT_CUTLASS_KERNELS "Build the CUTLASS grouped GEMM kernels (slow to compile)" ON)
  set(MOEKIT_CUTLASS_SOURCES  # one instantiation per file, so they compile in parallel
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass.cu
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm80_m128n256.cu
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm80_m128n128.cu
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm90_m128n256.cu
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm90_m64n256.cu
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm90_swap_n32.cu
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm90_swap_n64.cu
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm90_w4_int4_n128.cu
    ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm90_w4_int4_n256.cu
    ${CMAKE_CURRENT_LIST_DIR}/fp8_gemm_cutlass_sm90.cu
    ${CMAKE_CURRENT_LIST_DIR}/fp8_gemm_cutlass_sm90_m128n128.cu
    ${CMAKE_CURRENT_LIST_DIR}/fp8_gemm_cutlass_sm90_m64n128.cu
  )
  if(MOEKIT_CUTLASS_INCLUDE AND MOEKIT_CUTLASS_KERNELS AND MOEKIT_CUTLASS_SOURCES)
    target_sources(moekit_experts PRIVATE ${MOEKIT_CUTLASS_SOURCES})
    moekit_portable_cuda_sources(${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass.cu
                                 ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm80_m128n256.cu
                                 ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_cutlass_sm80_m128n128.cu)
    target_include_directories(moekit_experts SYSTEM PRIVATE ${MOEKIT_CUTLASS_INCLUDE})
    set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/grouped_gemm_sm90.cu
                                ${CMAKE_CURRENT_LIST_DIR}/moe_pipeline_fp8.cpp
                                ${CMAKE_CURRENT_LIST_DIR}/moe_pipeline_weight4.cpp ${MOEKIT_CUTLASS_SOURCES}
                                PROPERTIES COMPILE_DEFINITIONS MOEKIT_HAVE_CUTLASS=1)
  endif()
endif()
