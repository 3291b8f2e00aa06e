// MTXCOMM_HOST_DEVICE marks a function that both the CPU build and CUDA device code compile
// (lib/base/reduce_ops.h: the reduction operations of the CPU and the CUDA kernels): under
// nvcc (__CUDACC__) it is __host__ __device__, elsewhere nothing. Inside such a function,
// `#if defined(__CUDA_ARCH__)` selects what only the device pass compiles.
#ifndef MTXCOMM_LIB_BASE_HOST_DEVICE_H_
#define MTXCOMM_LIB_BASE_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define MTXCOMM_HOST_DEVICE __host__ __device__
#else
#define MTXCOMM_HOST_DEVICE
#endif

#endif  // MTXCOMM_LIB_BASE_HOST_DEVICE_H_
