#include <doctest/doctest.h>

#include <cmath>

#include "kernels/cpu/gemm.hpp"
#include "tests/kernels/fd.hpp"

using namespace tessel::kernels::cpu;
using tessel::test::random_vec;

namespace {
// fp32 GEMM with K <= 300 terms of O(1) products: the accumulated rounding is below K * 2^-24 * |terms|
// ~ 2e-5 * K; relative to a double-precision oracle we allow 1e-4 * sqrt(K)-ish slack as a flat 2e-4*K^0.5.
double tol_for(int K) { return 2e-4 * std::sqrt(static_cast<double>(K)) + 1e-5; }

void check_against_reference(bool ta, bool tb, int M, int N, int K, float alpha, float beta, bool blocked) {
  const int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;  // padded strides
  auto A = random_vec(static_cast<std::size_t>(ta ? K : M) * lda, 1);
  auto B = random_vec(static_cast<std::size_t>(tb ? N : K) * ldb, 2);
  auto C0 = random_vec(static_cast<std::size_t>(M) * ldc, 3);
  auto C = C0, R = C0;
  if (blocked) gemm_blocked(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  else gemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  gemm_reference(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, R.data(), ldc);
  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) worst = std::max(worst, std::abs(double(C[i * ldc + j]) - R[i * ldc + j]));
  // Padding columns must be untouched.
  for (int i = 0; i < M; ++i) CHECK(C[i * ldc + N] == C0[i * ldc + N]);
  CHECK(worst <= tol_for(K));
}
}  // namespace

TEST_CASE("gemm: the reference gives the closed form of a 2x2 product") {
  // [1 2; 3 4] * [5 6; 7 8] = [19 22; 43 50]; with alpha 2, beta 1 on C = 1: 2*x + 1.
  float A[] = {1, 2, 3, 4}, B[] = {5, 6, 7, 8}, C[] = {1, 1, 1, 1};
  gemm_reference(false, false, 2, 2, 2, 2.0f, A, 2, B, 2, 1.0f, C, 2);
  CHECK(C[0] == 39);
  CHECK(C[1] == 45);
  CHECK(C[2] == 87);
  CHECK(C[3] == 101);
}

TEST_CASE("gemm and gemm_blocked match the double-precision reference for every transpose and odd sizes") {
  for (bool blocked : {false, true})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(blocked); CAPTURE(ta); CAPTURE(tb);
        check_against_reference(ta, tb, 7, 5, 3, 1.0f, 0.0f, blocked);
        check_against_reference(ta, tb, 33, 130, 257, 0.5f, 1.0f, blocked);  // crosses the 128-row k block
        check_against_reference(ta, tb, 1, 600, 17, 1.0f, 0.25f, blocked);   // crosses the 512-column n block
      }
  MESSAGE("gemm backend: " << gemm_backend());
}

TEST_CASE("gemm with beta 0 clears NaN in C") {
  float A[] = {1}, B[] = {2}, C[] = {NAN};
  gemm_blocked(false, false, 1, 1, 1, 1.0f, A, 1, B, 1, 0.0f, C, 1);
  CHECK(C[0] == 2.0f);
  C[0] = NAN;
  gemm(false, false, 1, 1, 1, 1.0f, A, 1, B, 1, 0.0f, C, 1);
  CHECK(C[0] == 2.0f);
}
