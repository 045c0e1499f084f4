#include "sim/calibrate/nnls.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/error.hpp"

namespace tessel::calib {

std::vector<double> least_squares(const Matrix& A, const std::vector<double>& b, const std::vector<int>& use) {
  const int m = A.rows, n = static_cast<int>(use.size());
  std::vector<double> x(A.cols, 0.0);
  if (n == 0) return x;
  // Copy the used columns, scaled to unit norm.
  Matrix R(m, n);
  std::vector<double> scale(n, 1.0), y = b;
  for (int j = 0; j < n; ++j) {
    double s = 0;
    for (int i = 0; i < m; ++i) s += A.at(i, use[j]) * A.at(i, use[j]);
    scale[j] = s > 0 ? std::sqrt(s) : 1.0;
    for (int i = 0; i < m; ++i) R.at(i, j) = A.at(i, use[j]) / scale[j];
  }
  // Householder QR: reflect column j below the diagonal to zero, applying each reflection to y as well.
  const int steps = std::min(m, n);
  for (int j = 0; j < steps; ++j) {
    double norm = 0;
    for (int i = j; i < m; ++i) norm += R.at(i, j) * R.at(i, j);
    norm = std::sqrt(norm);
    if (norm == 0) continue;
    const double alpha = R.at(j, j) > 0 ? -norm : norm;
    std::vector<double> v(m - j);
    for (int i = j; i < m; ++i) v[i - j] = R.at(i, j);
    v[0] -= alpha;
    double vv = 0;
    for (double e : v) vv += e * e;
    if (vv == 0) continue;
    for (int c = j; c < n; ++c) {
      double d = 0;
      for (int i = j; i < m; ++i) d += v[i - j] * R.at(i, c);
      const double f = 2 * d / vv;
      for (int i = j; i < m; ++i) R.at(i, c) -= f * v[i - j];
    }
    double d = 0;
    for (int i = j; i < m; ++i) d += v[i - j] * y[i];
    const double f = 2 * d / vv;
    for (int i = j; i < m; ++i) y[i] -= f * v[i - j];
  }
  // Back substitution on the upper triangle; a (numerically) zero pivot leaves that coefficient at 0.
  std::vector<double> z(n, 0.0);
  for (int j = steps - 1; j >= 0; --j) {
    double s = y[j];
    for (int c = j + 1; c < n; ++c) s -= R.at(j, c) * z[c];
    z[j] = std::abs(R.at(j, j)) > 1e-13 ? s / R.at(j, j) : 0.0;
  }
  for (int j = 0; j < n; ++j) x[use[j]] = z[j] / scale[j];
  return x;
}

std::vector<double> nnls(const Matrix& A, const std::vector<double>& b) {
  const int n = A.cols;
  std::vector<double> x(n, 0.0);
  std::vector<bool> passive(n, false);
  auto gradient = [&](const std::vector<double>& xv) {
    std::vector<double> r = b, w(n, 0.0);
    for (int i = 0; i < A.rows; ++i)
      for (int j = 0; j < n; ++j) r[i] -= A.at(i, j) * xv[j];
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < A.rows; ++i) w[j] += A.at(i, j) * r[i];
    return w;
  };
  auto col_norm = [&](int j) {
    double s = 0;
    for (int i = 0; i < A.rows; ++i) s += A.at(i, j) * A.at(i, j);
    return std::sqrt(s);
  };
  for (int outer = 0; outer < 3 * n + 3; ++outer) {
    const std::vector<double> w = gradient(x);
    // Most violated KKT condition, judged on the column-normalised gradient so units do not matter.
    int best = -1;
    double best_w = 1e-12 * std::sqrt(std::inner_product(b.begin(), b.end(), b.begin(), 0.0));
    for (int j = 0; j < n; ++j) {
      const double cn = col_norm(j);
      if (passive[j] || cn == 0) continue;
      if (w[j] / cn > best_w) {
        best_w = w[j] / cn;
        best = j;
      }
    }
    if (best < 0) return x;
    passive[best] = true;
    for (int inner = 0; inner < 3 * n + 3; ++inner) {
      std::vector<int> use;
      for (int j = 0; j < n; ++j)
        if (passive[j]) use.push_back(j);
      const std::vector<double> s = least_squares(A, b, use);
      // The column just added must enter with a positive value; if rounding says otherwise the KKT
      // conditions hold to working precision and x is the answer (Lawson-Hanson's termination in practice).
      if (inner == 0 && s[best] <= 0) {
        passive[best] = false;
        return x;
      }
      bool feasible = true;
      for (int j : use) feasible = feasible && s[j] > 0;
      if (feasible) {
        x = s;
        break;
      }
      // Step from x toward s until the first passive coefficient reaches 0; drop those that did.
      double step = 1.0;
      for (int j : use)
        if (s[j] <= 0) step = std::min(step, x[j] / (x[j] - s[j]));
      for (int j = 0; j < n; ++j) x[j] += step * (s[j] - x[j]);
      for (int j : use)
        if (x[j] <= 0) {
          x[j] = 0;
          passive[j] = false;
        }
    }
  }
  TESSEL_CHECK(false, "NNLS did not converge (non-finite input?)");
  return x;
}

}  // namespace tessel::calib
