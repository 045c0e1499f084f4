// The flash-style attention against kernels/cpu/attention (which materialises the probabilities): out
// from the forward, dq/dk/dv from the backward, over head dims of every tile width (1..4 columns per
// lane), grouped-query heads and sequence lengths that are not multiples of the 16/32-row tiles.
#include <doctest/doctest.h>

#include "kernels/cpu/attention.hpp"
#include "kernels/cuda/kernels.hpp"
#include "tests/cuda/gpu_util.hpp"

namespace kc = tessel::kernels::cpu;
namespace kg = tessel::kernels::cuda;
using namespace tessel::test;

TEST_SUITE("gpu") {

TEST_CASE("flash attention forward and backward match the materialised CPU reference") {
  const kc::AttentionShape shapes[] = {{2, 77, 4, 2, 16}, {1, 130, 2, 2, 64}, {2, 45, 6, 3, 96}, {1, 200, 4, 1, 128}};
  for (const kc::AttentionShape& a : shapes) {
    CAPTURE(a.seq);
    CAPTURE(a.d);
    CAPTURE(a.hkv);
    const int T = a.batch * a.seq, qd = a.hq * a.d, kd = a.hkv * a.d;
    const auto q = random_vec(std::size_t(T) * qd, -2, 2), k = random_vec(std::size_t(T) * kd, -2, 2),
               v = random_vec(std::size_t(T) * kd), dout = random_vec(std::size_t(T) * qd);
    std::vector<float> out(q.size()), probs(std::size_t(a.batch) * a.hq * a.seq * a.seq), dq(q.size()), dk(k.size()),
        dv(v.size());
    kc::attention_fwd(a, q.data(), qd, k.data(), kd, v.data(), kd, out.data(), qd, probs.data());
    kc::attention_bwd(a, q.data(), qd, k.data(), kd, v.data(), kd, probs.data(), dout.data(), qd, dq.data(), qd,
                      dk.data(), kd, dv.data(), kd);
    const std::size_t rows = std::size_t(a.batch) * a.hq * a.seq;
    DeviceBuf<float> dQ(q), dK(k), dV(v), dDO(dout), dOUT(out.size()), dLSE(rows), dDELTA(rows), dDQ(dq.size()),
        dDK(dk.size()), dDV(dv.size());
    REQUIRE_OK(kg::attention_fwd(nullptr, a, dQ, qd, dK, kd, dV, kd, dOUT, qd, dLSE));
    REQUIRE_OK(kg::attention_bwd(nullptr, a, dQ, qd, dK, kd, dV, kd, dOUT, qd, dLSE, dDO, qd, dDQ, qd, dDK, kd, dDV, kd,
                                 dDELTA));
    CHECK_CLOSE(dOUT.download(), out, kTolFp32Reduction);
    CHECK_CLOSE(dDQ.download(), dq, kTolFp32Reduction);
    CHECK_CLOSE(dDK.download(), dk, kTolFp32Reduction);
    CHECK_CLOSE(dDV.download(), dv, kTolFp32Reduction);
  }
}

TEST_CASE("attention rejects shapes it does not support, naming them") {
  DeviceBuf<float> buf(1024);
  const kc::AttentionShape too_wide{1, 4, 1, 1, 160};  // head_dim > 128
  const auto s = kg::attention_fwd(nullptr, too_wide, buf, 160, buf, 160, buf, 160, buf, 160, buf);
  CHECK_FALSE(s.ok());
  CHECK(s.message.find("d 160") != std::string::npos);
}

}  // TEST_SUITE
