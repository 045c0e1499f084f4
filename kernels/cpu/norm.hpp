// Row-wise normalisations over the last dimension of a row-major [rows, cols] fp32 matrix.
//
// LayerNorm (Ba et al. 2016): y = (x - mean) * rstd * gamma + beta, rstd = 1/sqrt(var + eps), var biased.
// RMSNorm (Zhang & Sennrich 2019): y = x * rstd * gamma, rstd = 1/sqrt(mean(x^2) + eps).
// Forward saves mean/rstd per row (rows floats each) for the backward. Backward writes dx and ADDS the
// parameter gradients into dgamma/dbeta (gradient accumulation across micro-batches); pass nullptr for
// dgamma/dbeta to skip them (input-gradient-only pass of a zero-bubble schedule).
#pragma once

namespace tessel::kernels::cpu {

void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                   int rows, int cols, float eps);
void layernorm_bwd(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                   float* dx, float* dgamma, float* dbeta, int rows, int cols);

void rmsnorm_fwd(const float* x, const float* gamma, float* y, float* rstd, int rows, int cols, float eps);
void rmsnorm_bwd(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                 float* dgamma, int rows, int cols);

}  // namespace tessel::kernels::cpu
