// Checking macros for every CUDA/cuBLAS call: on failure they RETURN a Status naming file:line, the
// expression and the library's error text (nccl-tests' CUDACHECK/TESTCHECK, returning instead of exiting).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda::detail {

inline Status make_status(int code, const char* lib, const char* text, const char* expr, const char* file, int line) {
  return {code, std::string(file) + ":" + std::to_string(line) + ": " + expr + ": " + lib + " error " +
                    std::to_string(code) + " (" + text + ")"};
}
inline Status cuda_status(cudaError_t e, const char* expr, const char* file, int line) {
  return make_status(static_cast<int>(e), "CUDA", cudaGetErrorString(e), expr, file, line);
}
inline Status cublas_status(cublasStatus_t e, const char* expr, const char* file, int line) {
  return make_status(static_cast<int>(e), "cuBLAS", cublasGetStatusString(e), expr, file, line);
}

}  // namespace tessel::kernels::cuda::detail

#define TESSEL_CUDA_CHECK(expr)                                                             \
  do {                                                                                      \
    const cudaError_t tessel_e_ = (expr);                                                   \
    if (tessel_e_ != cudaSuccess)                                                           \
      return ::tessel::kernels::cuda::detail::cuda_status(tessel_e_, #expr, __FILE__, __LINE__); \
  } while (0)

#define TESSEL_CUBLAS_CHECK(expr)                                                             \
  do {                                                                                        \
    const cublasStatus_t tessel_e_ = (expr);                                                  \
    if (tessel_e_ != CUBLAS_STATUS_SUCCESS)                                                   \
      return ::tessel::kernels::cuda::detail::cublas_status(tessel_e_, #expr, __FILE__, __LINE__); \
  } while (0)

// Propagates a Status from a callee.
#define TESSEL_STATUS_CHECK(expr)                         \
  do {                                                    \
    ::tessel::kernels::cuda::Status tessel_s_ = (expr);   \
    if (!tessel_s_.ok()) return tessel_s_;                \
  } while (0)

// After a launch: a bad configuration shows up only in cudaGetLastError.
#define TESSEL_LAUNCH_CHECK() TESSEL_CUDA_CHECK(cudaGetLastError())
