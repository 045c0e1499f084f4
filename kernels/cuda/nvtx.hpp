// RAII NVTX range (llm.c's NvtxRange): every launcher and runtime entry point names itself, so an Nsight
// timeline lines up with Tessel's traces. NVTX v3 is header-only; with no tool attached a range costs a
// branch.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace tessel::kernels::cuda {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace tessel::kernels::cuda

#define TESSEL_NVTX_FN() ::tessel::kernels::cuda::NvtxRange tessel_nvtx_range_(__func__)
