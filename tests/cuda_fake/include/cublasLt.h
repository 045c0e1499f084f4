// Fake (tests/cuda_fake): kernels/cuda/check.cuh names cuBLAS status values; nothing here calls cuBLAS.
#pragma once
using cublasStatus_t = int;
constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
inline const char* cublasGetStatusString(cublasStatus_t) { return "fake cuBLAS status"; }
