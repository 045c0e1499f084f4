// Causal multi-head attention (Vaswani et al. 2017, eq. 1) with grouped-query heads (Ainslie et al. 2023):
// out = softmax(Q K^T / sqrt(d) + causal mask) V, per sequence and per query head.
//
// Layout: tokens are rows, sequence-major: row t = b * seq + i. Query head h reads columns [h*d, (h+1)*d)
// of q (row stride ldq); it uses key/value head h / (hq / hkv) of k and v (strides ldk, ldv). out has
// stride ldo and the query heads' layout. probs is [batch, hq, seq, seq] (row i of a head holds the
// softmax over keys j <= i, zeros above the diagonal): the reference materialises it, and the backward
// reads it. Selective recomputation drops probs after the forward and calls attention_probs() again.
#pragma once

namespace tessel::kernels::cpu {

struct AttentionShape {
  int batch = 1;
  int seq = 1;
  int hq = 1;    // query heads
  int hkv = 1;   // key/value heads; hq % hkv == 0
  int d = 1;     // head dimension
};

// probs = softmax(Q K^T / sqrt(d)) with the causal mask.
void attention_probs(const AttentionShape& s, const float* q, int ldq, const float* k, int ldk, float* probs);

// lse[b, h, i] = ln sum_{j <= i} exp(q_i . k_j / sqrt(d)) (rows ordered batch, query head, position), in
// double: the statistic the flash kernels save for their backward instead of the probabilities.
void attention_lse(const AttentionShape& s, const float* q, int ldq, const float* k, int ldk, float* lse);

// probs as above, then out = probs V.
void attention_fwd(const AttentionShape& s, const float* q, int ldq, const float* k, int ldk, const float* v,
                   int ldv, float* out, int ldo, float* probs);

// dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)) (softmax Jacobian); dQ = dS K / sqrt(d);
// dK = dS^T Q / sqrt(d). dq, dk, dv are overwritten (dk, dv sum the query heads of their group).
void attention_bwd(const AttentionShape& s, const float* q, int ldq, const float* k, int ldk, const float* v,
                   int ldv, const float* probs, const float* dout, int lddo, float* dq, int lddq, float* dk,
                   int lddk, float* dv, int lddv);

}  // namespace tessel::kernels::cpu
