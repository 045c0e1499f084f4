// cuBLASLt GEMMs with the row-major contract of kernels/cpu/gemm.hpp, against gemm_reference (double
// accumulation): every transpose combination, padded leading dimensions, beta != 0, and the bias and
// bias+GELU epilogues against reference GEMM + bias + kernels/cpu gelu_fwd.
#include <doctest/doctest.h>

#include "kernels/cpu/activation.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/kernels.hpp"
#include "tests/cuda/gpu_util.hpp"

namespace kc = tessel::kernels::cpu;
namespace kg = tessel::kernels::cuda;
using namespace tessel::test;

namespace {

struct Case {
  bool ta, tb;
  int M, N, K;
};

double tolerance(kg::GemmType t) {
  return t == kg::GemmType::bf16 || t == kg::GemmType::bf16_fp32 ? kTolBf16
         : t == kg::GemmType::tf32                                 ? kTolTf32
                                                                   : kTolFp32Reduction;
}

// Runs one GEMM of type t on the device from fp32 host data (converted to bf16 on the device for bf16)
// and returns C as fp32.
std::vector<float> run_device(kg::Gemm& g, kg::GemmType t, const Case& c, int lda, int ldb, int ldc,
                              const std::vector<float>& A, const std::vector<float>& B, const std::vector<float>& C0,
                              float alpha, float beta, kg::Epilogue epi, const std::vector<float>& bias) {
  DeviceBuf<float> dA(A), dB(B), dC(C0), dBias(bias.empty() ? std::vector<float>(1) : bias);
  kg::GemmArgs a{c.ta, c.tb, c.M, c.N, c.K, alpha, dA.get(), lda, dB.get(), ldb, beta, dC.get(), ldc, t, epi,
                 bias.empty() ? nullptr : dBias.get()};
  if (t == kg::GemmType::fp32 || t == kg::GemmType::tf32) {
    REQUIRE_OK(g.run(nullptr, a));
    return dC.download();
  }
  const bool out16 = t == kg::GemmType::bf16;  // bf16_fp32: only A and B are bf16
  DeviceBuf<__nv_bfloat16> hA(A.size()), hB(B.size()), hC(C0.size()), hBias(std::max<std::size_t>(bias.size(), 1));
  REQUIRE_OK(kg::to_bf16(nullptr, dA, hA, A.size()));
  REQUIRE_OK(kg::to_bf16(nullptr, dB, hB, B.size()));
  a.A = hA.get();
  a.B = hB.get();
  if (!out16) {
    REQUIRE_OK(g.run(nullptr, a));
    return dC.download();
  }
  REQUIRE_OK(kg::to_bf16(nullptr, dC, hC, C0.size()));
  if (!bias.empty()) REQUIRE_OK(kg::to_bf16(nullptr, dBias, hBias, bias.size()));
  a.C = hC.get();
  a.bias = bias.empty() ? nullptr : hBias.get();
  REQUIRE_OK(g.run(nullptr, a));
  REQUIRE_OK(kg::from_bf16(nullptr, hC, dC, C0.size()));
  return dC.download();
}

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("cuBLASLt GEMM matches the reference for every transpose, type and padded stride") {
  kg::Gemm g;
  REQUIRE_OK(g.init());
  for (const kg::GemmType t : {kg::GemmType::fp32, kg::GemmType::tf32, kg::GemmType::bf16, kg::GemmType::bf16_fp32})
    for (const Case c : {Case{false, false, 96, 200, 72}, Case{true, false, 64, 48, 130}, Case{false, true, 33, 256, 64},
                         Case{true, true, 128, 80, 40}}) {
      CAPTURE(static_cast<int>(t));
      CAPTURE(c.ta);
      CAPTURE(c.tb);
      // Stored shapes: A is [M,K] or [K,M]; B is [K,N] or [N,K]; rows padded by 8 columns (bf16 needs
      // 16-byte aligned strides: multiples of 8 elements).
      const int a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K, b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
      const int lda = a_cols + 8, ldb = b_cols + 8, ldc = c.N + 8;
      const auto A = random_vec(std::size_t(a_rows) * lda), B = random_vec(std::size_t(b_rows) * ldb),
                 C0 = random_vec(std::size_t(c.M) * ldc);
      const float alpha = 0.75f, beta = 0.5f;
      std::vector<float> ref = C0;
      kc::gemm_reference(c.ta, c.tb, c.M, c.N, c.K, alpha, A.data(), lda, B.data(), ldb, beta, ref.data(), ldc);
      const auto out = run_device(g, t, c, lda, ldb, ldc, A, B, C0, alpha, beta, kg::Epilogue::none, {});
      CHECK_CLOSE(out, ref, tolerance(t));
    }
}

TEST_CASE("bias and bias+GELU epilogues match GEMM + bias + the CPU GELU") {
  kg::Gemm g;
  REQUIRE_OK(g.init());
  const Case c{false, false, 64, 192, 96};
  const auto A = random_vec(std::size_t(c.M) * c.K), B = random_vec(std::size_t(c.K) * c.N),
             bias = random_vec(c.N), C0 = random_vec(std::size_t(c.M) * c.N);
  std::vector<float> lin(C0.size(), 0.0f);
  kc::gemm_reference(false, false, c.M, c.N, c.K, 1.0f, A.data(), c.K, B.data(), c.N, 0.0f, lin.data(), c.N);
  for (int r = 0; r < c.M; ++r)
    for (int j = 0; j < c.N; ++j) lin[std::size_t(r) * c.N + j] += bias[j];
  std::vector<float> act(lin.size());
  kc::gelu_fwd(lin.data(), act.data(), lin.size());
  for (const kg::GemmType t : {kg::GemmType::tf32, kg::GemmType::bf16, kg::GemmType::bf16_fp32}) {
    CAPTURE(static_cast<int>(t));
    CHECK_CLOSE(run_device(g, t, c, c.K, c.N, c.N, A, B, C0, 1.0f, 0.0f, kg::Epilogue::bias, bias), lin, tolerance(t));
    CHECK_CLOSE(run_device(g, t, c, c.K, c.N, c.N, A, B, C0, 1.0f, 0.0f, kg::Epilogue::bias_gelu, bias), act,
                tolerance(t));
  }
}

}  // TEST_SUITE
