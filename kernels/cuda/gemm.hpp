// GEMMs through cuBLASLt, with the row-major contract of kernels/cpu/gemm.hpp:
//   C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C  (+ bias[N] per column, then GELU, when asked).
// Types: fp32 (exact fp32 products), tf32 (fp32 storage, tensor cores with 10-bit mantissas), bf16 (A, B,
// C and bias in bf16, fp32 accumulation), bf16_fp32 (A and B in bf16, C, bias and accumulation in fp32: the
// runtime's mixed precision, fp32 master weights and gradients with bf16 GEMM operands). Tessel adds no work around the library: the point of the GEMM
// sweep in tools/device-check.sh is that these calls run at cuBLAS's own rate.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda {

enum class GemmType { fp32, tf32, bf16, bf16_fp32 };
// bias_gelu: cuBLASLt's GELU epilogue (the tanh approximation, as kernels/cpu/activation.hpp's gelu_fwd).
enum class Epilogue { none, bias, bias_gelu };

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const void* A = nullptr;
  int lda = 0;
  const void* B = nullptr;
  int ldb = 0;
  float beta = 0.0f;
  void* C = nullptr;
  int ldc = 0;
  GemmType type = GemmType::tf32;
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;  // N elements of C's type
};

// One cuBLASLt handle, its workspace and the plans (descriptors and the heuristic's algorithm) of the
// shapes seen so far. Not thread-safe: one per stream-owning thread.
class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Creates the handle and a workspace of `workspace_bytes` on the current device (32 MiB: NVIDIA's
  // recommendation for Hopper in the cuBLAS documentation's cublasLtMatmul notes).
  Status init(std::size_t workspace_bytes = std::size_t(32) << 20);
  Status run(cudaStream_t s, const GemmArgs& a);

 private:
  struct Plan;
  using Key = std::tuple<bool, bool, int, int, int, int, int, int, int, int, bool>;
  Status plan(const GemmArgs& a, Plan*& out);

  void* handle_ = nullptr;      // cublasLtHandle_t
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace tessel::kernels::cuda
