// Pieces shared by the CPU communicators so both reduce in the same order and give the same bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "runtime/comm/comm.hpp"

namespace tessel::rt {

// Elements [first, second) of chunk `k` when `count` elements are split over `parts` near-equal chunks
// (the first count % parts chunks hold one more).
inline std::pair<std::size_t, std::size_t> chunk_bounds(std::size_t count, int parts, int k) {
  std::size_t p = static_cast<std::size_t>(parts), i = static_cast<std::size_t>(k);
  std::size_t base = count / p, extra = count % p;
  std::size_t lo = i * base + std::min(i, extra);
  return {lo, lo + base + (i < extra ? 1 : 0)};
}

// out[i] = ((srcs[0][i] op srcs[1][i]) op srcs[2][i]) ...: a fixed left-to-right order over ranks, so the
// result does not depend on timing or on how the work was chunked.
inline void reduce_rank_order(const std::vector<const float*>& srcs, std::size_t n, ReduceOp op, float* out) {
  std::copy(srcs[0], srcs[0] + n, out);
  for (std::size_t k = 1; k < srcs.size(); ++k) {
    const float* s = srcs[k];
    if (op == ReduceOp::sum)
      for (std::size_t i = 0; i < n; ++i) out[i] += s[i];
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = std::max(out[i], s[i]);
  }
}

}  // namespace tessel::rt
