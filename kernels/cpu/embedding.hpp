// Token embedding lookup over a (possibly vocab-sharded) row-major table [vocab_local, dim].
//
// Vocab-parallel (Megatron-LM): the shard holds token ids [vocab_start, vocab_start + vocab_local); rows of
// tokens outside it are written as zeros, so an all-reduce over the tensor group completes the lookup.
#pragma once

#include <cstdint>

namespace tessel::kernels::cpu {

void embedding_fwd(const float* table, int vocab_local, int vocab_start, int dim, const std::int32_t* tokens,
                   int n, float* out);

// dtable[token - vocab_start] += dout[row] for the tokens this shard owns (accumulates).
void embedding_bwd(const float* dout, int vocab_local, int vocab_start, int dim, const std::int32_t* tokens, int n,
                   float* dtable);

}  // namespace tessel::kernels::cpu
