/* The interface between a compiled host program and kiln-cpp's host runtime.
 *
 * A host program is C++ that includes only this header: the runtime (built once per
 * installation, linked to libtorch) hands it a table of functions at load time. Tensors
 * are opaque references; every function that makes one returns NULL on failure, with the
 * error kept by the runtime, and the host program returns nonzero. */
#pragma once
#include <stdint.h>

typedef struct KilnTensor KilnTensor; /* one reference to a tensor */
typedef struct KilnExtern KilnExtern; /* an ATen op call prepared when the program loads */

typedef struct KilnApi {
  int version;
  /* a new tensor with this layout; dtype is a c10::ScalarType, device a c10::DeviceType */
  KilnTensor* (*empty_strided)(int ndim, const int64_t* size, const int64_t* stride,
                               int dtype, int device_type, int device_index);
  /* a view of base's storage, offset elements past base's own storage offset */
  KilnTensor* (*view)(KilnTensor* base, int ndim, const int64_t* size,
                      const int64_t* stride, int64_t offset);
  /* a tensor of dtype with this layout in arena's storage (a block of bytes), starting
   * byte_offset bytes into it */
  KilnTensor* (*arena_view)(KilnTensor* arena, int64_t byte_offset, int ndim,
                            const int64_t* size, const int64_t* stride, int dtype);
  KilnTensor* (*alias)(KilnTensor* t); /* another reference to the same tensor */
  void (*release)(KilnTensor* t);
  void* (*data_ptr)(KilnTensor* t);
  int64_t (*size)(KilnTensor* t, int dim);
  int64_t (*stride)(KilnTensor* t, int dim);
  /* calls op with its tensor slots filled from tensors and its size slots from sizes;
   * its results are stored in outputs (an undefined tensor where it returns none); 0 on
   * success */
  int (*call_extern)(KilnExtern* op, KilnTensor* const* tensors, const int64_t* sizes,
                     KilnTensor** outputs);
  /* *t itself when its layout is size/stride (ignoring dims of size 1), else a copy in
   * that layout; NULL when the sizes differ */
  KilnTensor* (*match_layout)(KilnTensor* t, int ndim, const int64_t* size,
                              const int64_t* stride, const char* what);
  /* records that kernel found an indirect index out of range (an IndexError) */
  void (*index_error)(const char* kernel);
  /* the current CUDA stream of the current device (NULL, with the error kept, on failure) */
  void* (*cuda_stream)(void);
  /* cuLaunchKernel of a loaded kernel (a CUfunction) with block (block_x, 1, 1) on stream;
   * 0 on success */
  int (*cuda_launch)(void* stream, void* function, uint32_t grid_x, uint32_t grid_y,
                     uint32_t grid_z, uint32_t block_x, uint32_t shared_bytes, void** params);
  /* D = A @ B (+ bias) on stream, a product prepared when the program loads (a cuBLASLt
   * call: see cuda_gemm.h); 0 on success */
  int (*cuda_gemm)(KilnExtern* gemm, void* stream, const void* a, const void* b,
                   const void* bias, void* d);
} KilnApi;

#define KILN_API_VERSION 4
/* what kiln_host_call returns when this call's inputs need the Python host program
 * (a tensor not aligned as the kernels were compiled for) */
#define KILN_RUN_PYTHON 2
