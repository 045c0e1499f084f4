// What a kernel may assume about the GPU, read from the device (never hard-coded: ThunderKittens' 132-SM
// constant is the counter-example in style-anchors.md).
#pragma once

#include <string>

#include "kernels/cuda/status.hpp"

namespace tessel::kernels::cuda {

struct DeviceInfo {
  int device = 0;
  std::string name;
  int sm_count = 0;                 // multiprocessors
  int max_threads_per_sm = 0;       // resident threads per multiprocessor
  int major = 0, minor = 0;         // compute capability
  int max_smem_per_block_optin = 0; // bytes a block may get after cudaFuncSetAttribute
  int l2_bytes = 0;
  double mem_bytes = 0;
};

// Number of usable CUDA devices; 0 when there is no driver or no device (never an error: the GPU tests
// and `tessel run --backend cuda` turn 0 into a skip or a clear message).
int device_count();

// Properties of the current device, cached per device after the first call.
Status device_info(DeviceInfo& out);

}  // namespace tessel::kernels::cuda
