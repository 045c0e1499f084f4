// cuBLASLt is column-major; Tessel's matrices are row-major. A row-major [R, C] matrix with row stride ld
// is the column-major [C, R] matrix with the same ld, so the row-major product C = op(A) op(B) is the
// column-major product C^T = op(B)^T op(A)^T: cuBLASLt computes D[m = N, n = M] from (B, A) with the same
// transpose flags. A per-column bias of row-major C is then a per-row bias of D, which is exactly what
// the CUBLASLT_EPILOGUE_BIAS family adds (a vector of length m).
#include "kernels/cuda/gemm.hpp"

#include <cublasLt.h>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/nvtx.hpp"

namespace tessel::kernels::cuda {

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

namespace {

cudaDataType_t input_type(GemmType t) { return t == GemmType::bf16 || t == GemmType::bf16_fp32 ? CUDA_R_16BF : CUDA_R_32F; }
cudaDataType_t output_type(GemmType t) { return t == GemmType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }
cublasComputeType_t compute_type(GemmType t) {
  return t == GemmType::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}
cublasLtEpilogue_t epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::bias_gelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
  }
}

}  // namespace

Gemm::Gemm() = default;

Gemm::~Gemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Status Gemm::init(std::size_t workspace_bytes) {
  cublasLtHandle_t h = nullptr;
  TESSEL_CUBLAS_CHECK(cublasLtCreate(&h));
  handle_ = h;
  TESSEL_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes));
  workspace_bytes_ = workspace_bytes;
  return {};
}

Status Gemm::plan(const GemmArgs& a, Plan*& out) {
  const Key key{a.trans_a, a.trans_b, a.M, a.N, a.K, a.lda, a.ldb, a.ldc, static_cast<int>(a.type),
                static_cast<int>(a.epilogue), a.beta != 0.0f};
  if (auto it = plans_.find(key); it != plans_.end()) {
    out = it->second.get();
    return {};
  }
  auto p = std::make_unique<Plan>();
  const cudaDataType_t dt = input_type(a.type), ct = output_type(a.type);
  TESSEL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, compute_type(a.type), CUDA_R_32F));
  // Column-major roles: X = B (op flag trans_b), Y = A (op flag trans_a); D[N, M].
  const cublasOperation_t tx = a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, ty = a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  TESSEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &tx, sizeof(tx)));
  TESSEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &ty, sizeof(ty)));
  const cublasLtEpilogue_t epi = epilogue(a.epilogue);
  TESSEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  // Stored shapes before op, column-major: X is [N, K] (or [K, N] when transposed), Y is [K, M] (or [M, K]).
  TESSEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, dt, a.trans_b ? a.K : a.N, a.trans_b ? a.N : a.K, a.ldb));
  TESSEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, dt, a.trans_a ? a.M : a.K, a.trans_a ? a.K : a.M, a.lda));
  TESSEL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, ct, a.N, a.M, a.ldc));

  cublasLtMatmulPreference_t pref = nullptr;
  TESSEL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t ws = workspace_bytes_;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a, p->b, p->c, p->c, pref, 1,
                                        &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  TESSEL_CUBLAS_CHECK(st);
  if (found == 0)
    return {1, "gemm: cuBLASLt has no algorithm for M " + std::to_string(a.M) + " N " + std::to_string(a.N) + " K " +
                   std::to_string(a.K)};
  p->algo = result.algo;
  out = p.get();
  plans_.emplace(key, std::move(p));
  return {};
}

Status Gemm::run(cudaStream_t s, const GemmArgs& a) {
  TESSEL_NVTX_FN();
  if (!handle_) return {1, "gemm: Gemm::init() was not called"};
  if (a.M == 0 || a.N == 0) return {};
  if ((a.epilogue != Epilogue::none) != (a.bias != nullptr))
    return {1, "gemm: a bias epilogue needs a bias pointer, and a bias pointer needs a bias epilogue"};
  Plan* p = nullptr;
  TESSEL_STATUS_CHECK(plan(a, p));
  if (a.bias)
    TESSEL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &a.bias, sizeof(a.bias)));
  TESSEL_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p->op, &a.alpha, a.B, p->a, a.A, p->b,
                                     &a.beta, a.C, p->c, a.C, p->c, &p->algo, workspace_, workspace_bytes_, s));
  return {};
}

}  // namespace tessel::kernels::cuda
