// GEMM, the one matrix product every CPU kernel and the runtime use.
//
// Row-major fp32: C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C. op(X) = X, or X^T when trans_x;
// lda/ldb/ldc are the row strides of the matrices as stored (A is [M,K] or, transposed, [K,M]).
// gemm() calls the BLAS found at configure time (OpenBLAS sgemm, limited to one thread per calling rank,
// see gemm_set_single_thread) and falls back to gemm_blocked() when none was found.
#pragma once

#include <string>

namespace tessel::kernels::cpu {

void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// Our own cache-blocked kernel (no BLAS). Same contract as gemm(); also the fallback.
void gemm_blocked(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                  const float* B, int ldb, float beta, float* C, int ldc);

// Naive triple loop in double precision: the oracle the tests compare the two above with.
void gemm_reference(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                    const float* B, int ldb, float beta, float* C, int ldc);

// "openblas", "blas" or "blocked": what gemm() runs.
std::string gemm_backend();

// Every rank is one thread (or process) already; a multi-threaded BLAS would oversubscribe the cores and
// make timings meaningless. Called once by the runtime before it starts ranks.
void gemm_set_single_thread();

}  // namespace tessel::kernels::cpu
