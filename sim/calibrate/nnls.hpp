// Non-negative least squares: min ||A x - b||_2 subject to x >= 0, for the few-parameter fits of calibrate
// (every fitted quantity is a time per unit or an overhead, so a negative value is meaningless).
// Algorithm: Lawson and Hanson, "Solving Least Squares Problems" (1974), chapter 23, the NNLS active-set
// method; each passive-set subproblem is solved by Householder QR (same book, chapter 11) rather than the
// normal equations, because GEMM coefficients span many orders of magnitude.
#pragma once

#include <vector>

namespace tessel::calib {

// Row-major dense matrix: rows x cols.
struct Matrix {
  int rows = 0, cols = 0;
  std::vector<double> a;
  Matrix(int r, int c) : rows(r), cols(c), a(static_cast<std::size_t>(r) * c, 0.0) {}
  double& at(int r, int c) { return a[static_cast<std::size_t>(r) * cols + c]; }
  double at(int r, int c) const { return a[static_cast<std::size_t>(r) * cols + c]; }
};

// Unconstrained least squares over the columns listed in `use` (others fixed at 0); returns a full-length x.
// Columns are scaled to unit norm first (and the scale undone), so coefficients of 1e9 and 1 mix safely.
std::vector<double> least_squares(const Matrix& A, const std::vector<double>& b, const std::vector<int>& use);

// Lawson-Hanson NNLS. InternalError if it does not converge in 3 * cols outer iterations (it always does
// in exact arithmetic; the guard catches a broken input such as NaN).
std::vector<double> nnls(const Matrix& A, const std::vector<double>& b);

}  // namespace tessel::calib
