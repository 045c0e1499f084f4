// Token permutation for a mixture-of-experts layer's dispatch and combine, over rows of `width` floats:
// each token's chosen-expert slots are gathered in dispatch order (sorted by expert), sent to the experts'
// owners, and their outputs come back and are summed per token with the router's weights.
#pragma once

#include <cstdint>

namespace tessel::kernels::cpu {

// dst[i, :] = scale[i] * src[index[i], :] for i < n (scale null: a plain gather).
void gather_rows(const float* src, const std::int32_t* index, const float* scale, int n, int width, float* dst);

// dst[t, :] = sum over j < k of w[t k + j] * src[t k + j, :] for t < tokens, summed in j order (w null: a
// plain sum); accumulate adds it to dst instead.
void combine_rows(const float* src, const float* w, int tokens, int k, int width, float* dst, bool accumulate);

// out[i] = dot(a[i / k, :], b[i, :]) for i < n: each slot's output against its token's gradient (the
// router weights' gradient).
void row_dots(const float* a, const float* b, int n, int k, int width, float* out);

}  // namespace tessel::kernels::cpu
