// Status values that CUDA/cuBLAS/NCCL calls are checked into (nccl-tests' TESTCHECK pattern: record where
// it failed and hand the status up, so a failing call reaches the runtime and the tests instead of exit()).
// Plain C++: no CUDA header, so callers outside kernels/cuda can hold a Status.
#pragma once

#include <stdexcept>
#include <string>

namespace tessel::kernels::cuda {

struct Status {
  int code = 0;            // the library's own error code (cudaError_t, cublasStatus_t, ncclResult_t); 0 = ok
  std::string message;     // "file:line: expression: library error text"
  bool ok() const { return code == 0; }
  explicit operator bool() const { return ok(); }
  static Status success() { return {}; }
};

// A failed device call surfaced as an exception at the runtime's edge (the runtime uses exceptions).
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void throw_if_failed(const Status& s) {
  if (!s.ok()) throw DeviceError(s.message);
}

}  // namespace tessel::kernels::cuda
