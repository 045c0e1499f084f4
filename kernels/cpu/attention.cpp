#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "util/error.hpp"

namespace tessel::kernels::cpu {
namespace {

void check(const AttentionShape& s) {
  TESSEL_CHECK(s.batch > 0 && s.seq > 0 && s.hq > 0 && s.hkv > 0 && s.d > 0 && s.hq % s.hkv == 0,
               "attention shape b" << s.batch << " s" << s.seq << " hq" << s.hq << " hkv" << s.hkv << " d" << s.d);
}

inline long row(int b, int i, int seq) { return static_cast<long>(b) * seq + i; }

}  // namespace

void attention_probs(const AttentionShape& s, const float* q, int ldq, const float* k, int ldk, float* probs) {
  check(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  const int group = s.hq / s.hkv;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.hq; ++h) {
      const int hk = h / group;
      float* P = probs + (static_cast<long>(b) * s.hq + h) * s.seq * s.seq;
      for (int i = 0; i < s.seq; ++i) {
        const float* qi = q + row(b, i, s.seq) * ldq + h * s.d;
        float* p = P + static_cast<long>(i) * s.seq;
        float mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* kj = k + row(b, j, s.seq) * ldk + hk * s.d;
          float dot = 0;
          for (int c = 0; c < s.d; ++c) dot += qi[c] * kj[c];
          p[j] = dot * scale;
          mx = std::max(mx, p[j]);
        }
        // Subtracting the row maximum keeps exp() in range without changing the softmax.
        double sum = 0;
        for (int j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - mx);
          sum += p[j];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int j = 0; j <= i; ++j) p[j] *= inv;
        std::fill(p + i + 1, p + s.seq, 0.0f);
      }
    }
}

void attention_fwd(const AttentionShape& s, const float* q, int ldq, const float* k, int ldk, const float* v,
                   int ldv, float* out, int ldo, float* probs) {
  attention_probs(s, q, ldq, k, ldk, probs);
  const int group = s.hq / s.hkv;
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.hq; ++h) {
      const int hk = h / group;
      const float* P = probs + (static_cast<long>(b) * s.hq + h) * s.seq * s.seq;
      for (int i = 0; i < s.seq; ++i) {
        float* o = out + row(b, i, s.seq) * ldo + h * s.d;
        std::fill(o, o + s.d, 0.0f);
        for (int j = 0; j <= i; ++j) {
          const float pj = P[static_cast<long>(i) * s.seq + j];
          const float* vj = v + row(b, j, s.seq) * ldv + hk * s.d;
          for (int c = 0; c < s.d; ++c) o[c] += pj * vj[c];
        }
      }
    }
}

void attention_bwd(const AttentionShape& s, const float* q, int ldq, const float* k, int ldk, const float* v,
                   int ldv, const float* probs, const float* dout, int lddo, float* dq, int lddq, float* dk,
                   int lddk, float* dv, int lddv) {
  check(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d));
  const int group = s.hq / s.hkv;
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < s.seq; ++i) {
      std::fill(dq + row(b, i, s.seq) * lddq, dq + row(b, i, s.seq) * lddq + s.hq * s.d, 0.0f);
      std::fill(dk + row(b, i, s.seq) * lddk, dk + row(b, i, s.seq) * lddk + s.hkv * s.d, 0.0f);
      std::fill(dv + row(b, i, s.seq) * lddv, dv + row(b, i, s.seq) * lddv + s.hkv * s.d, 0.0f);
    }
  std::vector<float> dp(s.seq);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.hq; ++h) {
      const int hk = h / group;
      const float* P = probs + (static_cast<long>(b) * s.hq + h) * s.seq * s.seq;
      for (int i = 0; i < s.seq; ++i) {
        const float* doi = dout + row(b, i, s.seq) * lddo + h * s.d;
        const float* p = P + static_cast<long>(i) * s.seq;
        double dot_pdp = 0;
        for (int j = 0; j <= i; ++j) {
          const float* vj = v + row(b, j, s.seq) * ldv + hk * s.d;
          float* dvj = dv + row(b, j, s.seq) * lddv + hk * s.d;
          float acc = 0;
          for (int c = 0; c < s.d; ++c) {
            acc += doi[c] * vj[c];
            dvj[c] += p[j] * doi[c];
          }
          dp[j] = acc;
          dot_pdp += static_cast<double>(acc) * p[j];
        }
        const float* qi = q + row(b, i, s.seq) * ldq + h * s.d;
        float* dqi = dq + row(b, i, s.seq) * lddq + h * s.d;
        for (int j = 0; j <= i; ++j) {
          const float ds = p[j] * (dp[j] - static_cast<float>(dot_pdp)) * scale;
          const float* kj = k + row(b, j, s.seq) * ldk + hk * s.d;
          float* dkj = dk + row(b, j, s.seq) * lddk + hk * s.d;
          for (int c = 0; c < s.d; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
        }
      }
    }
}

void attention_lse(const AttentionShape& s, const float* q, int ldq, const float* k, int ldk, float* lse) {
  check(s);
  const double scale = 1.0 / std::sqrt(double(s.d));
  const int group = s.hq / s.hkv;
  std::vector<double> sc(s.seq);
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.hq; ++h)
      for (int i = 0; i < s.seq; ++i) {
        const float* qi = q + static_cast<long>(b * s.seq + i) * ldq + h * s.d;
        double m = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* kj = k + static_cast<long>(b * s.seq + j) * ldk + (h / group) * s.d;
          double dot = 0;
          for (int c = 0; c < s.d; ++c) dot += double(qi[c]) * kj[c];
          sc[j] = dot * scale;
          m = std::max(m, sc[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(sc[j] - m);
        lse[(static_cast<long>(b) * s.hq + h) * s.seq + i] = static_cast<float>(m + std::log(sum));
      }
}

}  // namespace tessel::kernels::cpu
