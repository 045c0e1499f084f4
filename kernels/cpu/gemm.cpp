#include "kernels/cpu/gemm.hpp"

#include <algorithm>
#include <vector>

#include "kernels/cpu/blas_config.hpp"
#include "util/error.hpp"

#if TESSEL_HAVE_BLAS
#include <cblas.h>
#endif
#if TESSEL_HAVE_OPENBLAS
extern "C" void openblas_set_num_threads(int);
#endif

namespace tessel::kernels::cpu {
namespace {

void check_shape(int M, int N, int K, int lda, int ldb, int ldc, bool ta, bool tb) {
  TESSEL_CHECK(M >= 0 && N >= 0 && K >= 0, "gemm sizes " << M << "x" << N << "x" << K);
  TESSEL_CHECK(lda >= std::max(1, ta ? M : K), "gemm lda " << lda);
  TESSEL_CHECK(ldb >= std::max(1, tb ? K : N), "gemm ldb " << ldb);
  TESSEL_CHECK(ldc >= std::max(1, N), "gemm ldc " << ldc);
}

void scale_c(int M, int N, float beta, float* C, int ldc) {
  for (int i = 0; i < M; ++i) {
    float* c = C + static_cast<long>(i) * ldc;
    if (beta == 0.0f) std::fill(c, c + N, 0.0f);  // beta 0 must clear NaN garbage, as BLAS does
    else if (beta != 1.0f) for (int j = 0; j < N; ++j) c[j] *= beta;
  }
}

}  // namespace

void gemm_blocked(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                  int ldb, float beta, float* C, int ldc) {
  check_shape(M, N, K, lda, ldb, ldc, ta, tb);
  scale_c(M, N, beta, C, ldc);
  if (M == 0 || N == 0 || K == 0 || alpha == 0.0f) return;
  // Pack op(B) into a contiguous [K,N] panel once, so the inner loop is a unit-stride axpy that the
  // compiler vectorises; blocks of kKb rows of op(B) stay in L1/L2 while all rows of A sweep them.
  constexpr int kKb = 128, kNb = 512;
  std::vector<float> bp(static_cast<std::size_t>(std::min(K, kKb)) * std::min(N, kNb));
  for (int n0 = 0; n0 < N; n0 += kNb) {
    const int nb = std::min(kNb, N - n0);
    for (int k0 = 0; k0 < K; k0 += kKb) {
      const int kb = std::min(kKb, K - k0);
      for (int k = 0; k < kb; ++k)
        for (int j = 0; j < nb; ++j)
          bp[static_cast<std::size_t>(k) * nb + j] =
              tb ? B[static_cast<long>(n0 + j) * ldb + k0 + k] : B[static_cast<long>(k0 + k) * ldb + n0 + j];
      for (int i = 0; i < M; ++i) {
        float* c = C + static_cast<long>(i) * ldc + n0;
        for (int k = 0; k < kb; ++k) {
          const float a = alpha * (ta ? A[static_cast<long>(k0 + k) * lda + i] : A[static_cast<long>(i) * lda + k0 + k]);
          const float* b = bp.data() + static_cast<std::size_t>(k) * nb;
          for (int j = 0; j < nb; ++j) c[j] += a * b[j];
        }
      }
    }
  }
}

void gemm_reference(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                    int ldb, float beta, float* C, int ldc) {
  check_shape(M, N, K, lda, ldb, ldc, ta, tb);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double acc = 0;
      for (int k = 0; k < K; ++k) {
        const double a = ta ? A[static_cast<long>(k) * lda + i] : A[static_cast<long>(i) * lda + k];
        const double b = tb ? B[static_cast<long>(j) * ldb + k] : B[static_cast<long>(k) * ldb + j];
        acc += a * b;
      }
      float& c = C[static_cast<long>(i) * ldc + j];
      c = static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * c));
    }
}

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc) {
#if TESSEL_HAVE_BLAS
  check_shape(M, N, K, lda, ldb, ldc, ta, tb);
  if (M == 0 || N == 0) return;
  if (K == 0) { scale_c(M, N, beta, C, ldc); return; }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
              lda, B, ldb, beta, C, ldc);
#else
  gemm_blocked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#endif
}

std::string gemm_backend() {
#if TESSEL_HAVE_OPENBLAS
  return "openblas";
#elif TESSEL_HAVE_BLAS
  return "blas";
#else
  return "blocked";
#endif
}

void gemm_set_single_thread() {
#if TESSEL_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#endif
}

}  // namespace tessel::kernels::cpu
