#include "kernels/cuda/device_info.hpp"

#include <mutex>
#include <vector>

#include "kernels/cuda/check.cuh"

namespace tessel::kernels::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error so later calls start clean
    return 0;
  }
  return n;
}

Status device_info(DeviceInfo& out) {
  static std::mutex mu;
  static std::vector<DeviceInfo> cache;
  int dev = 0;
  TESSEL_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lk(mu);
  for (const DeviceInfo& d : cache)
    if (d.device == dev) {
      out = d;
      return {};
    }
  cudaDeviceProp p{};
  TESSEL_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  DeviceInfo d;
  d.device = dev;
  d.name = p.name;
  d.sm_count = p.multiProcessorCount;
  d.max_threads_per_sm = p.maxThreadsPerMultiProcessor;
  d.major = p.major;
  d.minor = p.minor;
  d.max_smem_per_block_optin = static_cast<int>(p.sharedMemPerBlockOptin);
  d.l2_bytes = p.l2CacheSize;
  d.mem_bytes = static_cast<double>(p.totalGlobalMem);
  cache.push_back(d);
  out = d;
  return {};
}

}  // namespace tessel::kernels::cuda
