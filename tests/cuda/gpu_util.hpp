// Helpers of the GPU tests: device buffers, fresh random inputs (the seed is printed, so a failure can be
// replayed with TESSEL_TEST_SEED), relative error ||out - ref|| / ||ref|| and the tolerances per dtype.
#pragma once

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/status.hpp"

namespace tessel::test {

// Tolerances on ||out - ref|| / ||ref|| (METHOD.md's bands): fp32 kernels differ from the double-
// accumulating CPU references by summation order only; tf32 keeps 10 mantissa bits (2^-11 ~ 5e-4 per
// product, partly averaging out); bf16 keeps 7 (2^-8 ~ 4e-3 per rounding of inputs and output).
constexpr double kTolFp32 = 1e-5;
constexpr double kTolFp32Reduction = 1e-4;  // long sums and exp/log chains (attention, cross-entropy)
constexpr double kTolTf32 = 3e-3;
constexpr double kTolBf16 = 1.5e-2;

// The experimental wgmma attention (experimental-tc3) runs on compute capability 9.0 only.
inline bool compute_capability_90() {
  kernels::cuda::DeviceInfo info;
  return kernels::cuda::device_info(info).ok() && info.major == 9 && info.minor == 0;
}

#define REQUIRE_OK(expr)                                    \
  do {                                                      \
    const ::tessel::kernels::cuda::Status s_ = (expr);      \
    INFO(s_.message);                                       \
    REQUIRE(s_.ok());                                       \
  } while (0)

inline std::uint64_t test_seed() {
  static const std::uint64_t seed = [] {
    if (const char* s = std::getenv("TESSEL_TEST_SEED")) return static_cast<std::uint64_t>(std::strtoull(s, nullptr, 10));
    return static_cast<std::uint64_t>(std::random_device{}());
  }();
  return seed;
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 g(test_seed());
  return g;
}

inline std::vector<float> random_vec(std::size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng());
  return v;
}

inline std::vector<std::int32_t> random_tokens(std::size_t n, int vocab) {
  std::uniform_int_distribution<int> d(0, vocab - 1);
  std::vector<std::int32_t> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

// A device buffer of T (RAII). Poisoned with NaN bytes (0xFF) at creation when asked, so an element the
// kernel never writes fails the comparison.
template <typename T>
class DeviceBuf {
 public:
  explicit DeviceBuf(std::size_t n, bool poison = true) : n_(n) {
    REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<std::size_t>(n, 1) * sizeof(T)) == cudaSuccess);
    if (poison) REQUIRE(cudaMemset(p_, 0xFF, n * sizeof(T)) == cudaSuccess);
  }
  explicit DeviceBuf(const std::vector<T>& host) : DeviceBuf(host.size(), false) { upload(host); }
  ~DeviceBuf() { cudaFree(p_); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;

  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    REQUIRE(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  T* get() const { return p_; }
  operator T*() const { return p_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// ||out - ref|| / ||ref||; infinity when any output is NaN/inf or the sizes differ (NaN never passes).
inline double rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

#define CHECK_CLOSE(out, ref, tol)                                                    \
  do {                                                                                \
    const double e_ = ::tessel::test::rel_error((out), (ref));                        \
    INFO(#out " vs " #ref ": rel error " << e_ << " tol " << (tol) << " seed "       \
              << ::tessel::test::test_seed());                                        \
    CHECK(e_ <= (tol));                                                               \
  } while (0)

}  // namespace tessel::test
