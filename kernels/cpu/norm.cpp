#include "kernels/cpu/norm.hpp"

#include <cmath>

namespace tessel::kernels::cpu {

void layernorm_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd,
                   int rows, int cols, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<long>(r) * cols;
    float* yr = y + static_cast<long>(r) * cols;
    // Two passes in double: the reference favours accuracy over speed.
    double s = 0;
    for (int c = 0; c < cols; ++c) s += xr[c];
    const double mu = s / cols;
    double v = 0;
    for (int c = 0; c < cols; ++c) v += (xr[c] - mu) * (xr[c] - mu);
    const double rs = 1.0 / std::sqrt(v / cols + eps);
    for (int c = 0; c < cols; ++c) yr[c] = static_cast<float>((xr[c] - mu) * rs) * gamma[c] + beta[c];
    if (mean) mean[r] = static_cast<float>(mu);
    if (rstd) rstd[r] = static_cast<float>(rs);
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), with g = dy * gamma and xhat = (x - mean) * rstd:
// the derivative of the normalisation, where mean(g) and mean(g*xhat) come from the mean and variance.
void layernorm_bwd(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                   float* dx, float* dgamma, float* dbeta, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    const float* dyr = dy + static_cast<long>(r) * cols;
    const float* xr = x + static_cast<long>(r) * cols;
    const double mu = mean[r], rs = rstd[r];
    double sg = 0, sgx = 0;
    for (int c = 0; c < cols; ++c) {
      const double xh = (xr[c] - mu) * rs;
      const double g = static_cast<double>(dyr[c]) * gamma[c];
      sg += g;
      sgx += g * xh;
      if (dgamma) dgamma[c] += static_cast<float>(dyr[c] * xh);
      if (dbeta) dbeta[c] += dyr[c];
    }
    if (!dx) continue;
    float* dxr = dx + static_cast<long>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      const double xh = (xr[c] - mu) * rs;
      const double g = static_cast<double>(dyr[c]) * gamma[c];
      dxr[c] = static_cast<float>(rs * (g - sg / cols - xh * sgx / cols));
    }
  }
}

void rmsnorm_fwd(const float* x, const float* gamma, float* y, float* rstd, int rows, int cols, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<long>(r) * cols;
    float* yr = y + static_cast<long>(r) * cols;
    double ss = 0;
    for (int c = 0; c < cols; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const double rs = 1.0 / std::sqrt(ss / cols + eps);
    for (int c = 0; c < cols; ++c) yr[c] = static_cast<float>(xr[c] * rs) * gamma[c];
    if (rstd) rstd[r] = static_cast<float>(rs);
  }
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma, xhat = x * rstd.
void rmsnorm_bwd(const float* dy, const float* x, const float* gamma, const float* rstd, float* dx,
                 float* dgamma, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    const float* dyr = dy + static_cast<long>(r) * cols;
    const float* xr = x + static_cast<long>(r) * cols;
    const double rs = rstd[r];
    double sgx = 0;
    for (int c = 0; c < cols; ++c) {
      const double xh = xr[c] * rs;
      sgx += static_cast<double>(dyr[c]) * gamma[c] * xh;
      if (dgamma) dgamma[c] += static_cast<float>(dyr[c] * xh);
    }
    if (!dx) continue;
    float* dxr = dx + static_cast<long>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      const double xh = xr[c] * rs;
      dxr[c] = static_cast<float>(rs * (static_cast<double>(dyr[c]) * gamma[c] - xh * sgx / cols));
    }
  }
}

}  // namespace tessel::kernels::cpu
